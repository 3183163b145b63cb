"""The budget planner: how many trials each world needs to detect a given TV.

A check of a law with K cells, run on n trials at significance ``share`` (its worst-case Holm
share, alpha / m), detects every alternative at total variation >= eps on its pooled cells with
probability >= ``power`` once the noncentral chi-square with noncentrality 4 n eps^2 clears the
critical value (``statistics.detectable_tv``). A conditional law (the bonus token given N = k,
the correction given N < k) sees only the trials that meet its condition, n * P(condition) in
expectation, so it needs 1 / P(condition) times more trials.

For every world the planner finds, by bisection on n, the fewest trials at which each of its laws
reaches ``eps``; the world runs the most any of its laws needs, capped at ``max_samples``. A law
that cannot reach ``eps`` within the cap is listed with the TV it does reach: the plan never
claims a guarantee it cannot give. Everything here depends on the exact laws and alpha only,
never on samples, so planning spends no false-alarm budget.

Levels (``exactcheck.options.Level``) are named targets: quick plans TV 0.05, standard 0.01,
release 0.003 on every law whose condition is not too rare for the level's cap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from exactcheck.stats.goodness_of_fit import POWER, detectable_tv, pooling
from exactcheck.options import AlphaBudget

__all__ = ["LawBudget", "WorldBudget", "BudgetPlan", "law_detectable_tv", "trials_to_detect", "MIN_SAMPLES",
           "round_up", "needed_trials"]

# Fewest trials planned for any world by default: below this the conditional laws drop out of
# the plan and the chi-square approximation on pooled cells gets coarse.
MIN_SAMPLES = 5_000


@dataclass(frozen=True)
class LawBudget:
    """One law's share of a plan."""

    world: str
    law: str
    condition: str
    condition_probability: float  # P(a trial counts for this law)
    cells: int
    needed: int | None  # trials needed to detect the target TV; None: more than the cap
    planned_tv: float  # the TV detected with `power` at the world's planned trials

    @property
    def reached(self) -> bool:
        return self.needed is not None


@dataclass(frozen=True)
class WorldBudget:
    world: str
    samples: int
    laws: tuple[LawBudget, ...]


@dataclass(frozen=True)
class BudgetPlan:
    """Trials per world for a target TV, with what each law then detects."""

    detect_tv: float
    alpha: float
    power: float
    checks: int  # statistical checks sharing alpha (Holm); the share used is alpha / checks
    max_samples: int
    min_samples: int
    worlds: tuple[WorldBudget, ...]
    # the audit's whole alpha and its split, where ``alpha`` is the Holm part of it
    # (``exactcheck.step.plan.budget_plan``): the plan's text then says where the rest went
    split: AlphaBudget | None = None

    @property
    def share(self) -> float:
        return self.alpha / max(self.checks, 1)

    @property
    def total_samples(self) -> int:
        return sum(w.samples for w in self.worlds)

    def samples(self, world: str) -> int:
        return next(w.samples for w in self.worlds if w.world == world)

    @property
    def unreached(self) -> list[LawBudget]:
        return [law for w in self.worlds for law in w.laws if not law.reached]

    def describe(self) -> str:
        """The plan as a table (what ``exactcheck plan`` prints)."""
        lines = [f"plan: detect TV >= {self.detect_tv:g} with power {self.power:g} at alpha "
                 f"{self.alpha:g} over {self.checks} statistical checks (share {self.share:.2g} "
                 f"each); {self.min_samples:,} to {self.max_samples:,} trials per world",
                 *self._alpha_lines(),
                 f"{'world':<26} {'law':<17} {'cells':>6} {'P(cond)':>8} {'needed':>10} "
                 f"{'planned':>10} {'detects TV':>10}"]
        for w in self.worlds:
            for law in w.laws:
                needed = f"{law.needed:,}" if law.needed is not None else "> cap"
                lines.append(f"{w.world:<26} {law.law:<17} {law.cells:>6} "
                             f"{law.condition_probability:>8.3g} {needed:>10} {w.samples:>10,} "
                             f"{law.planned_tv:>10.4f}")
        lines.append(f"total: {self.total_samples:,} trials over {len(self.worlds)} worlds")
        if self.unreached:
            one = len(self.unreached) == 1
            lines.append(f"{len(self.unreached)} {'law cannot' if one else 'laws cannot'} reach TV {self.detect_tv:g} "
                         f"within the cap ({'its condition is' if one else 'their condition is'} rare); the column "
                         f"'detects TV' says what {'it reaches' if one else 'they reach'}")
        return "\n".join(lines)

    def _alpha_lines(self) -> list[str]:
        """Why the alpha above is (or is not) the audit's: with early stopping, half of it goes
        to the anytime-valid tests that stop an audit early and half to Holm, and the budget is
        planned at Holm's half."""
        split = self.split
        if split is None:
            return []
        if split.stop_early:
            return [f"alpha {self.alpha:g} is half of the audit's alpha {split.alpha:g}: with early stopping on (the "
                    f"default), the other half goes to the anytime-valid early-stopping tests (each law's e-value "
                    f"must reach {1 / split.e_share:,.0f}), and the budget is planned for the fixed-budget tests under "
                    f"Holm; --no-stop-early gives Holm all of it"]
        return [f"alpha {self.alpha:g} is the audit's whole alpha: without early stopping, Holm gets all of it"]


def law_detectable_tv(expected: np.ndarray, trials: float, share: float,
                      power: float = POWER) -> float:
    """The TV a pooled chi-square on ``trials`` samples of ``expected`` detects with ``power``."""
    n = int(trials)
    if n <= 0:
        return 1.0
    groups = int(pooling(expected, n).max()) + 1
    return detectable_tv(n, max(groups - 1, 0), share, power)


def needed_trials(expected: np.ndarray, rate: float, eps: float, share: float, power: float,
            cap: int) -> int | None:
    """Fewest trials (within 2%) at which the law, seen on a fraction ``rate`` of them,
    detects ``eps``; None when even ``cap`` trials do not."""
    if rate <= 0 or law_detectable_tv(expected, cap * rate, share, power) > eps:
        return None
    low, high = 1, cap
    while high > low * 1.02 + 1:
        mid = min(max(int(math.sqrt(low * high)), low + 1), high - 1)
        if law_detectable_tv(expected, mid * rate, share, power) <= eps:
            high = mid
        else:
            low = mid
    return high


def trials_to_detect(expected: np.ndarray, eps: float, share: float, cap: int, power: float = POWER) -> int | None:
    """Fewest trials (within 2%) at which a pooled chi-square of a law ``expected`` seen on every
    trial detects TV ``eps`` with ``power`` at its ``share`` of alpha; None when ``cap`` do not."""
    return needed_trials(expected, 1.0, eps, share, power, cap)


def round_up(n: int) -> int:
    """Up to two significant figures, so plans print readably."""
    scale = 10 ** max(int(math.log10(max(n, 1))) - 1, 0)
    return -(-n // scale) * scale
