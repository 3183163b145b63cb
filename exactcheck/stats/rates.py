"""Whether one set of units drafts less often than another: the test behind a serve audit's
``speculation_ran`` (vLLM #34497: asking for logprobs silently switched speculation off).

A *unit* is a request (a server that counts drafts per request: llama.cpp's ``timings.draft_n``)
or a chunk of consecutive requests (a server that counts them server-wide: vLLM's ``/metrics``,
read between chunks). A unit is *positive* when it drafted at least once. Under the null, the
probed units (requests that asked for probabilities) and the law units are independent draws of
one Bernoulli(r), r unknown; the alternative is a lower rate on the probes (0 when speculation is
switched off for them).

The test, at level a: take the one-sided Clopper-Pearson lower bound ``r_lo`` of the law units'
rate at confidence 1 - a/2, and reject when P(Bin(n, r_lo) <= x) <= a/2, x the positive probes
of n. Under the null, r_lo > r with probability at most a/2, and otherwise the binomial tail at
r_lo is at least the tail at r, which is at most a/2 with probability at most a/2: the level is
at most a, for any n chosen from the law units alone (given them, the probes are still
independent Bin(n, r)). The p-value is the smallest a that rejects (the rejection region grows
with a, so bisection finds it). Per-unit positives, not draft tokens, are counted: drafts come in
bursts (k tokens a draft, runs of drafts where the context repeats), and a count test on tokens
would take a burst for independent evidence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import special

__all__ = ["RateComparison", "rate_lower_bound", "fewer_positives_pvalue", "units_to_detect_off"]


def rate_lower_bound(positive: int, units: int, level: float) -> float:
    """One-sided Clopper-Pearson lower bound of a Bernoulli rate at confidence ``1 - level``."""
    if positive <= 0 or units <= 0:
        return 0.0
    return float(special.betaincinv(positive, units - positive + 1, level))


def _rejects(level: float, law_positive: int, law_units: int, positive: int, units: int) -> bool:
    r_lo = rate_lower_bound(law_positive, law_units, level / 2)
    return r_lo > 0 and float(special.bdtr(positive, units, r_lo)) <= level / 2


def fewer_positives_pvalue(law_positive: int, law_units: int, positive: int, units: int) -> float:
    """The p-value of "the probed units draft less often than the law units" (module docstring):
    the smallest level at which the test rejects, 1 where it cannot reject at any level."""
    if units <= 0 or not _rejects(1.0, law_positive, law_units, positive, units):
        return 1.0
    low, high = -700.0, 0.0  # natural log of the level; rejects at exp(high)
    if _rejects(math.exp(low), law_positive, law_units, positive, units):
        return math.exp(low)
    for _ in range(60):
        middle = (low + high) / 2
        if _rejects(math.exp(middle), law_positive, law_units, positive, units):
            high = middle
        else:
            low = middle
    return math.exp(high)


def units_to_detect_off(law_positive: int, law_units: int, share: float) -> int | None:
    """The fewest probed units at which "no positive probe" (speculation off on the probes) is
    rejected at level ``share``; None where no number of probes can (no positive law unit)."""
    r_lo = rate_lower_bound(law_positive, law_units, share / 2)
    if r_lo <= 0:
        return None
    if r_lo >= 1:
        return 1
    return max(1, math.ceil(math.log(share / 2) / math.log1p(-r_lo)))


@dataclass(frozen=True)
class RateComparison:
    """The probed units against the law units: positives of each, the p-value of "fewer on the
    probes", and what the law units' rate expects on the probes."""

    law_positive: int
    law_units: int
    positive: int
    units: int

    @property
    def pvalue(self) -> float:
        return fewer_positives_pvalue(self.law_positive, self.law_units, self.positive, self.units)

    @property
    def expected(self) -> float:
        """Positive probes expected at the law units' observed rate."""
        return self.units * self.law_positive / self.law_units if self.law_units else 0.0
