"""How likely a deterministic finding's trigger is in real use.

A property breaks under forced random numbers; whether that matters depends on how often real
draws produce the trigger. For a forced-value finding the trigger found is a set of draws taking
one value each, the *fewest* forced draws that still break the property
(``exactcheck.step.properties`` shrinks the forced set); the figure reported is the product of
the per-draw probabilities of those values in the draws' dtypes (a float32 uniform is exactly 0
with probability 2^-24, a float64 one with 2^-53). That is the probability of one way to trigger
the finding; other draws of the call, or other values, may trigger it too. So for float32 and
float64 draws, whose per-value probability is exact, it is a lower bound on the trigger's
probability per call, and is printed as one ("probability at least 2^-24 per call"); for
half-precision draws the per-draw figure is itself an upper bound, so the product is printed
plainly. A finding observed with ordinary random numbers (a law's impossible outcome, a cache
breach) is reachable at its observed frequency. A structural finding (a row's output depends on
its batch at identical random numbers) does not hinge on a rare value.

A trigger rarer than ``FLOOR`` per call (2^-60: at a billion calls a second, once in 36 years)
is *unreachable boundary behaviour*: shown in reports, never failing an audit.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["Reachability", "FLOOR", "FLOOR_LOG2", "ORDINARY", "forced_draws", "observed_in", "structural", "wrong_uniforms"]

FLOOR_LOG2 = -60
FLOOR = 2.0 ** FLOOR_LOG2
# a finding whose trigger has at least this probability per call is met with ordinary random
# numbers in a run of a million calls (about 2^-20)
ORDINARY = 2.0 ** -20
# dtypes whose uniform draws take each value with an exact, known probability (2^-24, 2^-53)
_EXACT_GRIDS = ("float32", "float64")


@dataclass(frozen=True)
class Reachability:
    """How often a deterministic finding's trigger occurs.

    ``kind``: ``forced`` (a set of forced draws; ``draws`` of them, ``per_draw_probability``
    each, ``dtype`` and ``draw_function`` naming them), ``observed`` (seen with ordinary random
    numbers in ``observed`` of ``trials``), or ``structural``. ``probability`` is per call (per
    generation for observed findings; for a forced set, a lower bound where ``lower_bound``);
    None for structural findings. ``minimal``: the forced set
    could not be made smaller (False: the shrinking ran out of budget, so the true trigger may be
    likelier than stated)."""

    kind: str
    probability: float | None
    detail: str
    draws: int = 0
    per_draw_probability: float | None = None
    dtype: str | None = None
    draw_function: str | None = None
    value: float | None = None
    minimal: bool = True
    observed: int = 0
    trials: int = 0
    low: float | None = None  # an interval finding's uniforms: [low, high]
    high: float | None = None

    @property
    def reachable(self) -> bool:
        return self.probability is None or self.probability >= FLOOR

    @property
    def lower_bound(self) -> bool:
        """Whether ``probability`` is a lower bound on the trigger's probability per call, not its
        value: a forced set's probability is that of one way to trigger the finding (the call's
        other draws, or other values, may trigger it too), and bounds it from below where every
        forced draw's per-value probability is exact (float32, float64; ``value_probability``)."""
        return (self.kind == "forced" and self.draws > 0 and self.dtype is not None
                and all(d.strip() in _EXACT_GRIDS for d in self.dtype.split(",")))

    def describe(self) -> str:
        if self.kind == "forced":
            if self.draws == 0:
                return "reachable with ordinary random numbers: no forced draw is needed"
            bound = "at least " if self.lower_bound else ""
            return (f"{self.draws} forced draw{'s' * (self.draws != 1)} of {self.draw_function} "
                    f"({self.dtype}) at {self.value!r}: probability {bound}{_power(self.probability)} per call"
                    + ("" if self.minimal else " (set not fully shrunk: the trigger may be likelier still)")
                    + ("" if self.reachable else f", below the floor {_power(FLOOR)}: unreachable"))
        if self.kind == "interval":
            what = ("wrong decisions at every uniform" if self.draw_function == "the acceptance uniform"
                    else f"broken at every value of {self.draw_function}")
            return (f"{what} in [{self.low:.9g}, {self.high:.9g}] ({self.dtype}), "
                    f"a fraction {self.probability:.3g} of them, forced at {self.value!r} and grown by bisection: "
                    + ("reachable with ordinary random numbers" if self.probability >= ORDINARY
                       else f"probability about {_power(self.probability)} per call"))
        return self.detail

    def to_dict(self) -> dict:
        return asdict(self)


def _power(p: float | None) -> str:
    if p is None:
        return "-"
    if p <= 0:
        return "0"
    exponent = math.log2(p)
    if abs(exponent - round(exponent)) < 1e-9 and exponent < -4:
        return f"2^{int(round(exponent))} ({p:.3g})"
    return f"{p:.3g} (2^{exponent:.1f})"


def forced_draws(probabilities: list[float], dtypes: list[str], functions: list[str], value: float,
                 minimal: bool = True) -> Reachability:
    """A trigger made of forced draws, each with its per-draw probability."""
    if not probabilities:
        return Reachability("forced", 1.0, "no forced draw is needed", draws=0, minimal=minimal)
    log2 = sum(math.log2(p) for p in probabilities)
    probability = 2.0 ** log2 if log2 > -1074 else 0.0
    per_draw = max(probabilities)
    return Reachability(
        "forced", probability, "", draws=len(probabilities), per_draw_probability=per_draw,
        dtype=", ".join(sorted(set(dtypes))), draw_function=", ".join(sorted(set(functions))),
        value=value, minimal=minimal)


def wrong_uniforms(low: float, high: float, value: float, dtype: str,
                   draw_function: str = "the acceptance uniform") -> Reachability:
    """A finding that holds for every value in [low, high] of one draw (an acceptance decision
    with every uniform of the call forced to that one value, or an end-to-end trigger of one
    forced draw; ``exactcheck.step.properties.wrong_interval``): its measure, the chance that a
    uniform lands there, is the figure."""
    return Reachability("interval", high - low, "", draws=1, dtype=dtype, draw_function=draw_function,
                        value=value, low=low, high=high)


def observed_in(count: int, trials: int, what: str) -> Reachability:
    """A finding seen with ordinary random numbers, ``count`` times in ``trials``."""
    return Reachability("observed", count / trials if trials else None,
                        f"seen with ordinary random numbers: {what} {count:,} of {trials:,}",
                        observed=count, trials=trials)


def structural(detail: str) -> Reachability:
    """A finding that does not hinge on a rare random value."""
    return Reachability("structural", None, detail)
