"""Control a black-box subject's random numbers: force every draw to a chosen boundary value.

Within ``controlled_randomness(value)`` these entry points return the boundary value instead of a
random one, whether called with a ``torch.Generator`` or not:

* ``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``: the uniform itself;
* ``Tensor.exponential_``: ``-log(1 - u)``, the exponential its inverse-CDF draw would give;
* ``torch.multinomial``: the token the inverse CDF gives at ``u`` on each row (first token of
  positive mass at u = 0, last at u just below 1).

Draws through ``torch.randn``, ``torch.randint``, ``torch.bernoulli``, ``torch.normal``,
``torch.poisson``, ``Tensor.random_``, ``Tensor.normal_``, ``Tensor.bernoulli_``, numpy or custom
kernels are *not* controlled; they are counted, by name, so a verdict can say what was not
forced. Uninitialised memory from ``torch.empty``/``empty_like``/``Tensor.new_empty`` is poisoned
(NaN for floating tensors, -1 for integer ones), so code that reads memory it never wrote shows it.

Boundary values: ``zero``; ``one_minus_ulp`` (the largest value below 1 in the draw's dtype); or
an explicit float in [0, 1) (used for exactly p/q, and values just below or above it).
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass, field

import torch

__all__ = ["controlled_randomness", "DrawLog", "boundary_value", "CONTROLLED", "UNCONTROLLED"]

CONTROLLED = ("torch.rand", "torch.rand_like", "Tensor.uniform_", "Tensor.exponential_",
              "torch.multinomial")
UNCONTROLLED = ("torch.randn", "torch.randint", "torch.bernoulli", "torch.normal", "torch.poisson",
                "Tensor.random_", "Tensor.normal_", "Tensor.bernoulli_")


def boundary_value(value: str | float, dtype: torch.dtype = torch.float64) -> float:
    """The uniform a boundary name stands for, in ``dtype``."""
    if isinstance(value, float):
        return value
    if value == "zero":
        return 0.0
    if value == "one_minus_ulp":
        one = torch.tensor(1.0, dtype=dtype)
        return float(torch.nextafter(one, torch.zeros_like(one)))
    raise ValueError(f"boundary value ({value!r}) must be 'zero', 'one_minus_ulp' or a float in [0, 1)")


@dataclass
class DrawLog:
    """What the subject drew while controlled."""

    controlled: Counter = field(default_factory=Counter)
    uncontrolled: Counter = field(default_factory=Counter)

    def describe_uncontrolled(self) -> str:
        return ", ".join(f"{name} x{count}" for name, count in sorted(self.uncontrolled.items()))


def _float_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.float64


@contextlib.contextmanager
def controlled_randomness(value: str | float, poison_empty: bool = True):
    """Force the controllable draws to ``value`` for the duration of the block; yields a
    ``DrawLog``. Not thread-safe: it swaps attributes of the torch module."""
    log = DrawLog()
    saved: dict[tuple[object, str], object] = {}

    def swap(owner, name, fn):
        saved[(owner, name)] = getattr(owner, name)
        setattr(owner, name, fn)

    def original(owner, name):
        return saved[(owner, name)]

    def forced_rand(*args, **kwargs):
        out = original(torch, "rand")(*args, **kwargs)
        log.controlled["torch.rand"] += 1
        return out.fill_(boundary_value(value, out.dtype))

    def forced_rand_like(*args, **kwargs):
        out = original(torch, "rand_like")(*args, **kwargs)
        log.controlled["torch.rand_like"] += 1
        return out.fill_(boundary_value(value, out.dtype))

    def forced_uniform_(self, a=0.0, b=1.0, *, generator=None):
        log.controlled["Tensor.uniform_"] += 1
        return self.fill_(a + (b - a) * boundary_value(value, self.dtype))

    def forced_exponential_(self, lambd=1.0, *, generator=None):
        log.controlled["Tensor.exponential_"] += 1
        u = boundary_value(value, self.dtype)
        return self.fill_(-math.log1p(-u) / lambd)

    def forced_multinomial(input, num_samples, replacement=False, *, generator=None, out=None):
        # torch's own call first: it raises on NaN, inf, negative or all-zero rows exactly as the
        # subject would see outside this block; only then is its draw replaced
        original(torch, "multinomial")(input, num_samples, replacement, generator=generator)
        log.controlled["torch.multinomial"] += 1
        probs = input.double() if input.dim() == 2 else input.double()[None]
        cdf = probs.cumsum(1)
        u = boundary_value(value, torch.float64)
        token = (cdf <= u * cdf[:, -1:]).sum(1)
        last = (cdf < cdf[:, -1:]).sum(1)
        token = torch.minimum(token, last)
        result = token[:, None].expand(-1, num_samples).clone()
        return result if input.dim() == 2 else result[0]

    def counting(owner, name, label):
        def fn(*args, **kwargs):
            log.uncontrolled[label] += 1
            return original(owner, name)(*args, **kwargs)
        return fn

    def poisoned(owner, name):
        def fn(*args, **kwargs):
            out = original(owner, name)(*args, **kwargs)
            return out.fill_(math.nan if out.dtype.is_floating_point else -1) if out.numel() else out
        return fn

    swap(torch, "rand", forced_rand)
    swap(torch, "rand_like", forced_rand_like)
    swap(torch.Tensor, "uniform_", forced_uniform_)
    swap(torch.Tensor, "exponential_", forced_exponential_)
    swap(torch, "multinomial", forced_multinomial)
    swap(torch.Tensor, "multinomial", lambda self, *a, **k: forced_multinomial(self, *a, **k))
    for label in UNCONTROLLED:
        owner_name, name = label.split(".")
        owner = torch if owner_name == "torch" else torch.Tensor
        swap(owner, name, counting(owner, name, label))
    if poison_empty:
        swap(torch, "empty", poisoned(torch, "empty"))
        swap(torch, "empty_like", poisoned(torch, "empty_like"))
        swap(torch.Tensor, "new_empty", poisoned(torch.Tensor, "new_empty"))
    try:
        yield log
    finally:
        for (owner, name), fn in saved.items():
            setattr(owner, name, fn)
