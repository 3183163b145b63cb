"""How a subject handles invalid inputs: NaN, infinite, negative, unnormalised, all-zero rows.

A fixed, small verify case is corrupted one way at a time (in the target rows, then in the draft
rows, at the entry of row 0's first draft token) and the subject is called once. Each handling is
classified: ``error`` (it raised: the clear refusal we want), ``garbage`` (it returned output that
breaks the contract — an out-of-vocabulary id is vLLM's remote-DoS class) or ``accepted`` (it
returned valid-looking ids from invalid probabilities). Unnormalised rows may reasonably be
accepted; silently accepting NaN, inf or negative probabilities is reported.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from exactcheck.contracts.verifier import Verifier, validate_output
from exactcheck.errors import ContractViolation, SubjectError
from exactcheck.subject_call import call_subject
from exactcheck.step.strategies import VerifyCase

__all__ = ["InputProbe", "probe_invalid_inputs", "CORRUPTIONS", "MUST_REFUSE"]

CORRUPTIONS = ("nan", "inf", "negative", "all_zero", "sums_to_2", "sums_to_half")
MUST_REFUSE = ("nan", "inf", "negative", "all_zero")
BASE_CASE = VerifyCase(5, 2, 4, "dirichlet", "independent", "any", 0)


@dataclass(frozen=True)
class InputProbe:
    corruption: str
    where: str  # "target" or "draft"
    handling: str  # "error", "garbage", "accepted" (or "broken on valid input")
    detail: str


def _corrupt(rows: torch.Tensor, token: int, corruption: str) -> torch.Tensor:
    rows = rows.clone()
    if corruption == "nan":
        rows[0, 0, token] = math.nan
    elif corruption == "inf":
        rows[0, 0, token] = math.inf
    elif corruption == "negative":
        rows[0, 0, token] = -0.25
    elif corruption == "all_zero":
        rows[0, 0] = 0.0
    elif corruption == "sums_to_2":
        rows[0, 0] *= 2
    elif corruption == "sums_to_half":
        rows[0, 0] *= 0.5
    return rows


def probe_invalid_inputs(subject: Verifier, seed: int = 0, device="cpu") -> list[InputProbe]:
    """One probe per corruption and place. If the subject raises or breaks the contract on the
    valid base case itself, a single probe with handling "broken on valid input" is returned:
    its errors on corrupted inputs would say nothing."""
    p, q, tokens = BASE_CASE.tensors(device)
    token = int(tokens[0, 0])
    try:
        validate_output(call_subject(subject, p, q, tokens, torch.Generator(device=device).manual_seed(seed)),
                        tokens, p.shape[-1])
    except SubjectError as exc:  # foreign code: any exception, SystemExit and hangs included
        return [InputProbe("none", "valid input", "broken on valid input", _why(exc))]
    probes = []
    for where in ("target", "draft"):
        for corruption in CORRUPTIONS:
            tp = _corrupt(p, token, corruption) if where == "target" else p
            dp = _corrupt(q, token, corruption) if where == "draft" else q
            try:
                out = call_subject(subject, tp, dp, tokens, torch.Generator(device=device).manual_seed(seed))
            except SubjectError as exc:  # foreign code: every exception is a handling to report
                probes.append(InputProbe(corruption, where, "error", _why(exc)))
                continue
            try:
                out = validate_output(out, tokens, p.shape[-1])
            except ContractViolation as exc:
                probes.append(InputProbe(corruption, where, "garbage", str(exc)))
                continue
            probes.append(InputProbe(corruption, where, "accepted", f"row 0 -> {out[0].tolist()}"))
    return probes


def _why(exc) -> str:
    """"TypeName: message" of the subject's own exception (a contract break: its message)."""
    inner = getattr(exc, "exc", None)
    return f"{type(inner).__name__}: {inner}" if inner is not None else f"{type(exc).__name__}: {exc}"
