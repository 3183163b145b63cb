"""Boundary random numbers: run a subject with its uniforms replaced by chosen values.

Sampling cannot see an event of probability 2^-53 (a float64 uniform of exactly 0), yet
``u <= p/q`` then accepts a token the target forbids (vLLM PR #23803, SGLang #35771). Here the
subject is called with ``torch.rand``, ``torch.rand_like`` and ``Tensor.uniform_`` returning a
chosen constant — 0, and the largest value below 1 in the requested dtype — and the deterministic
property "no token with target probability 0 is emitted" is checked on every row.

Draws made otherwise (``torch.multinomial``, ``Tensor.exponential_``, ``torch.randint``, numpy,
custom kernels) are not controlled; if a subject made no controlled draw, the check says so and
is inconclusive rather than passing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from exactcheck.contract import PADDING, Verifier, call_verifier
from exactcheck.errors import ContractViolation, Violation
from exactcheck.drive import step_inputs
from toy_models import StepWorld

__all__ = ["forced_uniforms", "BOUNDARY_VALUES", "BoundaryResult", "check_forbidden_tokens",
           "CONTROLLED_DRAWS"]

CONTROLLED_DRAWS = ("torch.rand", "torch.rand_like", "Tensor.uniform_")
BOUNDARY_VALUES = ("zero", "one_minus_ulp")


def _boundary(name: str, dtype: torch.dtype) -> float:
    if name == "zero":
        return 0.0
    one = torch.tensor(1.0, dtype=dtype)
    return float(torch.nextafter(one, torch.zeros_like(one)))


@contextlib.contextmanager
def forced_uniforms(name: str):
    """Within the block, the controlled draws return the boundary value ``name`` (in each
    call's dtype). Yields a list that counts the controlled draws made."""
    draws: list[str] = []
    rand, rand_like, uniform_ = torch.rand, torch.rand_like, torch.Tensor.uniform_

    def forced_rand(*args, **kwargs):
        out = rand(*args, **kwargs)
        draws.append("torch.rand")
        return out.fill_(_boundary(name, out.dtype))

    def forced_rand_like(*args, **kwargs):
        out = rand_like(*args, **kwargs)
        draws.append("torch.rand_like")
        return out.fill_(_boundary(name, out.dtype))

    def forced_uniform_(self, a=0.0, b=1.0, *, generator=None):
        draws.append("Tensor.uniform_")
        return self.fill_(a + (b - a) * _boundary(name, self.dtype))

    torch.rand, torch.rand_like, torch.Tensor.uniform_ = forced_rand, forced_rand_like, forced_uniform_
    try:
        yield draws
    finally:
        torch.rand, torch.rand_like, torch.Tensor.uniform_ = rand, rand_like, uniform_


@dataclass(frozen=True)
class BoundaryResult:
    """Outcome of one forced-uniform run: ``violation`` is None when the property held."""

    value: str
    rows: int
    controlled_draws: int
    violation: ContractViolation | None


def check_forbidden_tokens(verifier: Verifier, world: StepWorld, value: str, rows: int,
                           seed: int, device: torch.device | str = "cpu") -> BoundaryResult:
    """Run ``rows`` trials of ``world`` with the subject's uniforms forced to ``value`` and check
    that no emitted token has target probability 0 at its position. Raises ``SubjectCrashed``
    and ``ContractViolation`` for the caller to turn into verdicts."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    target, draft, drafts = step_inputs(world, rows, gen, device)
    with forced_uniforms(value) as draws:
        out = call_verifier(verifier, target, draft, drafts, gen)
    emitted = out != PADDING
    prob = target.gather(2, out.clamp(min=0)[..., None])[..., 0]
    bad = emitted & (prob == 0)
    violation = None
    if bad.any():
        row = int(bad.any(1).nonzero()[0, 0])
        violation = ContractViolation(
            Violation.FORBIDDEN_TOKEN,
            f"with every uniform = {value}, row {row} emitted {out[row].tolist()} for drafts "
            f"{drafts[row].tolist()}; target probabilities of the emitted tokens "
            f"{[round(float(x), 6) for x in prob[row][emitted[row]]]}", row)
    return BoundaryResult(value, rows, len(draws), violation)
