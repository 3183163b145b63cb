"""Adversarial randomness and deterministic properties: edge mutants are caught with no
sampling luck, minimised, and replayable."""
import json

import pytest
import torch
from hypothesis import given, settings

from exactcheck import run_audit
from exactcheck.cli import main
from exactcheck.step.mutants import mutant
from exactcheck.step.properties import check_property, replay_reproducer, search
from exactcheck.forcing.randomness import controlled_randomness
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.step.strategies import VerifyCase, edge_corpus, verify_cases
from exactcheck.report.verdict import Outcome

EDGE = {  # mutant -> (property, forced value the corpus breaks it with)
    "accept_on_equal_uniform": ("no_forbidden_token", "zero"),
    "unguarded_zero_residual": ("no_forbidden_token", "one_minus_ulp"),
    "zero_residual_to_vocab": ("contract", "one_minus_ulp"),
    # 2^-14 below p/q, where the float16 ratio (off by up to 2^-11) decides wrongly; at u = 0 the
    # ratios float16 flushes to 0 are below 2^-24, where an exact subject's uniform floor may reject
    "ratio_in_half_precision": ("acceptance", "ratio_minus"),
    "tiny_q_accepted": ("no_forbidden_token", "zero"),
    "uninitialised_unseeded_rows": ("seeded_rows", "zero"),
}


def test_forced_draws_and_uncontrolled_ones_are_named():
    g = torch.Generator().manual_seed(0)
    with controlled_randomness("zero") as log:
        assert torch.rand(3, generator=g).eq(0).all()
        assert torch.empty(2, dtype=torch.float64).uniform_().eq(0).all()
        assert torch.empty(2).exponential_().eq(0).all()
        assert torch.multinomial(torch.tensor([[0.0, 0.4, 0.6]]), 1).item() == 1
        torch.randn(2)
        assert torch.empty(2).isnan().all()  # uninitialised memory is poisoned
    assert set(log.controlled) == {"torch.rand", "Tensor.uniform_", "Tensor.exponential_",
                                   "torch.multinomial"}
    assert log.describe_uncontrolled() == "torch.randn x1"
    with controlled_randomness("one_minus_ulp"):
        assert torch.rand(1, dtype=torch.float64).item() == 1 - 2 ** -53
        assert torch.multinomial(torch.tensor([[0.3, 0.7, 0.0]]), 1).item() == 1
    assert not torch.empty(1000).isnan().all()  # restored afterwards


@settings(max_examples=60, deadline=None)
@given(verify_cases())
def test_generated_cases_are_valid_inputs(case):
    p, q, tokens = case.tensors()
    assert p.shape == (case.batch, case.draft_length + 1, case.vocab_size)
    assert torch.isfinite(p).all() and (p >= 0).all() and (p.sum(-1) > 0).all()
    assert (q.gather(2, tokens[..., None]) > 0).all()  # every draft could have been proposed


def test_edge_corpus_covers_each_row_kind_and_relation():
    corpus = edge_corpus()
    assert {c.relation for c in corpus} >= {"one_ulp_above", "disjoint", "tiny_q", "equal"}
    assert {c.row_kind for c in corpus} >= {"denormal", "fp16", "bf16", "head_zero", "one_hot"}


@pytest.mark.parametrize("name", list(EDGE))
def test_edge_mutant_fails_its_property_deterministically(name):
    prop, value = EDGE[name]
    for seed in (0, 1):  # the corpus is met first, whatever the search seed
        result = search(mutant(name), prop, examples=1, seed=seed)
        assert result.failure is not None and result.value == value
        case = result.failure.case
        assert case.vocab_size <= 3 and case.batch <= 2  # small enough to read


@pytest.mark.long
def test_edge_mutants_fail_quick_audits_with_minimal_reproducers(tmp_path):
    for name, (prop, _) in EDGE.items():
        result = run_audit(mutant(name), subject_name=f"exactcheck.step.mutants:{name}", level="quick",
                           worlds=["properties"], progress=False)
        verdict = next(v for v in result.failed if v.check == f"properties/{prop}")
        assert verdict.reproducer is not None
        assert verdict.outcome in (Outcome.DEFECT, Outcome.CONTRACT_VIOLATION)
        assert replay_reproducer(mutant(name), verdict.reproducer) is not None
        assert replay_reproducer(reference_verifier, verdict.reproducer) is None


def test_replay_command(tmp_path, capsys):
    assert main(["audit", "exactcheck.step.mutants:zero_residual_to_vocab", "--level", "quick",
                 "--world", "properties/contract", "--report", str(tmp_path), "--quiet"]) == 1
    path = tmp_path / "reproducers" / "exactcheck.step.mutants-zero_residual_to_vocab--properties-contract-quick-seed0.json"
    record = json.loads(path.read_text())
    assert record["schema"] == "exactcheck.reproducer/2" and record["inputs"] is not None
    assert main(["replay", str(path)]) == 1
    assert "still fails" in capsys.readouterr().out
    assert main(["replay", str(path), "--subject", "exactcheck.contracts.reference_verifier:reference_verifier"]) == 0
    assert main(["replay", str(next(tmp_path.glob("audit-exactcheck-step-mutants-zero_residual_to_vocab-quick-seed0-h*.json")))]) == 1


def test_a_subject_without_row_generators_is_not_judged_on_them():
    def plain(target_probs, draft_probs, draft_tokens, generator):
        return reference_verifier(target_probs, draft_probs, draft_tokens, generator)

    result = run_audit(plain, level="quick", worlds=["properties/seeded_rows"], progress=False)
    (verdict,) = result.verdicts
    assert verdict.outcome is Outcome.INCONCLUSIVE and "not applicable" in verdict.summary


def test_a_subject_drawing_only_uncontrolled_numbers_is_said_so():
    def bernoulli_verifier(target_probs, draft_probs, draft_tokens, generator):
        out = reference_verifier(target_probs, draft_probs, draft_tokens, generator)
        torch.bernoulli(torch.full((1,), 0.5))
        return out

    failure = check_property(bernoulli_verifier, "no_forbidden_token",
                             VerifyCase(3, 2, 1, "dirichlet", "independent", "any", 0), "zero")
    assert failure is None
    result = search(bernoulli_verifier, "no_forbidden_token", examples=1)
    assert "not forced:" in result.note and "torch.bernoulli" in result.note
    assert "torch's global generator" in result.note  # it drew without the generator it was handed


class _WrongOnce:
    """Exact, except that one call in the hypothesis phase returns the wrong shape: the
    failure cannot recur when hypothesis runs the same case again (as a nondeterministic
    kernel would do)."""

    def __init__(self, after: int):
        self.calls, self.after = 0, after

    def __call__(self, target_probs, draft_probs, draft_tokens, generator):
        self.calls += 1
        out = reference_verifier(target_probs, draft_probs, draft_tokens, generator)
        if self.calls == self.after:
            out = out[:, :-1]
        return out


def test_a_counterexample_that_does_not_recur_is_inconclusive_not_a_defect():
    from exactcheck.step.verdicts import property_verdict
    from exactcheck.report.verdict import Category
    subject = _WrongOnce(after=len(edge_corpus()) + 3)
    result = search(subject, "contract", examples=30, seed=0)
    assert result.failure is None and result.unrepeatable is not None, result
    verdict = property_verdict(result, "tests:wrong_once", 0, "exactcheck replay X")
    assert verdict.outcome is Outcome.INCONCLUSIVE and verdict.category is Category.REPRODUCIBILITY
    assert "did not recur" in verdict.summary and verdict.reproducer is not None


class _OneDraftCase:
    """One draft (token 0, q = 0.5) a row, whose p/q is ``ratios[row]``."""

    def __init__(self, *ratios: float):
        self.ratios, self.batch = ratios, len(ratios)

    def tensors(self, device="cpu"):
        p = torch.tensor([[[0.5 * r, 0.5, 0.5 - 0.5 * r], [0.25, 0.25, 0.5]] for r in self.ratios],
                         dtype=torch.float32, device=device)
        q = torch.tensor([[[0.5, 0.25, 0.25]]] * self.batch, dtype=torch.float32, device=device)
        return p, q, torch.zeros(self.batch, 1, dtype=torch.int64, device=device)


def _raised_uniform(p, q, tokens, generator):
    """Token-wise with one draft, its uniform raised to at least 2^-10 (not exact)."""
    u = torch.rand(tokens.shape, generator=generator).clamp(min=2.0 ** -10)
    ratio = p[:, :-1].gather(2, tokens[..., None])[..., 0] / q.gather(2, tokens[..., None])[..., 0]
    accepted = (u <= ratio)[:, 0]
    residual = (p[:, 0] - q[:, 0]).clamp(min=0).argmax(-1)
    first = torch.where(accepted, tokens[:, 0], residual)
    return torch.stack([first, torch.where(accepted, 1, -1)], 1)


def test_a_uniform_raised_to_a_floor_is_not_an_acceptance_defect():
    """vLLM clamps its acceptance uniforms to at least 2^-31: at a forced u = 0 it rejects a draft
    whose p/q is 2e-40 (a float32 subnormal), and an exact subject may do so (block_log_space did,
    seed 36 of the corpus run, before the floor was allowed for; a second row, p/q = 0.5, that it
    accepts rules out the mirrored convention). A uniform raised above a ratio of 1e-6 is still
    found."""
    from exactcheck.corpus.other_rules import OTHER_RULE_VERIFIERS
    from exactcheck.rules import rule_spec
    for rule in (rule_spec("block"), rule_spec("token-wise"), None):
        assert check_property(OTHER_RULE_VERIFIERS["block_log_space"], "acceptance", _OneDraftCase(2e-40, 0.5),
                              "zero", rule=rule) is None
    found = check_property(_raised_uniform, "acceptance", _OneDraftCase(1e-6, 0.5), "zero",
                           rule=rule_spec("token-wise"))
    assert found is not None and "row 0 accepted 0 drafts" in found.message


# -- every convention's thresholds, at every drafted position; reachability as a set of uniforms --

from exactcheck.options import Level  # noqa: E402
from exactcheck.reachability import ORDINARY  # noqa: E402
from exactcheck.rules import rule_spec  # noqa: E402
from exactcheck.step.mutants import CONVENTION_PRECISION_MUTANTS, MUTANTS  # noqa: E402
from exactcheck.step.properties import forced_uniform, ratio_position, with_wrong_uniforms  # noqa: E402
from exactcheck.forcing.boundaries import wrong_interval  # noqa: E402
from exactcheck.contracts.reference_verifier import ReferenceVerifier  # noqa: E402


def _two_drafts(first: float, second: float):
    """One row, two drafts of token 0 with q = 1/2 and p/q = ``first``, ``second``."""
    q = torch.full((1, 2, 2), 0.5)
    p = torch.tensor([[[first / 2, 1 - first / 2], [second / 2, 1 - second / 2], [0.5, 0.5]]])
    return p, q, torch.zeros(1, 2, dtype=torch.int64)


def test_the_ratio_values_probe_the_deepest_position_whose_decision_is_read():
    """p/q = [0.9, 0.5]: with every uniform near 0.5 the first draft is accepted, so the second's
    threshold is read and probed; p/q = [0.5, 0.9]: near 0.9 the first is rejected, so position 0."""
    for (first, second), probed in (((0.9, 0.5), 1), ((0.5, 0.9), 0)):
        p, q, tokens = _two_drafts(first, second)
        oracle = rule_spec("token-wise").oracle(p.double().numpy(), q.double().numpy(), tokens.numpy())
        assert ratio_position(oracle) == probed
        r = (first, second)[probed]
        assert forced_uniform("ratio", (p, q, tokens)) == pytest.approx(r, rel=1e-6)
        assert forced_uniform("mirrored_ratio_plus", (p, q, tokens)) == pytest.approx(1 - r * (1 + 2 ** -14), rel=1e-9)


def test_wrong_interval_keeps_a_point_and_grows_an_interval():
    assert wrong_interval(lambda c: c == 0.25, 0.25) == (0.25, 0.25)
    low, high = wrong_interval(lambda c: 0.2 <= c <= 0.6, 0.5)
    assert 0.2 <= low < 0.2 + 0.4 / 60 and 0.6 - 0.4 / 60 < high <= 0.6  # ends checked wrong: a lower bound


class _FlipsAtOneHalf(ReferenceVerifier):
    """Takes the wrong decision at exactly u = 0.5 (a float equality slip), the right one elsewhere."""

    def accept(self, u, p, q):
        return (u * q < p) ^ (u == 0.5)


def test_a_point_only_acceptance_finding_keeps_its_point_probability():
    subject = _FlipsAtOneHalf()
    case = VerifyCase(4, 2, 2, "dirichlet", "independent", "any", 0, "float64")
    failure = check_property(subject, "acceptance", case, 0.5)
    assert failure is not None
    widened = with_wrong_uniforms(subject, failure)
    assert widened.reachability.kind == "forced" and "at least 2^-53" in widened.reachability.describe()


def test_an_interval_acceptance_finding_states_its_measure():
    """accept_if_p_ge_q rejects every draft with p < q, which the rule accepts with probability
    p/q: wrong on most uniforms. ratio_in_half_precision errs between the float16 ratio and the
    exact one: about 2^-11 of p/q. Neither says 2^-53 any more."""
    broad = search(MUTANTS["accept_if_p_ge_q"].verifier, "acceptance", 50, 0).failure.reachability
    assert broad.kind == "interval" and broad.probability > 0.5
    assert "reachable with ordinary random numbers" in broad.describe() and "2^-53" not in broad.describe()
    narrow = search(MUTANTS["ratio_in_half_precision"].verifier, "acceptance", 50, 0).failure.reachability
    assert narrow.kind == "interval" and 2 ** -14 < narrow.probability < 2 ** -9 and narrow.probability >= ORDINARY
    assert narrow.low <= narrow.value <= narrow.high


@pytest.mark.long
@pytest.mark.parametrize("name", list(CONVENTION_PRECISION_MUTANTS))
def test_each_convention_and_precision_mutant_is_found_by_acceptance_reachably(name):
    """u or 1 - u, the ratio in float16 or bfloat16: found by the acceptance property at the quick
    level's examples, with wrong decisions on a set of uniforms ordinary random numbers meet."""
    result = search(CONVENTION_PRECISION_MUTANTS[name].verifier, "acceptance", Level.QUICK.property_examples, 0)
    assert result.failure is not None
    reach = result.failure.reachability
    assert reach.kind == "interval" and reach.probability >= ORDINARY, reach.describe()
