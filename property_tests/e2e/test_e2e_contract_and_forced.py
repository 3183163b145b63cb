"""The end-to-end contract (draft lengths, capabilities, reported q) and forced draws inside
generate: each new check with the mutant it catches and the exact generators it passes."""
from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.cli import main  # noqa: E402
from exactcheck.corpus.generators import SlotCacheLoop  # noqa: E402
from exactcheck.generation.drive import DraftStatistics, drive_generator  # noqa: E402
from exactcheck.e2e.forced_draws import FORCED_CHECKS, forced_draw_verdicts  # noqa: E402
from exactcheck.contracts.generator import (SAMPLING, Capabilities, DraftRecord, Generation,  # noqa: E402
                                      draft_length_support)
from exactcheck.e2e.loop import (GreedyWhenSampling, InlineRatioTest, ReferenceSpeculativeLoop,  # noqa: E402
                                 SoftmaxQGreedyDraft, SoftmaxQTopKDraft)
from toy_models.suite import all_model_worlds  # noqa: E402
from exactcheck.e2e.runner import run_generator_audit  # noqa: E402
from exactcheck.report.verdict import Outcome  # noqa: E402
from exactcheck.forcing.randomness import controlled_randomness  # noqa: E402
from toy_models.hf_toy_lm import model_worlds  # noqa: E402

WORLD = model_worlds()[1]  # hf_v4_l3_k2
BASE = dict(world=WORLD.name, seed=0, reproduce="")


def _forced(generator, world=WORLD, seed=7):
    return {v.law: v for v in forced_draw_verdicts(generator, world, (SAMPLING,), seed, dict(BASE, world=world.name),
                                                   "cpu")}


# -- forced draws inside generate ---------------------------------------------------------------

def test_the_inline_ratio_mutant_is_found_end_to_end_with_its_reachability():
    verdicts = _forced(InlineRatioTest())
    found = verdicts["forced_no_forbidden_token"]
    assert found.outcome is Outcome.DEFECT, found.summary
    reach = found.evidence.reachability
    assert reach.kind == "forced" and reach.reachable and 1 <= reach.draws <= 2
    assert "torch.rand" in reach.draw_function and "float32" in reach.dtype
    assert "probability 0 under policy" in found.summary
    assert verdicts["forced_greedy"].outcome is Outcome.DEFECT  # greedy: r = 0 accepts a p = 0 draft too
    assert verdicts["forced_no_crash"].outcome is Outcome.EXACT


class _TinyUniformAccepts(InlineRatioTest):
    """Also accepts every draft whose uniform is below 1e-3 (a "the ratio test cannot matter
    there" shortcut): forbidden drafts pass on a thousandth of the uniforms, not at one point."""

    name: str = "mutant: tiny_uniform_accepts"

    def verify(self, p, q, drafts, generator):
        real = torch.rand

        def rand(*args, **kwargs):
            r = real(*args, **kwargs)
            return torch.where(r < 1e-3, torch.zeros_like(r), r)  # then r > ratio never holds there

        torch.rand = rand
        try:
            return super().verify(p, q, drafts, generator)
        finally:
            torch.rand = real


def test_a_one_draw_trigger_states_the_set_of_values_that_break_it():
    """inline_ratio_test breaks at r = 0 only: its reachability stays the point's (2^-24). A loop
    that breaks for every r below 1e-3 is widened by bisection to that set's measure."""
    point = _forced(InlineRatioTest())["forced_no_forbidden_token"].evidence.reachability
    assert point.kind == "forced"
    found = _forced(_TinyUniformAccepts())["forced_no_forbidden_token"]
    reach = found.evidence.reachability
    assert found.outcome is Outcome.DEFECT and reach.kind == "interval", reach.describe()
    assert 0.9e-3 <= reach.probability <= 1e-3 and reach.low == 0.0
    assert "broken at every value of" in reach.describe()


@pytest.mark.parametrize("generator", [ReferenceSpeculativeLoop(), pytest.param(SlotCacheLoop(), marks=pytest.mark.long)],
                         ids=["reference", "slot_cache"])
def test_exact_loops_keep_every_forced_property_on_every_world(generator):
    for world in all_model_worlds():
        for law, verdict in _forced(generator, world).items():
            assert verdict.outcome is Outcome.EXACT, (world.name, law, verdict.summary)
            assert "draws forced" in verdict.summary


def test_generators_created_inside_generate_are_watched_for_escapes():
    with controlled_randomness("zero", watch_created=True) as log:
        g = torch.Generator().manual_seed(3)
        forced = torch.rand(4, generator=g)  # forced: leaves g where it was
        assert isinstance(g, torch.Generator) and float(forced.max()) == 0.0
    assert log.complete, log.escaped
    with controlled_randomness("zero", watch_created=True) as log:
        g = torch.Generator().manual_seed(3)
        torch.randperm(5, generator=g)  # not an entry point exactcheck forces: g moves
    assert any("a generator the subject created (seed 3) moved" in e for e in log.escaped)


def test_a_forced_multinomial_counts_its_token_mass_in_reachability():
    rows = torch.tensor([[0.25, 0.75]], dtype=torch.float64)
    with controlled_randomness("zero") as log:
        assert int(torch.multinomial(rows, 1)) == 0
    assert log.draws[0].element_probability == pytest.approx(0.25)


# -- the draft length reaches the generator ------------------------------------------------------

def test_a_custom_generator_receives_draft_lengths_1_to_8_in_the_greedy_sweep():
    seen = []
    reference = ReferenceSpeculativeLoop()

    def generator(target, draft, input_ids, policy, max_new_tokens, seed, draft_length=4):
        seen.append(draft_length)
        return ReferenceSpeculativeLoop(draft_length)(target, draft, input_ids, policy, max_new_tokens, seed)

    assert draft_length_support(generator) == "keyword" and draft_length_support(reference) == "field"
    result = run_generator_audit(generator, worlds=[WORLD.name], generations=20, seed=1, progress=False)
    greedy = next(v for v in result.verdicts if v.law == "greedy_identity")
    assert greedy.outcome is Outcome.EXACT, greedy.summary
    assert "draft lengths 1..8 (passed as draft_length=)" in greedy.condition
    swept = [k for k in seen if k != 4] + [4]
    assert set(swept) == set(range(1, 9)) and seen.count(2) == 6  # 6 prompts at each length

    def own_length(target, draft, input_ids, policy, max_new_tokens, seed):
        return reference(target, draft, input_ids, policy, max_new_tokens, seed)

    result = run_generator_audit(own_length, worlds=[WORLD.name], generations=20, seed=1, progress=False)
    greedy = next(v for v in result.verdicts if v.law == "greedy_identity")
    assert "its own draft length (it takes no draft_length keyword or field)" in greedy.condition


# -- capabilities -------------------------------------------------------------------------------

def test_a_generator_that_declares_no_grammar_support_passes_the_e2e_command(tmp_path, monkeypatch, capsys):
    module = tmp_path / "no_grammar_generator.py"
    module.write_text(
        "from exactcheck.contracts.generator import Capabilities\n"
        "from exactcheck.e2e.loop import ReferenceSpeculativeLoop\n"
        "class NoGrammar:\n"
        "    capabilities = Capabilities(grammar_masks=False, stop_tokens=False)\n"
        "    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):\n"
        "        if policy.mask is not None or policy.stop_tokens:\n"
        "            raise NotImplementedError('no grammar support')\n"
        "        return ReferenceSpeculativeLoop()(target, draft, input_ids, policy, max_new_tokens, seed)\n"
        "generator = NoGrammar()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["e2e", "no_grammar_generator:generator", "--level", "quick", "--generations", "200", "--quiet",
                 "--report", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr()
    data = json.loads(next((tmp_path / "out").glob("*.json")).read_text())
    masked = ("json_v13_k3/", "choice_v9/", "think_choice_v9/")  # the worlds under a grammar mask
    grammar = [v for v in data["verdicts"] if v["check"].startswith(masked)]
    assert {v["check"].split("/")[0] for v in grammar} == {w[:-1] for w in masked}
    assert all(v["outcome"] == "inconclusive" for v in grammar)
    assert all("not applicable: the generator declares no grammar masks" in v["summary"] for v in grammar)
    others = [v for v in data["verdicts"] if not v["check"].startswith(masked)]
    assert all(v["outcome"] == "exact" for v in others), [v["check"] for v in others if v["outcome"] != "exact"]


def test_capabilities_take_a_collection_of_names_and_refuse_unknown_ones():
    assert Capabilities.of({"cache", "stop_tokens"}) == Capabilities(False, True, False, False, True, False)
    with pytest.raises(TypeError, match="unknown capabilities"):
        Capabilities.of({"grammar"})


# -- diagnoses that name the cause ---------------------------------------------------------------

@pytest.mark.parametrize("mutant", [SoftmaxQGreedyDraft(), SoftmaxQTopKDraft()], ids=lambda m: m.name.split(": ")[1])
def test_drafter_q_mutants_are_reported_with_their_cause(mutant):
    result = run_generator_audit(mutant, worlds=[WORLD.name], generations=300, seed=5, greedy=False,
                                 progress=False)
    by_law = {v.law: v for v in result.verdicts}
    q = by_law["draft_follows_q"]
    assert q.outcome is Outcome.DEFECT and q.summary.startswith("draft tokens do not follow the reported q")
    failed_laws = [v for v in result.failed if v.law in ("sequence", "first_token")]
    assert failed_laws and all("likely cause: draft tokens do not follow the reported q" in v.summary
                               for v in failed_laws)


def test_the_draft_pit_is_uniform_for_exact_drafts_and_not_for_argmax_ones():
    rng = torch.Generator().manual_seed(0)
    rows = torch.distributions.Dirichlet(torch.ones(5)).sample((2000,)).double()
    exact = DraftStatistics()
    argmax = DraftStatistics()
    tokens = torch.multinomial(rows, 1, generator=rng)[:, 0]
    exact = exact.add([DraftRecord(int(t), r) for t, r in zip(tokens, rows)], 1)
    argmax = argmax.add([DraftRecord(int(r.argmax()), r) for r in rows], 1)
    from scipy import stats
    assert stats.kstest(exact.pits, "uniform").pvalue > 1e-3
    assert stats.kstest(argmax.pits, "uniform").pvalue < 1e-12
    assert argmax.argmax == 2000 and exact.argmax < 1500


def test_a_sampled_request_decoded_greedily_is_named_as_such():
    result = run_generator_audit(GreedyWhenSampling(), worlds=[WORLD.name], generations=200, seed=3, greedy=False,
                                 progress=False)
    sequence = next(v for v in result.verdicts if v.law == "sequence")
    assert sequence.outcome is Outcome.DEFECT
    assert sequence.summary.startswith("decoded greedily: all 200 generations are the greedy path")


# -- a hand-rolled cache, written differently from transformers' --------------------------------

class SlotCacheNotRewound(SlotCacheLoop):
    """The slot loop whose target pointer is never moved back, while the loop feeds the target from
    the committed length as if it had been: rejected drafts stay in the target's cache."""

    name: str = "mutant: slot cache not rewound"

    def target_start(self, cache, sequence):
        return min(cache.length, sequence.numel() - 1)

    def rewind(self, caches, keep):
        caches["draft"].rewind(keep)


def test_cache_invariants_are_exercised_on_a_cache_that_is_not_transformers():
    exact = drive_generator(SlotCacheLoop(), WORLD, 60, seed=4, policy=SAMPLING)
    assert not exact.breaches and exact.keeps_cache and exact.final_caches_checked == 120
    assert exact.drafts is not None and exact.drafts.count > 60
    broken = drive_generator(SlotCacheNotRewound(), WORLD, 60, seed=4, policy=SAMPLING)
    assert {b.invariant for _, b in broken.breaches} & {"committed prefix", "final length", "final contents"}


def test_forced_checks_are_planned_for_every_world():
    result = run_generator_audit(ReferenceSpeculativeLoop(), worlds=[WORLD.name], generations=50, seed=2,
                                 progress=False, greedy=False)
    laws = [v.law for v in result.verdicts]
    assert all(name in laws for name in FORCED_CHECKS) and "draft_follows_q" in laws


def test_a_generator_that_returns_a_generation_with_drafts_keeps_the_contract():
    out = ReferenceSpeculativeLoop(2)(*WORLD.models(), WORLD.prompt_ids(), SAMPLING, 3, 0)
    assert isinstance(out, Generation) and out.drafts and isinstance(out.drafts[0], DraftRecord)


def test_a_wrong_capabilities_declaration_is_a_usage_error():
    from exactcheck.contracts.generator import capabilities_of
    from exactcheck.errors import UsageError

    class Declares:
        capabilities = {"grammar"}

        def __call__(self, *args):
            raise AssertionError("not called")

    with pytest.raises(UsageError, match="unknown capabilities"):
        capabilities_of(Declares())
