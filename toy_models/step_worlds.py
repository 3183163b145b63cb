"""One-step worlds: fixed target and draft rows for every position of one verify call.

A step world gives the verifier the same rows in every trial: ``target_rows[i]`` is the target
law at draft position ``i`` (row ``k`` is the bonus position) and ``draft_rows[i]`` the draft law
the driver samples draft token ``i`` from. Because the rows do not depend on the drafted tokens,
the exact law of everything a Leviathan verifier emits (first token, accepted length, residual
and bonus tokens) has a closed form, computed in ``exactcheck.stats.laws``.

Rows are stored in float32, the precision a subject receives. The law they define is those float32
values taken to float64 and renormalised there, so expected laws never depend on float32 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["StepWorld", "step_worlds", "three_token"]


@dataclass(frozen=True)
class StepWorld:
    """Target rows ``[k+1, V]`` and draft rows ``[k, V]`` shared by every trial."""

    name: str
    description: str
    target_rows: torch.Tensor
    draft_rows: torch.Tensor
    input_dtype: torch.dtype = torch.float32  # the dtype the subject receives the rows in

    def __post_init__(self) -> None:
        t, d = self.target_rows, self.draft_rows
        if t.dtype != torch.float32 or d.dtype != torch.float32:
            raise TypeError(f"world {self.name}: rows must be float32")
        if t.dim() != 2 or d.dim() != 2 or t.shape[0] != d.shape[0] + 1 or t.shape[1] != d.shape[1]:
            raise ValueError(
                f"world {self.name}: target rows must be [k+1, V] and draft rows [k, V], "
                f"got {tuple(t.shape)} and {tuple(d.shape)}"
            )
        for rows in (t, d):
            if (rows < 0).any() or not torch.isfinite(rows).all():
                raise ValueError(f"world {self.name}: rows must be finite and non-negative")
            if ((rows.double().sum(1) - 1).abs() > 1e-2).any():
                raise ValueError(f"world {self.name}: rows must sum to 1 (within 1e-2)")
        if not torch.equal(t.to(self.input_dtype).float(), t):
            raise ValueError(f"world {self.name}: rows must be exactly representable in {self.input_dtype}")

    @property
    def draft_length(self) -> int:
        return self.draft_rows.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.target_rows.shape[1]

    def target_law(self) -> np.ndarray:
        """Exact target law per position, float64 ``[k+1, V]``."""
        return _normalised(self.target_rows)

    def draft_law(self) -> np.ndarray:
        """Exact draft law per position, float64 ``[k, V]``."""
        return _normalised(self.draft_rows)


def _normalised(rows: torch.Tensor) -> np.ndarray:
    law = rows.double().numpy()
    return law / law.sum(axis=1, keepdims=True)


def _f32(rows) -> torch.Tensor:
    """Float32 rows normalised in float64 first, so each row sums to 1 up to float32 rounding."""
    arr = np.asarray(rows, dtype=np.float64)
    arr = arr / arr.sum(axis=-1, keepdims=True)
    return torch.tensor(arr, dtype=torch.float32)


def _dirichlet(rng: np.random.Generator, n: int, vocab: int, concentration: float) -> np.ndarray:
    return rng.dirichlet(np.full(vocab, concentration), size=n)


def three_token() -> StepWorld:
    """The guide's example: p = (0.6, 0.3, 0.1), q = (0.5, 0.4, 0.1). On rejection the residual
    max(0, p - q) puts all its mass on A (token 0). The bonus row differs from p and q."""
    return StepWorld(
        "three_token",
        "guide's example p=(0.6,0.3,0.1), q=(0.5,0.4,0.1); residual is all on token 0",
        _f32([[0.6, 0.3, 0.1], [0.2, 0.3, 0.5]]),
        _f32([[0.5, 0.4, 0.1]]),
    )


def random_rows(name: str, vocab: int, k: int, agreement: float, seed: int) -> StepWorld:
    """Dirichlet target rows; each draft row is ``agreement * p + (1 - agreement) * noise``."""
    rng = np.random.default_rng(seed)
    p = _dirichlet(rng, k + 1, vocab, 0.8)
    noise = _dirichlet(rng, k, vocab, 0.8)
    q = agreement * p[:k] + (1 - agreement) * noise
    return StepWorld(
        name, f"random rows, V={vocab}, k={k}, draft agreement {agreement}", _f32(p), _f32(q)
    )


def equal_rows(seed: int = 11) -> StepWorld:
    """p == q bitwise at every draft position: a rejection must never happen (residual mass 0)."""
    rng = np.random.default_rng(seed)
    p = _f32(_dirichlet(rng, 3, 6, 1.0))
    return StepWorld("p_equals_q", "p == q bitwise at every draft position, V=6, k=2", p, p[:2].clone())


def nearly_equal(seed: int = 12) -> StepWorld:
    """q is p moved by one float32 ulp on every token: ratios p/q within one ulp of 1."""
    rng = np.random.default_rng(seed)
    p = _f32(_dirichlet(rng, 3, 6, 1.0))
    q = p[:2].clone()
    up = torch.nextafter(q, torch.full_like(q, 2.0))
    down = torch.nextafter(q, torch.zeros_like(q))
    q = torch.where(torch.arange(6) % 2 == 0, up, down)
    return StepWorld("nearly_equal", "q = p moved one float32 ulp per token, V=6, k=2", p, q)


def disjoint_supports() -> StepWorld:
    """p lives on tokens 0-2, q on tokens 3-5: every draft is rejected, the correction is p."""
    p = _f32([[0.5, 0.3, 0.2, 0, 0, 0], [0.1, 0.2, 0.3, 0, 0, 0.4], [0.25, 0.25, 0, 0.25, 0.25, 0]])
    q = _f32([[0, 0, 0, 0.2, 0.3, 0.5], [0.3, 0.3, 0.4, 0, 0, 0]])
    return StepWorld("disjoint_supports", "target and draft supports disjoint, V=6, k=2", p, q)


def one_hot() -> StepWorld:
    """One-hot target rows at the draft positions; the draft agrees at position 1 only."""
    p = _f32([[0, 0, 1, 0, 0], [0, 0, 0, 0, 1], [0.1, 0.2, 0.3, 0.15, 0.25]])
    q = _f32([[0.3, 0.2, 0.2, 0.2, 0.1], [0, 0, 0, 0, 1]])
    return StepWorld("one_hot", "one-hot target rows, spread and one-hot drafts, V=5, k=2", p, q)


def draft_mass_where_p_zero(seed: int = 13) -> StepWorld:
    """The draft puts 40% of its mass on tokens 5-7, which the target forbids (p = 0)."""
    rng = np.random.default_rng(seed)
    p = _dirichlet(rng, 4, 8, 1.0)
    p[:, 5:] = 0.0
    q = np.concatenate([0.6 * _dirichlet(rng, 3, 5, 1.0), 0.4 * _dirichlet(rng, 3, 3, 1.0)], axis=1)
    return StepWorld(
        "draft_mass_where_p_zero", "draft has 40% mass on tokens with p = 0, V=8, k=3", _f32(p), _f32(q)
    )


def near_zero_q() -> StepWorld:
    """The draft gives 1e-6 to tokens the target likes: huge ratios p/q, rare proposals."""
    p = _f32([[0.4, 0.3, 0.1, 0.1, 0.05, 0.05], [0.05, 0.05, 0.1, 0.2, 0.3, 0.3],
              [0.2, 0.1, 0.3, 0.1, 0.2, 0.1]])
    q = _f32([[1e-6, 1e-6, 0.3, 0.3, 0.2, 0.2 - 2e-6], [0.5, 0.5 - 2e-6, 1e-6, 1e-6, 0, 0]])
    return StepWorld("near_zero_q", "draft gives 1e-6 to the target's likely tokens, V=6, k=2", p, q)


def long_tail(vocab: int = 128, head: int = 48, tail_probability: float = 9e-5, k: int = 2,
              seed: int = 31) -> StepWorld:
    """Zipf-like head tokens plus a long tail of tokens at ``tail_probability`` each (below
    1e-4; 0.72% of the mass with the defaults), the draft a noisy copy of the target. The world
    where pruning of rare tokens shows, and the power benchmark's world (the small-bias mutants
    have TV 0.002-0.03 on its first-token law)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(k + 1):
        weights = 1.0 / np.arange(1, head + 1) ** 1.1
        weights = weights / weights.sum() * (1 - tail_probability * (vocab - head))
        row = np.concatenate([rng.permutation(weights), np.full(vocab - head, tail_probability)])
        rows.append(row)
    p = np.array(rows)
    noise = _dirichlet(rng, k, vocab, 1.0)
    q = 0.5 * p[:k] + 0.5 * noise
    return StepWorld("long_tail", f"Zipf head of {head} tokens and a tail of {vocab - head} tokens "
                     f"at {tail_probability:g}, V={vocab}, k={k}", _f32(p), _f32(q))


def rounded(world: StepWorld, dtype: torch.dtype) -> StepWorld:
    """``world`` with its rows rounded to ``dtype`` and handed to the subject in it. The exact law
    is that of the rounded rows; the description states its TV to the float32 law."""
    target, draft = world.target_rows.to(dtype).float(), world.draft_rows.to(dtype).float()
    base = StepWorld(world.name, "", target, draft, dtype)
    tv = max(0.5 * abs(base.target_law() - world.target_law()).sum(1).max(),
             0.5 * abs(base.draft_law() - world.draft_law()).sum(1).max())
    name = f"{world.name}@{str(dtype).removeprefix('torch.')}"
    return StepWorld(name, f"{world.description}; rows rounded to {dtype} and passed in it (TV of "
                     f"each row's law to float32: at most {tv:.1e})", target, draft, dtype)


def step_worlds() -> list[StepWorld]:
    """The built-in step worlds, in audit order."""
    return [
        three_token(),
        random_rows("random_v8_k4", vocab=8, k=4, agreement=0.5, seed=1),
        random_rows("random_v5_k3", vocab=5, k=3, agreement=0.2, seed=2),
        random_rows("random_v32_k2", vocab=32, k=2, agreement=0.8, seed=3),
        equal_rows(),
        nearly_equal(),
        disjoint_supports(),
        one_hot(),
        draft_mass_where_p_zero(),
        near_zero_q(),
        long_tail(),
        rounded(random_rows("random_v8_k4", vocab=8, k=4, agreement=0.5, seed=1), torch.float16),
        rounded(random_rows("random_v8_k4", vocab=8, k=4, agreement=0.5, seed=1), torch.bfloat16),
    ]
