"""Trust: no finding on correct code, and every finding says how reachable it is.

Each test here failed on the code before the trust work (issues 12, 19, 20): forced values a
draw cannot return, one uniform convention assumed, a precision-blind tie margin, draws the
forcing never reached, joint-forcing events of probability 2^(-24 V), cache-free generators,
and subjects that cannot be driven.
"""
import json
import math
import random

import numpy as np
import pytest
import torch

from exactcheck import run_audit
from exactcheck.cli import main
from exactcheck.contracts.verifier import from_logits
from exactcheck.corpus.other_rules import FITS, OTHER_RULE_VERIFIERS
from exactcheck.corpus.verifiers import (CORRECT_VERIFIERS, REPRODUCIBILITY_ONLY, float32_ratio_strict,
                                         gumbel_max_residual, jit_residual, mirrored_uniform_product,
                                         numpy_unseeded)
from exactcheck.step.mutants import mutant
from exactcheck.step.properties import check_property, search
from exactcheck.forcing.randomness import (RNGSnapshot, mt19937_state_view, controlled_randomness,
                                         deliverable)
from exactcheck.reachability import FLOOR
from exactcheck.step.strategies import VerifyCase
from exactcheck.report.verdict import Category, Outcome

FAST_WORLDS = ["three_token", "properties", "inputs"]


def test_forced_values_are_values_the_draw_can_return():
    gen = torch.Generator().manual_seed(0)
    with controlled_randomness("one_minus_ulp", generators=[gen]) as log:
        u32 = torch.rand(3, generator=gen)
        u64 = torch.rand(3, dtype=torch.float64, generator=gen)
        e32 = torch.empty(2).exponential_(generator=gen)
    assert float(u32.max()) == 1 - 2 ** -24 and float(u32.max()) < 1.0
    assert float(u64.max()) == 1 - 2 ** -53
    assert bool(torch.isfinite(e32).all())  # -log(1 - u) of a deliverable u is finite
    assert {d.value for d in log.draws} == {1 - 2 ** -24, 1 - 2 ** -53}
    assert deliverable(0.3, torch.float32) * 2 ** 24 == math.floor(0.3 * 2 ** 24)
    assert log.complete  # the forced draws moved no generator


def test_forcing_leaves_generators_alone_and_sees_escaped_draws():
    gen = torch.Generator().manual_seed(1)
    before = gen.get_state()
    with controlled_randomness("zero", generators=[gen]) as log:
        torch.rand(4, generator=gen)
        torch.multinomial(torch.tensor([0.2, 0.8]), 1, generator=gen)
    assert torch.equal(before, gen.get_state()) and log.complete
    with controlled_randomness("zero", generators=[gen]) as log:
        torch.randn(2, generator=gen)  # uncontrolled: counted, and the generator moved
    assert not log.complete and "torch.randn" in log.describe_escapes()
    with controlled_randomness("zero", generators=[gen]) as log:
        jit_residual(*VerifyCase(4, 2, 2, "dirichlet", "independent", "any", 0).tensors(), gen)
    assert any("TorchScript" in e for e in log.escaped)


def test_a_draw_from_numpy_or_python_global_generator_is_seen_every_time():
    """A draw moves numpy's global MT19937 by its position, refilling the key only every 624
    words; comparing the key alone missed most draws, so a subject drawing there was judged as
    if forced (a row_independence "defect" on the exact ``numpy_global``)."""
    np.random.seed(0)
    np.random.random()  # the key is filled: the next draws only move the position
    draws = [lambda: np.random.random(), lambda: np.random.rand(3), lambda: np.random.standard_normal(),
             lambda: np.random.seed(1), lambda: random.random()]
    for draw in draws:
        snapshot = RNGSnapshot()
        draw()
        assert snapshot.moved(), draw
    assert not RNGSnapshot().moved()
    if hasattr(np.random, "get_bit_generator"):  # numpy >= 1.25: read in place, layout confirmed
        assert mt19937_state_view(np.random.get_bit_generator()) is not None
        saved = np.random.get_bit_generator()
        np.random.set_bit_generator(np.random.PCG64(3))  # another bit generator: from its state
        try:
            snapshot = RNGSnapshot()
            np.random.random()
            assert snapshot.moved() == ["numpy's global generator"]
        finally:
            np.random.set_bit_generator(saved)


@pytest.mark.parametrize("name", ["numpy_random_state", "kept_numpy_generator"])
def test_an_output_that_changes_between_identical_forced_calls_is_not_judged(name):
    """No snapshot sees these sources (a RandomState seeded from OS entropy on each call, a
    generator seeded at import and kept); before the repeat guard row_independence blamed
    them, "row 1 gave [1, -1, -1] in a batch of 2 but [0, 0, 1] alone", on every seed tried."""
    result = search(CORRECT_VERIFIERS[name], "row_independence", examples=20, seed=0)
    assert result.failure is None
    assert "changed between identical forced calls" in result.note


CORPUS = {**CORRECT_VERIFIERS, **OTHER_RULE_VERIFIERS}


# one member of each way of writing it in the default run (about 4 s each), every member in the long run
DEFAULT_CORPUS = {"numpy_global", "numpy_unseeded", "kept_numpy_generator", "numpy_random_state", "jit_residual",
                  "exponential_race", "log_space", "float32_ratio_strict", "block_vectorised", "logits_float32_softmax"}


@pytest.mark.parametrize("name", [n if n in DEFAULT_CORPUS else pytest.param(n, marks=pytest.mark.long)
                                  for n in CORPUS if n not in ("compiled_residual", "compiled_step")])
def test_correct_corpus_has_no_exactness_finding(name):
    """Every exact verifier in the corpus (token-wise and the other rules, none declaring its
    rule): no deterministic exactness finding (the properties, the invalid-input probe) and an
    exact three-token law, at the quick level."""
    audit = run_audit(CORPUS[name], level="quick", seed=0, worlds=FAST_WORLDS, progress=False)
    exactness = [v for v in audit.verdicts if v.outcome.failed and v.category is Category.EXACTNESS]
    assert not exactness, [v.describe() for v in exactness]
    assert audit.passed
    others = {v.check for v in audit.verdicts if v.outcome.failed}
    assert others <= ({"properties/same_seed"} if name in REPRODUCIBILITY_ONLY else set()), others


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CORPUS))
def test_correct_corpus_passes_the_whole_quick_audit(name):
    audit = run_audit(CORPUS[name], level="quick", seed=0, progress=False)
    assert audit.passed, [v.describe() for v in audit.failed]


@pytest.mark.parametrize("name", list(OTHER_RULE_VERIFIERS))
def test_an_exact_verifier_of_another_rule_passes_undeclared_and_is_named(name):
    """Block and target-only members declare nothing: judged against every registered exact rule,
    they pass, and the audit names the rule each one follows (where the rules' laws differ)."""
    audit = run_audit(OTHER_RULE_VERIFIERS[name], level="quick", seed=0, worlds=["random_v5_k3", "properties/acceptance"],
                      progress=False)
    assert audit.passed, [v.describe() for v in audit.failed]
    assert f'acceptance_rule = "{FITS[name]}"' in audit.rule_note, audit.rule_note


def test_the_two_first_false_findings_are_gone():
    """float32 uniforms with u < min(1, p/q) under one_minus_ulp, and u = 1 - rand with
    u * q <= p under uniform 0: both judged, neither flagged (issue 12, cases 1 and 2)."""
    case = VerifyCase(3, 2, 1, "dirichlet", "independent", "any", 7)
    for subject, value in ((float32_ratio_strict, "one_minus_ulp"), (mirrored_uniform_product, "zero")):
        assert check_property(subject, "acceptance", case, value) is None
    assert search(mirrored_uniform_product, "acceptance", 40, 0).failure is None


def half_logits_softmax(target_probs, draft_probs, draft_tokens, generator):
    """An engine that receives its rows as half-precision logits and softmaxes them in that dtype:
    p/q moves by ~1e-3 (bf16 more), as in the vLLM V1 report of issue 12."""
    half = target_probs.dtype if target_probs.dtype in (torch.float16, torch.bfloat16) else torch.float32
    p = torch.softmax(torch.log(target_probs.double()).to(half), -1)
    q = torch.softmax(torch.log(draft_probs.double()).to(half), -1)
    return float32_ratio_strict(p, q, draft_tokens, generator)


def test_tie_margin_follows_the_precision_handed_in():
    """fp16 / bf16 rows, to a verifier that rounds them to logits in that dtype and softmaxes
    there: ratios move by ~1e-3, and no acceptance decision is called wrong (issue 12, case 3)."""
    for dtype in ("float16", "bfloat16"):
        for relation in ("equal", "independent", "nearly_equal"):
            case = VerifyCase(8, 3, 3, "dirichlet", relation, "any", 3, dtype)
            for value in ("zero", "one_minus_ulp", "ratio", "ratio_minus", "ratio_plus"):
                assert check_property(half_logits_softmax, "acceptance", case, value) is None
    # and the mutant that computes p/q in float16 on float32 rows is still caught
    assert search(mutant("ratio_in_half_precision"), "acceptance", 50, 0).failure is not None


def test_from_logits_adds_no_error_of_its_own():
    rows = torch.tensor([[0.1, 0.2, 0.7]], dtype=torch.float16)
    seen = {}

    def grab(target_logits, draft_logits, draft_tokens, generator):
        seen["logits"] = target_logits
        return torch.zeros(1, 2, dtype=torch.int64)

    from_logits(grab)(rows[None].expand(1, 2, 3), rows[None], torch.zeros(1, 1, dtype=torch.int64), None)
    assert seen["logits"].dtype == torch.float32  # fp16 logits would move the law by themselves
    assert torch.equal(seen["logits"][0, 0], torch.log(rows[0].double()).to(torch.float32))


def test_escaped_draws_make_a_property_inconclusive_never_a_defect():
    audit = run_audit(jit_residual, level="quick", seed=0, worlds=["properties"], progress=False)
    verdicts = {v.check: v for v in audit.verdicts}
    assert verdicts["properties/row_independence"].outcome is Outcome.INCONCLUSIVE
    assert "TorchScript" in verdicts["properties/row_independence"].summary
    assert audit.passed


def test_gumbel_max_passes_and_exponential_race_nan_is_found_with_one_draw():
    assert search(gumbel_max_residual, "no_forbidden_token", 50, 0).failure is None
    found = search(mutant("exponential_race_nan"), "no_forbidden_token", 50, 0).failure
    assert found is not None
    reach = found.reachability
    assert reach.draws == 1 and len(found.forced) == 1
    assert reach.draw_function == "Tensor.exponential_" and reach.dtype == "float32"
    assert 2 ** -26 <= reach.probability <= 2 ** -24


def all_zero_race(target_probs, draft_probs, draft_tokens, generator):
    """Exact except when all of (at least 8) float32 uniforms are exactly 0 at once: then it
    emits token 0 whatever its probability (a joint-forcing event of probability 2^-192)."""
    out = mirrored_uniform_product(target_probs, draft_probs, draft_tokens, generator)
    u = torch.rand(out.shape[0], max(target_probs.shape[-1], 8), generator=generator)
    stuck = (u == 0).all(1)
    out[stuck, 0] = 0
    out[stuck, 1:] = -1
    return out


@pytest.mark.long
def test_a_joint_forcing_event_is_unreachable_boundary_behaviour():
    result = search(all_zero_race, "no_forbidden_token", 30, 0)
    assert result.failure is None and result.unreachable is not None
    reach = result.unreachable.reachability
    assert reach.draws >= 8 and reach.probability < FLOOR and not reach.reachable
    audit = run_audit(all_zero_race, level="quick", seed=0, worlds=["properties/no_forbidden_token"],
                      progress=False)
    (verdict,) = audit.verdicts
    assert verdict.outcome is Outcome.UNREACHABLE and audit.passed
    assert verdict.reachability.probability < FLOOR


def test_every_deterministic_finding_carries_its_reachability():
    audit = run_audit(mutant("accept_on_equal_uniform"), level="quick", seed=0,
                      worlds=["properties/no_forbidden_token"], progress=False)
    (verdict,) = audit.verdicts
    data = verdict.to_dict()
    assert data["reachability"]["per_draw_probability"] == 2 ** -53
    assert data["reachability"]["draws"] == 1 and data["reachability"]["dtype"] == "float64"
    assert "2^-53" in verdict.describe()
    assert "impossible for an exact subject" not in verdict.describe()


def test_reproducibility_is_its_own_category(capsys):
    args = ["audit", "exactcheck.corpus.verifiers:numpy_unseeded", "--level", "quick", "--quiet",
            "--world", "three_token", "--world", "properties"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "reproducibility finding" in out and "properties/same_seed" in out
    assert "unseeded numpy Generator" in out
    assert main(args + ["--require", "reproducible"]) == 1
    audit = run_audit(numpy_unseeded, level="quick", seed=0, worlds=["properties/same_seed"], progress=False,
                      require=["reproducible"])
    assert not audit.passed and audit.failed[0].category is Category.REPRODUCIBILITY


def wrong_signature(target_probs, draft_probs):
    return target_probs


def always_raises(target_probs, draft_probs, draft_tokens, generator):
    raise RuntimeError("kernel launch failed")


def test_a_subject_with_the_wrong_signature_is_one_line_and_exit_2_before_any_world_is_drawn(capsys):
    # before: 16.7 s of crashes and a 25-line FAILED report, then "could not be driven"
    import time
    start = time.perf_counter()
    code = main(["audit", "test_trust:wrong_signature", "--level", "quick"])
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and seconds < 2
    assert err.splitlines() == [err.strip()] and err.startswith(
        "exactcheck: error: test_trust:wrong_signature cannot be called as a verifier: its signature is "
        "(target_probs, draft_probs)")
    assert "verifier(target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k], generator)" in err
    assert main(["audit", "test_trust:NOT_CALLABLE", "--level", "quick"]) == 2
    assert "is not callable" in capsys.readouterr().err


NOT_CALLABLE = 3


def test_a_subject_that_cannot_be_driven_exits_2_with_its_frames(capsys):
    code = main(["audit", "test_trust:always_raises", "--level", "quick", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "could not be driven" in err
    assert "test_trust.py:" in err and "in always_raises" in err
    audit = run_audit(always_raises, level="quick", seed=0, worlds=["three_token", "inputs"], progress=False)
    inputs = next(v for v in audit.verdicts if v.check == "inputs/invalid")
    assert inputs.outcome is Outcome.INCONCLUSIVE and "valid base case" in inputs.summary


def test_crash_verdict_shows_the_subjects_frames(tmp_path):
    audit = run_audit(always_raises, level="quick", seed=0, worlds=["three_token"], progress=False)
    crash = next(v for v in audit.verdicts if v.outcome is Outcome.CRASHED)
    assert any("in always_raises" in frame for frame in crash.traceback)
    assert "raised at" in crash.describe()
    from exactcheck.report.json_md import audit_to_json
    assert any("always_raises" in f for f in json.loads(json.dumps(audit_to_json(audit)))["verdicts"][0]["traceback"])


def test_cache_free_generator_gets_no_rollback_finding():
    pytest.importorskip("transformers")
    from exactcheck.corpus.generators import CacheFreeLoop
    from exactcheck.e2e.runner import run_generator_audit
    audit = run_generator_audit(CacheFreeLoop(), level="quick", generations=200, worlds=["hf_v4_l3_k2"],
                                greedy=False, progress=False)
    rollback = next(v for v in audit.verdicts if v.law == "cache_rollback")
    assert rollback.outcome is Outcome.INCONCLUSIVE and rollback.summary.startswith("not applicable")
    assert audit.passed


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]", '{"schema": "exactcheck.reproducer/2"}',
                                     '{"schema": "exactcheck.audit/1", "verdicts": 3}'])
@pytest.mark.parametrize("command", ["render", "replay"])
def test_misuse_of_render_and_replay_is_one_line_and_exit_2(tmp_path, capsys, command, content):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_text(content)
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("exactcheck: error:") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("name", ["acceptance", "row_independence"])
def test_a_reseed_and_restore_around_an_unforced_draw_is_not_judged(name):
    """vLLM V0's rejection sampler draws from torch's global generator in TorchScript; an
    adapter that seeds that generator from the handed one and restores it afterwards left
    nothing moved, so the forced-value properties were judged on draws nobody forced
    (row_independence: "row 1 gave [0, -1, -1] in a batch of 2 but [1, -1, -1] alone"). The
    reseed is watched: what moved before a reseed or restore is an escape, and the case is not
    judged, saying the subject derives its random numbers from a seed."""
    result = search(CORRECT_VERIFIERS["reseeded_global_script"], name, examples=20, seed=0)
    assert result.failure is None
    assert "derives its random numbers from a seed" in result.note


def test_a_reseed_with_only_forced_draws_after_it_is_still_judged():
    """transformers' speculative sampling through its adapter reseeds and restores the global
    generator too, but its draws (rand_like, multinomial) are forced: nothing moves between the
    reseed and the restore, so the case is judged (a reseed alone is no escape)."""
    gen = torch.Generator().manual_seed(0)

    def reseeding_reference(p, q, tokens, generator):
        state = torch.random.get_rng_state()
        torch.manual_seed(int(torch.rand((), dtype=torch.float64, generator=generator) * 2.0 ** 53))
        try:
            return mutant("accept_on_equal_uniform")(p, q, tokens, torch.default_generator)
        finally:
            torch.random.set_rng_state(state)

    with controlled_randomness("zero", generators=[gen]) as log:
        reseeding_reference(*VerifyCase(4, 2, 2, "dirichlet", "independent", "any", 0).tensors(), gen)
    assert log.complete, log.escaped
    with controlled_randomness("zero", generators=[gen]) as log:
        CORRECT_VERIFIERS["reseeded_global_script"](*VerifyCase(4, 2, 2, "dirichlet", "independent", "any",
                                                                0).tensors(), gen)
    assert not log.complete and "torch.random.set_rng_state" in log.describe_escapes()
