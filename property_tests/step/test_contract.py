"""Bad subjects get a verdict naming the violation, never a statistical pass or a traceback."""
import pytest
import torch

from exactcheck import (ContractViolation, Outcome, Violation, from_logits, reference_verifier,
                        run_audit, validate_output)
from exactcheck.contracts.verifier import rows_keep_contract

DRAFTS = torch.tensor([[1, 2], [0, 0]])


@pytest.mark.parametrize("out,violation", [
    ([[1, 2, 0]], Violation.NOT_A_TENSOR),
    (torch.tensor([[1, 2], [0, 0]]), Violation.WRONG_SHAPE),
    (torch.tensor([[1., 2., 0.], [0., -1., -1.]]), Violation.WRONG_DTYPE),
    (torch.tensor([[1, 2, 5], [0, -1, -1]]), Violation.OUT_OF_VOCABULARY),
    (torch.tensor([[1, 2, -2], [0, -1, -1]]), Violation.OUT_OF_VOCABULARY),
    (torch.tensor([[1, -1, 3], [0, -1, -1]]), Violation.TOKEN_AFTER_PADDING),
    (torch.tensor([[1, 2, 3], [-1, -1, -1]]), Violation.NOTHING_EMITTED),
    (torch.tensor([[1, 3, 3], [0, -1, -1]]), Violation.DRAFT_MISMATCH),
])
def test_each_violation_is_named(out, violation):
    with pytest.raises(ContractViolation) as info:
        validate_output(out, DRAFTS, vocab_size=5)
    assert info.value.violation is violation


def test_valid_outputs_pass():
    out = torch.tensor([[1, 2, 4], [3, -1, -1]])  # row 1: draft 0 rejected, correction 3
    assert validate_output(out, DRAFTS, vocab_size=5) is out


def _out_of_vocab(target_probs, draft_probs, draft_tokens, generator):
    out = reference_verifier(target_probs, draft_probs, draft_tokens, generator)
    out[out >= 0] = target_probs.shape[-1]  # the vLLM DoS class: id V
    return out


def _crash(target_probs, draft_probs, draft_tokens, generator):
    raise RuntimeError("CUDA error: device-side assert triggered")


def _wrong_shape(target_probs, draft_probs, draft_tokens, generator):
    return reference_verifier(target_probs, draft_probs, draft_tokens, generator)[:, :-1]


def _float_output(target_probs, draft_probs, draft_tokens, generator):
    return reference_verifier(target_probs, draft_probs, draft_tokens, generator).float()


def _crash_on_equal_rows(target_probs, draft_probs, draft_tokens, generator):
    if torch.equal(target_probs[:, :-1], draft_probs):
        raise ZeroDivisionError("residual sums to zero")
    return reference_verifier(target_probs, draft_probs, draft_tokens, generator)


@pytest.mark.parametrize("subject,outcome,words", [
    (_out_of_vocab, Outcome.CONTRACT_VIOLATION, "outside [0, V)"),
    (_crash, Outcome.CRASHED, "RuntimeError: CUDA error"),
    (_wrong_shape, Outcome.CONTRACT_VIOLATION, "shape"),
    (_float_output, Outcome.CONTRACT_VIOLATION, "int64"),
])
def test_bad_subjects_get_named_verdicts(subject, outcome, words):
    result = run_audit(subject, level="quick", worlds=["three_token", "ctx_v3_l5_k3"], progress=False,
                       stop_early=False)
    assert not result.passed
    assert {v.outcome for v in result.verdicts} == {outcome}
    assert all(words in v.summary for v in result.verdicts)


def test_a_crash_on_one_world_fails_only_that_world():
    result = run_audit(_crash_on_equal_rows, level="quick", worlds=["p_equals_q", "three_token"],
                       progress=False, stop_early=False)
    by_world = {v.world: v.outcome for v in result.verdicts}
    assert by_world == {"p_equals_q": Outcome.CRASHED, "three_token": Outcome.EXACT}


def test_logits_adapter_passes_the_reference_through():
    def logits_verifier(target_logits, draft_logits, draft_tokens, generator):
        return reference_verifier(target_logits.softmax(-1), draft_logits.softmax(-1),
                                  draft_tokens, generator)

    result = run_audit(from_logits(logits_verifier), level="quick",
                       worlds=["three_token", "draft_mass_where_p_zero", "ctx_v4_l5_k4"], progress=False)
    assert result.passed, [v.describe() for v in result.failed]


def test_python_subjects_get_a_python_reproducer():
    result = run_audit(_crash, level="quick", worlds=["three_token"], progress=False)
    assert result.verdicts[0].reproduce == (
        "run_audit(_crash, level='quick', seed=0, alpha=0.001, worlds=['three_token'])")


def _first_violation_by_rows(out: torch.Tensor, drafts: torch.Tensor, vocab: int):
    """The contract read row by row, rule by rule (the order ``validate_output`` promises)."""
    rows = out.tolist()
    checks = [
        (Violation.OUT_OF_VOCABULARY, lambda r, d: any(t < -1 or t >= vocab for t in r)),
        (Violation.TOKEN_AFTER_PADDING, lambda r, d: any(a == -1 and b != -1 for a, b in zip(r, r[1:]))),
        (Violation.NOTHING_EMITTED, lambda r, d: all(t == -1 for t in r)),
        (Violation.DRAFT_MISMATCH, lambda r, d: any(r[i] != d[i] for i in range(sum(t != -1 for t in r) - 1))),
    ]
    for violation, broken in checks:
        bad = [b for b, row in enumerate(rows) if broken(row, drafts[b].tolist())]
        if bad:
            return violation, bad[0]
    return None, None


def test_validation_names_the_first_rule_and_row_on_random_outputs():
    """Random outputs near the contract (few tokens, drafts mostly copied, padding in random
    places): the vectorised validation names the same rule and row as the row-by-row reading,
    and the compiled driver's one-pass check (``rows_keep_contract``) passes exactly the rows
    that reading passes."""
    gen = torch.Generator().manual_seed(0)
    vocab, k = 4, 3
    seen = set()
    for _ in range(3000):
        batch = int(torch.randint(1, 4, (1,), generator=gen))
        drafts = torch.randint(0, vocab, (batch, k), generator=gen)
        emitted = torch.randint(0, k + 2, (batch,), generator=gen)
        out = torch.cat([drafts, torch.randint(0, vocab, (batch, 1), generator=gen)], 1)
        out = torch.where(torch.arange(k + 1) < emitted[:, None], out, -1)
        noise = torch.rand(batch, k + 1, generator=gen) < 0.08
        out = torch.where(noise, torch.randint(-2, vocab + 1, (batch, k + 1), generator=gen), out)
        violation, row = _first_violation_by_rows(out, drafts, vocab)
        seen.add(violation)
        by_row = [_first_violation_by_rows(out[i:i + 1], drafts[i:i + 1], vocab)[0] is None for i in range(batch)]
        assert rows_keep_contract(out, drafts, vocab).tolist() == by_row, out.tolist()
        if violation is None:
            assert validate_output(out, drafts, vocab) is out
            continue
        with pytest.raises(ContractViolation) as info:
            validate_output(out, drafts, vocab)
        assert (info.value.violation, info.value.row) == (violation, row), out.tolist()
    assert seen == {None, Violation.OUT_OF_VOCABULARY, Violation.TOKEN_AFTER_PADDING,
                    Violation.NOTHING_EMITTED, Violation.DRAFT_MISMATCH}
