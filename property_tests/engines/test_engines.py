"""Serving engines: vLLM's rejection sampler and LLM.generate adapters (on pure-torch stand-ins
here: vLLM cannot be installed beside the CPU torch, and its Triton kernels need a GPU), the
batched generator contract, and its agreement with the batch-1 contract."""
import dataclasses
import importlib.util
import math

import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.adapters.vllm import MissingEngine, VllmGenerate, VllmRejectionSampler  # noqa: E402
from exactcheck.step.engines import audit_rejection_sampler  # noqa: E402
from exactcheck.e2e.runner import run_generator_audit  # noqa: E402
from exactcheck.e2e.batched_loop import BatchedReferenceLoop  # noqa: E402
from exactcheck.contracts.generator import DecodingPolicy  # noqa: E402
from exactcheck.e2e.loop import ReferenceSpeculativeLoop  # noqa: E402
from exactcheck.report.verdict import Outcome  # noqa: E402
from standins import vllm_rejection_sampler as vllm_standin  # noqa: E402
from toy_models.hf_toy_lm import model_worlds  # noqa: E402

WORLD = model_worlds()[1]  # hf_v4_l3_k2


@pytest.mark.long
def test_the_vllm_adapter_through_the_full_quick_audit():
    """vLLM V1's semantics (the stand-in) through the adapter's layout: every law is exact; the one
    finding is vLLM's ``p / q >= u`` accepting a draft the target forbids when the float32
    uniform is exactly 0 (2^-24 per uniform), the finding the H200 run made on vLLM's own kernel.
    (The temperature path's full audit runs in the README recipe's test below.)"""
    result = audit_rejection_sampler(vllm_standin, level="quick", device="cpu", progress=False)
    statistical = [v for v in result.verdicts if v.statistic is not None]
    assert len(statistical) > 40 and all(v.outcome is Outcome.EXACT for v in statistical)
    assert [v.check for v in result.failed] == ["properties/no_forbidden_token"]
    reach = result.failed[0].reachability
    assert reach.dtype == "float32" and reach.draw_function == "Tensor.uniform_" and reach.value == 0.0
    assert math.isclose(reach.per_draw_probability, 2.0 ** -24)


def test_the_vllm_greedy_path_emits_the_target_argmax_up_to_the_first_mismatch():
    subject = VllmRejectionSampler(vllm_standin, greedy=True)
    p = torch.tensor([[[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]],
                      [[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]])
    q = torch.full((2, 2, 3), 1 / 3)
    drafts = torch.tensor([[1, 0], [1, 2]])
    out = subject(p, q, drafts, torch.Generator().manual_seed(0))
    assert out.tolist() == [[1, 0, 2], [1, 0, -1]]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_adapter_says_what_is_missing():
    with pytest.raises(MissingEngine, match="vllm.v1.sample.rejection_sampler"):
        VllmRejectionSampler()


@dataclasses.dataclass
class FakeSamplingParams:
    """The fields of vLLM's SamplingParams that VllmGenerate sets."""

    max_tokens: int
    seed: int
    temperature: float
    ignore_eos: bool = False
    stop_token_ids: list | None = None
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0


class FakeLLM:
    """An object with vLLM's ``LLM.generate`` shape (prompts as ``{"prompt_token_ids": ...}``, one
    SamplingParams per request, RequestOutput-like answers) that runs exactcheck's batched
    reference loop on a toy world's models: it tests VllmGenerate's mapping, not vLLM."""

    def __init__(self, world):
        self.target, self.draft = world.models()
        self.requests = 0

    def generate(self, prompts, params, use_tqdm=False):
        first = params[0]
        policy = DecodingPolicy(first.temperature, top_k=first.top_k if first.top_k > 0 else None,
                                top_p=first.top_p if first.top_p < 1 else None, min_p=first.min_p or None,
                                stop_tokens=tuple(first.stop_token_ids or ()))
        ids = [torch.tensor(p["prompt_token_ids"]) for p in prompts]
        self.requests += len(ids)
        outputs = BatchedReferenceLoop().generate_batch(self.target, self.draft, ids, policy, first.max_tokens,
                                                        [p.seed for p in params])
        return [type("RequestOutput", (), {"outputs": [type("CompletionOutput", (), {"token_ids": o.tolist()})]})
                for o in outputs]


def _law_verdicts(result):
    # the batch-1 reference loop also reports its drafts' q (draft_follows_q); the batched one does not
    return [(v.check, v.outcome, v.pvalue, v.samples) for v in result.verdicts
            if v.law not in ("cache_rollback", "draft_follows_q")]


def test_the_batched_contract_gives_the_batch_1_verdicts_for_the_same_seeds():
    settings = dict(level="quick", worlds=[WORLD.name], generations=300, progress=False)
    one = run_generator_audit(ReferenceSpeculativeLoop(), **settings)
    many = run_generator_audit(BatchedReferenceLoop(), **settings)
    assert one.passed and many.passed
    assert _law_verdicts(one) == _law_verdicts(many)
    rollback = {v.check: v for v in many.verdicts}[f"{WORLD.name}/cache_rollback"]
    assert rollback.outcome is Outcome.INCONCLUSIVE and "keeps no cache" in rollback.summary
    fake = FakeLLM(WORLD)
    through_vllm_shape = run_generator_audit(VllmGenerate(fake, sampling_params=FakeSamplingParams), **settings)
    # vLLM's draft length is the engine's setting, so its greedy sweep runs at that one length
    not_greedy = lambda rows: [row for row in rows if not row[0].endswith("/greedy_identity")]  # noqa: E731
    assert not_greedy(_law_verdicts(through_vllm_shape)) == not_greedy(_law_verdicts(many))
    greedy = {v.law: v for v in through_vllm_shape.verdicts}["greedy_identity"]
    assert greedy.outcome is Outcome.EXACT and fake.requests >= 300


def test_the_batched_loop_on_real_transformers_models_is_greedy_identical():
    """Right-padded batches through a real Llama (no cache, attention mask): the same greedy
    identity verdict as the batch-1 loop with its cache."""
    from exactcheck.e2e.real_models import run_greedy_audit
    settings = dict(prompts=4, new_tokens=8, draft_lengths=(1, 3), progress=False)
    one = run_greedy_audit(ReferenceSpeculativeLoop(), "tiny-llama", **settings)
    many = run_greedy_audit(BatchedReferenceLoop(), "tiny-llama", **settings)
    assert one.verdicts[0].outcome is many.verdicts[0].outcome is Outcome.EXACT
    assert one.verdicts[0].samples == many.verdicts[0].samples == 8


def test_a_batched_generator_that_answers_the_wrong_count_gets_a_contract_verdict():
    class Short(BatchedReferenceLoop):
        def generate_batch(self, *args, **kwargs):
            return super().generate_batch(*args, **kwargs)[:-1]

    result = run_generator_audit(Short(), level="quick", worlds=[WORLD.name], generations=20, greedy=False,
                                 progress=False)
    contract = [v for v in result.verdicts if v.law == "contract"]
    assert contract and contract[0].outcome is Outcome.CONTRACT_VIOLATION
    assert "answers for" in contract[0].summary


# ---- SGLang: the target-only rule on a chain ----------------------------------------------------

from exactcheck.adapters.sglang import SglangChainVerifier  # noqa: E402
from exactcheck.step.runner import run_audit  # noqa: E402
from standins import sglang_kernel  # noqa: E402


@pytest.mark.long
def test_the_sglang_adapter_through_the_full_quick_audit():
    """SGLang's target-only chain verification (the stand-in kernel) through the adapter's layout:
    every law of the target-only rule is exact; the one finding is ``coin <= p(x)`` accepting a
    draft the target forbids when the float32 coin is exactly 0 (2^-24 per coin)."""
    result = run_audit(SglangChainVerifier(sglang_kernel.tree_speculative_sampling_target_only), level="quick",
                       progress=False)
    statistical = [v for v in result.verdicts if v.statistic is not None]
    assert len(statistical) > 40 and all(v.outcome is Outcome.EXACT for v in statistical)
    accepted = {v.check: v for v in result.verdicts}["three_token/accepted_length"]
    assert "rule target-only" in accepted.condition and accepted.category.value == "conformance"
    # what the pytest plugin lists for this subject is what the audit reports
    from exactcheck.audit_kinds import AuditKind, plan_subject
    subject = SglangChainVerifier(sglang_kernel.tree_speculative_sampling_target_only)
    assert plan_subject(AuditKind.VERIFIER, subject, level="quick").names == [v.check for v in result.verdicts]
    assert [v.check for v in result.failed] == ["properties/no_forbidden_token"]
    reach = result.failed[0].reachability
    assert reach.dtype == "float32" and reach.value == 0.0 and math.isclose(reach.per_draw_probability, 2.0 ** -24)


def test_the_target_only_rule_is_what_makes_sglang_exact_here():
    """Judged by Leviathan's laws, the same exact kernel fails the rule's laws: a conformance
    finding, never an exactness one (its output law is the target's); undeclared, it passes and
    is named target-only."""
    subject = SglangChainVerifier(sglang_kernel.tree_speculative_sampling_target_only)
    object.__setattr__(subject, "acceptance_rule", "min(1, p/q)")
    result = run_audit(subject, level="quick", worlds=["three_token"], progress=False)
    # a conformance law of the step shows it (which one crosses first depends on the looks)
    assert {"three_token/accepted_length", "three_token/correction_token"} & {v.check for v in result.failed}
    assert {v.category.value for v in result.failed if v.kind.statistical} == {"conformance"}
    object.__setattr__(subject, "acceptance_rule", None)
    undeclared = run_audit(subject, level="quick", worlds=["random_v5_k3"], progress=False)
    assert undeclared.passed and 'acceptance_rule = "target-only"' in undeclared.rule_note


def _kernel_keeping_the_rejected_draft(**arguments):
    """A broken target-only kernel: after a rejection it samples from p with the rejected draft
    still in it (it never marks the tried sibling), so the correction law is p, not p(1 - q)."""
    arguments["retrive_next_sibling"] = arguments["retrive_next_sibling"].clone()
    draft_probs = arguments["draft_probs"]
    sglang_kernel.tree_speculative_sampling_target_only(**arguments)
    draft_probs.zero_()
    batch, nodes = arguments["candidates"].shape
    n = arguments["accept_token_num"].to(torch.int64)
    p = arguments["target_probs"][torch.arange(batch), n]
    u = arguments["uniform_samples_for_final_sampling"]
    resampled = (p.cumsum(1) <= (u * p.sum(1))[:, None]).sum(1).clamp(max=p.shape[1] - 1)
    slots = arguments["retrive_index"][torch.arange(batch), n]
    arguments["predicts"][slots] = resampled.to(arguments["predicts"].dtype)


def test_a_target_only_kernel_that_keeps_the_rejected_draft_is_caught():
    result = run_audit(SglangChainVerifier(_kernel_keeping_the_rejected_draft), level="quick",
                       worlds=["three_token", "random_v8_k4"], progress=False)
    assert any(v.law in ("correction_token", "accepted_length", "first_token") for v in result.failed), \
        [v.check for v in result.failed]


def test_the_sglang_stand_in_walks_a_chain_like_its_general_tree_walk():
    generator = torch.Generator().manual_seed(3)
    batch, k, vocab = 64, 3, 6
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=generator), -1)
    drafts = torch.randint(vocab, (batch, k), generator=generator)
    outputs = []
    for chain in (True, False):
        subject = SglangChainVerifier(sglang_kernel.tree_speculative_sampling_target_only)
        if not chain:  # an accept_index one column wider sends the stand-in down its general tree walk
            def general(**arguments):
                speculative = arguments["accept_index"].shape[1]
                padded = torch.full((batch, speculative + 1), -1, dtype=torch.int32)
                padded_arguments = dict(arguments, accept_index=padded)
                sglang_kernel.tree_speculative_sampling_target_only(**padded_arguments)
                arguments["accept_index"].copy_(padded[:, :speculative])
            subject = SglangChainVerifier(general)
        outputs.append(subject(p, torch.full_like(p[:, :k], 1 / vocab), drafts, torch.Generator().manual_seed(0)))
    assert torch.equal(outputs[0], outputs[1])


# ---- the README's recipes, run as written against the stand-ins --------------------------------

import importlib  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "engine_recipes"


def _run_recipe(path: pathlib.Path, monkeypatch, modules: dict) -> list[str]:
    """Run every test function of a recipe file with ``modules`` standing in for the engine's;
    the failure messages of those that fail."""
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    failures = []
    for name in dir(recipe):
        if name.startswith("test_"):
            try:
                getattr(recipe, name)()
            except AssertionError as exc:
                failures.append(str(exc))
    return failures


@pytest.mark.long
def test_the_vllm_recipe_runs_as_written_and_names_the_finding(monkeypatch):
    vllm_package = types.ModuleType("vllm")
    failures = _run_recipe(RECIPES / "test_vllm_rejection_sampler.py", monkeypatch,
                           {"vllm": vllm_package, "vllm.v1": types.ModuleType("vllm.v1"),
                            "vllm.v1.sample": types.ModuleType("vllm.v1.sample"),
                            "vllm.v1.sample.rejection_sampler": vllm_standin})
    # vLLM's semantics fail both of the recipe's tests (the plain and the temperature path), on
    # the u = 0 acceptance and nothing else
    assert len(failures) == 2 and all("no_forbidden_token" in f and "2^-24" in f for f in failures)
    assert all(f.count(" law in world ") == 1 for f in failures)


@pytest.mark.long
def test_the_sglang_recipe_runs_as_written_and_names_the_finding(monkeypatch):
    kernel = types.ModuleType("sgl_kernel")
    kernel.tree_speculative_sampling_target_only = sglang_kernel.tree_speculative_sampling_target_only
    failures = _run_recipe(RECIPES / "test_sglang_chain_verifier.py", monkeypatch, {"sgl_kernel": kernel})
    assert len(failures) == 1 and "no_forbidden_token" in failures[0] and "2^-24" in failures[0]


@pytest.mark.long
def test_vllm_v2_block_verification_passes_its_laws_through_the_adapter():
    """vLLM 0.33's model-runner-V2 sampler in block mode (the stand-in: its signature, packing and
    float32 log-space semantics) through the V2 adapter: the adapter declares block verification,
    every law passes (exactness and block conformance); judged token-wise, the same kernel fails
    its accepted-length law as a conformance finding only. The stand-in's one property finding
    follows vLLM's float32 semantics: at u = 1 - 2^-24, log u + log q rounds to log q, a draft with
    p == q is rejected, and the zero residual's Gumbel-max picks token 0 (2^-24 per uniform; to be
    confirmed on vLLM's own kernel)."""
    from exactcheck.adapters.vllm import VllmV2RejectionSampler
    from standins import vllm_v2_rejection_sampler as v2
    subject = VllmV2RejectionSampler(v2, method="block")
    assert subject.acceptance_rule == "block"
    result = run_audit(subject, level="quick", worlds=["random_v5_k3", "properties/no_forbidden_token"],
                       max_samples=3000, progress=False)
    laws = [v for v in result.verdicts if v.kind.statistical]
    assert laws and all(v.outcome is Outcome.EXACT for v in laws), [v.describe() for v in laws if v.outcome.failed]
    assert [v.check for v in result.failed] in ([], ["properties/no_forbidden_token"])
    for v in result.failed:
        assert v.reachability.dtype == "float32" and v.reachability.probability >= 2.0 ** -24
    object.__setattr__(subject, "acceptance_rule", "token-wise")
    judged = run_audit(subject, level="quick", worlds=["random_v5_k3"], max_samples=3000, progress=False)
    # a conformance finding only: on the accepted length, or first on the joint law that holds it
    found = {(v.law, v.category.value) for v in judged.failed}
    assert found and found <= {("accepted_length", "conformance"), ("step_output", "conformance")}, found


# --- the adapters follow the installed release (vLLM 0.33's API; SGLang's Triton chain verifier) ---

from exactcheck.adapters.sglang import SglangTritonChainVerifier  # noqa: E402
from exactcheck.adapters.vllm import top_k_decoys  # noqa: E402
from exactcheck.errors import UsageError  # noqa: E402
from standins import sglang_triton_chain  # noqa: E402
from standins import vllm_v033_rejection_sampler as vllm_033  # noqa: E402


def test_the_vllm_adapter_drives_the_033_api_at_temperature_and_top_k():
    """vLLM 0.33's API (``target_logits``, ``apply_sampling_constraints``, float64 uniforms,
    ``GREEDY_TEMPERATURE`` 0; the stand-in) at temperature 0.7 with top-k through the adapter: every
    law is exact, and the one finding is the u = 0 acceptance, now at 2^-53 per float64 uniform."""
    subject = VllmRejectionSampler(vllm_033, temperature=0.7, top_k=True)
    assert subject.takes_logits and subject.greedy_temperature == 0
    result = run_audit(subject, level="quick", max_samples=5000, progress=False,
                       worlds=["three_token", "draft_mass_where_p_zero", "properties/no_forbidden_token"])
    laws = [v for v in result.verdicts if v.kind.statistical]
    assert len(laws) >= 8 and all(v.outcome is Outcome.EXACT for v in laws), [v.describe() for v in laws]
    assert [v.check for v in result.failed] == ["properties/no_forbidden_token"]
    reach = result.failed[0].reachability
    assert reach.dtype == "float64" and math.isclose(reach.per_draw_probability, 2.0 ** -53)


def test_the_vllm_greedy_path_of_the_033_api_is_judged_against_the_argmax():
    subject = VllmRejectionSampler(vllm_033, greedy=True)
    assert subject.acceptance_rule.startswith("relaxed")
    result = run_audit(subject, level="quick", max_samples=3000, worlds=["draft_mass_where_p_zero"], progress=False)
    assert result.passed and all(v.outcome is Outcome.EXACT for v in result.verdicts if v.kind.statistical)


def test_top_k_decoys_leave_the_rows_law_and_must_be_removed():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.2, 0.3, 0.5, 0.0], [0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 1.0, 0.0]])
    logits = torch.where(p > 0, p.log(), torch.full_like(p, -torch.inf))
    decoyed, k = top_k_decoys(logits, batch=2, k=2)
    assert k.tolist() == [3, 4]
    # request 0: row 1 has the largest support (3): its unsupported token gets a finite decoy
    assert torch.isfinite(decoyed[1]).all() and decoyed[1, 3] < decoyed[1, :3].min()
    assert torch.equal(decoyed[0], logits[0])  # support 2 < 3: left as it is
    kept = vllm_033.apply_sampling_constraints(
        decoyed.clone(), torch.tensor([2, 4]),
        types.SimpleNamespace(all_greedy=False, temperature=torch.ones(2), top_k=k))
    assert torch.allclose(kept.softmax(-1), p)


def test_a_release_the_vllm_adapter_cannot_drive_is_one_line():
    odd = types.ModuleType("odd_vllm")
    odd.rejection_sample = lambda draft_token_ids, logits_and_probs, sampling_metadata: None
    with pytest.raises(UsageError, match="neither target_probs .* nor target_logits"):
        VllmRejectionSampler(odd)
    odd.rejection_sample = lambda draft_token_ids, target_logits, sampling_metadata, new_required: None
    with pytest.raises(UsageError, match=r"takes \['new_required'\]"):
        VllmRejectionSampler(odd)
    odd.rejection_sample = lambda draft_token_ids, target_logits, sampling_metadata: None
    with pytest.raises(UsageError, match="no apply_sampling_constraints"):
        VllmRejectionSampler(odd, temperature=0.7)


def test_the_sglang_triton_chain_adapter_is_exact_token_wise_but_for_its_fallback_token():
    """SGLang's Triton chain verifier's semantics (the stand-in) through the adapter: token-wise
    declared, every law exact (``coin * q < p`` is strict: a coin of 0 accepts only a draft the
    target allows). The one finding, which SGLang's own kernel gives under the interpreter too
    (.ci/engines): at a final coin of 1 - 2^-24 the CDF walk's running sum, rounded apart from the
    normaliser, never exceeds coin * normaliser, and the kernel's fallback ``VOCAB_SIZE - 1`` is
    emitted though the target gives it 0."""
    subject = SglangTritonChainVerifier(sglang_triton_chain.chain_speculative_sampling_triton)
    assert subject.acceptance_rule == "token-wise"
    result = run_audit(subject, level="quick", max_samples=5000, progress=False,
                       worlds=["three_token", "draft_mass_where_p_zero", "properties/no_forbidden_token",
                               "properties/acceptance", "properties/contract"])
    laws = [v for v in result.verdicts if v.kind.statistical]
    assert len(laws) >= 8 and all(v.outcome is Outcome.EXACT for v in laws)
    assert [v.check for v in result.failed] == ["properties/no_forbidden_token"]
    finding = result.failed[0]
    assert "one_minus_ulp" in finding.describe() and finding.reachability.dtype == "float32"
    assert math.isclose(finding.reachability.per_draw_probability, 2.0 ** -24)
    assert SglangTritonChainVerifier(sglang_triton_chain.chain_speculative_sampling_triton,
                                     block_verification=True).acceptance_rule == "block"


class _SeededKernel:
    """The reference verifier behind a kernel that draws from a seed (as vLLM V2's Philox does):
    a seed drawn from the handed generator, then a fresh generator seeded with it."""

    random_numbers_from_seeds = "a stand-in kernel seeded per call"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator):
        from exactcheck import reference_verifier
        seed = int(torch.randint(0, 1 << 62, (), generator=generator))
        return reference_verifier(target_probs, draft_probs, draft_tokens, torch.Generator().manual_seed(seed))


def test_a_kernel_that_derives_its_random_numbers_from_seeds_is_not_judged_by_forced_values():
    result = run_audit(_SeededKernel(), worlds=["properties/acceptance", "properties/row_independence",
                                                "three_token"], progress=False)
    for check in ("properties/acceptance", "properties/row_independence"):
        verdict = next(v for v in result.verdicts if v.check == check)
        assert verdict.outcome is Outcome.INCONCLUSIVE
        assert "derives its random numbers from a seed (a stand-in kernel seeded per call)" in verdict.describe()
    assert result.passed  # the laws decide: exact


class _DeclaresSeedsButDrawsForced:
    """Says it derives its random numbers from seeds, but draws through torch (forced)."""

    random_numbers_from_seeds = "a claim its draws contradict"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator):
        from exactcheck.step.mutants import AcceptIfTargetAtLeastDraft
        return AcceptIfTargetAtLeastDraft()(target_probs, draft_probs, draft_tokens, generator)


def test_a_declared_seed_kernel_whose_draws_are_forced_is_still_judged():
    """The declaration does not switch the check off when the first case shows every draw forced:
    a broken acceptance rule behind it is still caught by the forced-value search."""
    result = run_audit(_DeclaresSeedsButDrawsForced(), worlds=["properties/acceptance"], progress=False)
    verdict = next(v for v in result.verdicts if v.check == "properties/acceptance")
    assert "derives its random numbers from a seed" not in verdict.describe()
    assert verdict.outcome.failed
