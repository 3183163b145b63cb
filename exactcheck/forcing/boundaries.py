"""Boundary values of forced randomness, shared by every kind that forces draws (the step properties,
the tree properties, the end-to-end forced draws): where a forced uniform sits near a decision
threshold (``RATIO_STEP``, ``TIE_MARGIN``), the floor an exact subject may raise a tiny uniform to
(``UNIFORM_FLOOR``), the grid each uniform convention is counted on (``CONVENTION_GRID``); the
interval of wrong uniforms around one found (``wrong_interval``) and the fewest forced draws that
still break a call (``fewest_forced``, delta debugging), with its reachability."""
from __future__ import annotations

import math
from dataclasses import replace

from exactcheck.forcing.randomness import DrawLog
from exactcheck.reachability import Reachability, forced_draws

__all__ = ["RATIO_STEP", "TIE_MARGIN", "UNIFORM_FLOOR", "SHRINK_CALLS", "CONFIRM_SEEDS", "CONVENTION_GRID",
           "BISECTIONS", "RESOLUTION", "CONTIGUITY_POINTS", "wrong_interval", "fewest_forced", "reachability_of"]

RATIO_STEP = 2.0 ** -14  # ratio_minus / ratio_plus sit this far (relative) from the threshold probed
TIE_MARGIN = 2.0 ** -18  # smallest relative margin around a tie (float32 and float64 rows)
# An exact subject may raise a tiny uniform to a floor before it compares (vLLM clamps its
# acceptance uniforms to at least 2^-31; float32 uniforms are multiples of 2^-24): a delivered
# uniform below this stands for any value up to it.
UNIFORM_FLOOR = 2.0 ** -24
SHRINK_CALLS = 160  # budget of subject calls for shrinking one forced set
CONFIRM_SEEDS = 4  # the shrunk set is re-run with this many generator seeds
CONVENTION_GRID = 32  # uniforms (i + 1/2) / 32 at which each convention's wrong calls are counted


BISECTIONS = 56  # at most this many halvings per side
RESOLUTION = 2.0 ** -40  # an end is pinned to this (absolute), or to 2^-6 of the interval grown so far
CONTIGUITY_POINTS = 8  # points inside a found interval re-checked before its measure is claimed


def wrong_interval(fails, d: float, resolution: float = RESOLUTION,
                   checks: int = CONTIGUITY_POINTS) -> tuple[float, float]:
    """[a, b], with a <= d <= b: every uniform checked in it gives a wrong call (``fails(c)``,
    every uniform forced to c), its ends found by bisection from d towards 0 and towards 1 (each
    end is a uniform checked wrong: the measure is a lower bound, within 2^-6 of the set's or
    ``resolution``), and ``checks`` points inside re-checked (an end is pulled in to below the
    first point that is not wrong). [d, d] when only d itself is known to fail. Shared by the
    acceptance property and the end-to-end forced draws (``exactcheck.e2e.forced_draws``)."""
    def side(end: float) -> float:
        good, bad = d, end  # good: known wrong; bad: not known wrong
        if fails(end):
            good = end
        else:
            for _ in range(BISECTIONS):
                mid = (good + bad) / 2
                if mid in (good, bad) or abs(bad - good) <= max(resolution, abs(good - d) / 64):
                    break
                if fails(mid):
                    good = mid
                else:
                    bad = mid
        for i in range(1, checks + 1):  # every point between d and good must be wrong
            c = d + (good - d) * i / (checks + 1)
            if c not in (d, good) and not fails(c):
                good = d + (good - d) * (i - 1) / (checks + 1)
                break
        return good
    return side(0.0), side(1.0 - 2.0 ** -53)


def reachability_of(log: DrawLog, chosen, minimal: bool, confirmed: float) -> Reachability:
    """The per-call probability that the forced elements ``chosen`` take their values."""
    probabilities, dtypes, functions, value = [], [], [], None
    offset = 0
    chosen = sorted(chosen)
    for draw in log.draws:
        inside = [i for i in chosen if offset <= i < offset + draw.numel]
        if inside:
            probabilities += [draw.element_probability] * len(inside)
            dtypes += [str(draw.dtype).replace("torch.", "")] * len(inside)
            functions.append(draw.entry)
            value = draw.value
        offset += draw.numel
    reach = forced_draws(probabilities, dtypes, functions, value, minimal)
    if reach.draws and confirmed < 1:
        reach = replace(reach, probability=reach.probability * confirmed)
    return reach


def fewest_forced(fails, full: DrawLog, seed: int, budget: int = SHRINK_CALLS) -> tuple[tuple[int, ...], Reachability]:
    """Delta debugging over the element indices of a fully forced call (``full``): the fewest
    forced elements ``only`` such that ``fails(only, seed)`` still holds (the other draws come
    from the subject's generator seeded ``seed``), confirmed under ``CONFIRM_SEEDS - 1`` more
    seeds; and that set's reachability (``exactcheck.reachability``). Shared by the step
    properties and the end-to-end forced draws (``exactcheck.e2e.forced_draws``)."""
    calls = [0]

    def attempt(only, s=seed) -> bool:
        calls[0] += 1
        return fails(only, s)

    if attempt(()):
        return (), forced_draws([], [], [], None)
    current = list(range(full.elements))
    n = 2
    while len(current) >= 2 and calls[0] < budget:
        size = math.ceil(len(current) / n)
        chunks = [current[i:i + size] for i in range(0, len(current), size)]
        for chunk in chunks:
            if calls[0] >= budget:
                break
            if attempt(chunk):
                current, n = chunk, 2
                break
        else:
            for chunk in chunks if n > 2 else ():
                if calls[0] >= budget:
                    break
                rest = [i for i in current if i not in set(chunk)]
                if attempt(rest):
                    current, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(current):
                    break
                n = min(2 * n, len(current))
    minimal = len(current) <= 1 or calls[0] < budget
    confirmed = (1 + sum(attempt(current, seed + 1 + i) for i in range(CONFIRM_SEEDS - 1))) / CONFIRM_SEEDS
    return tuple(current), reachability_of(full, current, minimal, confirmed)
