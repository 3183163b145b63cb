"""The step-level verifier contract, its output validation and the logits adapter.

A verifier is a callable

    verifier(target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k] int64,
             generator) -> [B, k+1] int64

Row ``b`` of the output holds the accepted draft tokens, then one correction token (after a
rejection) or bonus token (after k acceptances), then ``-1`` padding: the layout of vLLM's
rejection sampler. Rows are independent trials; tensors may live on any device, and the
``torch.Generator`` given lives on that device. How it decides what to accept is its rule
(``exactcheck.rules``), which it may declare with an ``acceptance_rule`` attribute.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from exactcheck.errors import ContractViolation, Violation
from exactcheck.options import PADDING
from exactcheck.subject_call import SnapshotInputs, call_subject

__all__ = ["Verifier", "PADDING", "validate_output", "rows_keep_contract", "call_verifier", "from_logits"]



class Verifier(Protocol):
    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 draft_tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor: ...


def validate_output(out: object, draft_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Return ``out`` if it keeps the contract, else raise ``ContractViolation`` naming the
    first broken rule and the first offending row."""
    batch, k = draft_tokens.shape
    if not isinstance(out, torch.Tensor):
        raise ContractViolation(Violation.NOT_A_TENSOR, f"got {type(out).__name__}")
    if tuple(out.shape) != (batch, k + 1):
        raise ContractViolation(Violation.WRONG_SHAPE, f"got {tuple(out.shape)}, expected {(batch, k + 1)}")
    if out.dtype != torch.int64:
        raise ContractViolation(Violation.WRONG_DTYPE, f"got {out.dtype}")
    out = out.to(draft_tokens.device)

    def first_row(bad: torch.Tensor) -> int:
        return int(bad.reshape(batch, -1).any(1).nonzero()[0, 0])

    # each rule costs one or two passes over the [B, k+1] output: the driver validates every call
    if out.numel():
        low, high = torch.aminmax(out)
        if bool(low < PADDING) or bool(high >= vocab_size):
            bad = (out < PADDING) | (out >= vocab_size)
            row = first_row(bad)
            raise ContractViolation(Violation.OUT_OF_VOCABULARY,
                                    f"row {row} is {out[row].tolist()} with V = {vocab_size}", row)
    pad = out == PADDING
    bad = pad[:, :-1] > pad[:, 1:]  # padding, then a token
    if bad.any():
        row = first_row(bad)
        raise ContractViolation(Violation.TOKEN_AFTER_PADDING, f"row {row} is {out[row].tolist()}", row)
    # padding is now a suffix: nothing emitted means padding from position 0, and position i holds
    # an accepted draft exactly when position i + 1 is not padding
    if pad[:, 0].any():
        row = first_row(pad[:, 0])
        raise ContractViolation(Violation.NOTHING_EMITTED, f"row {row} is {out[row].tolist()}", row)
    bad = (out[:, :k] != draft_tokens) > pad[:, 1:]
    if bad.any():
        row = first_row(bad)
        raise ContractViolation(
            Violation.DRAFT_MISMATCH,
            f"row {row} emitted {out[row].tolist()} for drafts {draft_tokens[row].tolist()}", row)
    return out


def rows_keep_contract(out: torch.Tensor, draft_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per row of an int64 [B, k+1] output on the drafts' device: does it keep every rule
    ``validate_output`` checks? One pure expression, so ``torch.compile`` makes it one pass."""
    k = draft_tokens.shape[1]
    pad = out == PADDING
    in_vocab = ((out >= PADDING) & (out < vocab_size)).all(1)
    suffix = ~(pad[:, 1:] < pad[:, :-1]).any(1)
    drafts = ~((out[:, :k] != draft_tokens) > pad[:, 1:]).any(1)
    return in_vocab & suffix & ~pad[:, 0] & drafts


def call_verifier(verifier: Verifier, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                  draft_tokens: torch.Tensor, generator: torch.Generator, check_rows=None,
                  **options) -> torch.Tensor:
    """Call the subject (``exactcheck.subject_call``: on copies of the tensors, within the call
    time limit) and validate its output; a crash becomes ``SubjectCrashed``, a hang
    ``SubjectTimedOut``, an input it wrote into ``ContractViolation(MUTATED_INPUT)``.
    ``check_rows`` (optional: ``rows_keep_contract`` compiled) is a fast first check of an output
    of the right shape, dtype and device; anything it does not pass goes through
    ``validate_output``, which names the broken rule. ``options`` (e.g. ``row_generators``) are
    passed through to subjects that take them."""
    guard = SnapshotInputs(("target_probs", target_probs), ("draft_probs", draft_probs),
                           ("draft_tokens", draft_tokens))
    out = call_subject(verifier, *guard.copies, generator, **options)
    guard.check()
    vocab = target_probs.shape[-1]
    if (check_rows is not None and isinstance(out, torch.Tensor) and out.dtype == torch.int64
            and out.shape == (draft_tokens.shape[0], draft_tokens.shape[1] + 1)
            and out.device == draft_tokens.device and bool(check_rows(out, draft_tokens, vocab).all())):
        return out
    return validate_output(out, draft_tokens, vocab)


def _logits(probs: torch.Tensor) -> torch.Tensor:
    return torch.log(probs.double()).to(torch.promote_types(probs.dtype, torch.float32))


def from_logits(fn: Callable[..., torch.Tensor]) -> Verifier:
    """Adapt a verifier that takes logits ``(target_logits, draft_logits, draft_tokens, generator)``.

    The logits given are ``log(probs)`` computed in float64 and rounded once to float32 (float64
    rows: float64), ``-inf`` where a probability is 0, so ``softmax`` of them recovers the rows to
    float32 precision, fp16 and bf16 rows included: the adapter adds no error of its own. (Rounding
    the logits to bf16 itself would move the law by TV ~0.003, which the standard level detects.)
    """

    def verifier(target_probs, draft_probs, draft_tokens, generator):
        return fn(_logits(target_probs), _logits(draft_probs), draft_tokens, generator)

    verifier.__name__ = getattr(fn, "__name__", "logits_verifier")
    verifier.__doc__ = fn.__doc__
    return verifier
