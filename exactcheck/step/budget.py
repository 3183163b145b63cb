"""The step audit's budget over its worlds: for every step and context world, the fewest trials at
which each of its laws (``exactcheck.step.laws.planned_laws``) detects the target TV at its Holm
share (``exactcheck.stats.planning`` does the arithmetic on laws as data)."""
from __future__ import annotations

import functools

from exactcheck.options import Level
from exactcheck.rules import RuleSpec
from exactcheck.stats.goodness_of_fit import POWER
from exactcheck.stats.planning import (MIN_SAMPLES, BudgetPlan, LawBudget, WorldBudget, law_detectable_tv,
                                       needed_trials, round_up)
from exactcheck.step.laws import planned_laws
from toy_models import ContextWorld, StepWorld
from toy_models.suite import default_worlds

__all__ = ["plan_budget", "default_plan"]


def plan_budget(worlds: list[StepWorld | ContextWorld], detect_tv: float, alpha: float,
                power: float = POWER, max_samples: int = Level.RELEASE.max_samples,
                checks: int | None = None, min_samples: int = MIN_SAMPLES,
                rule: RuleSpec | None = None) -> BudgetPlan:
    """Trials per world so that each law detects ``detect_tv`` with ``power`` at its Holm share.

    ``checks`` is the number of statistical checks alpha is split over; by default the laws the
    worlds would check at ``max_samples`` (the most there can be, so the share is conservative)."""
    if not 0 < detect_tv <= 1:
        raise ValueError(f"detect_tv ({detect_tv}) must be in (0, 1]")
    laws_at_cap = {w.name: planned_laws(w, max_samples, rule) for w in worlds}
    m = checks if checks is not None else sum(len(v) for v in laws_at_cap.values())
    share = alpha / max(m, 1)
    out = []
    for world in worlds:
        rows = []
        for law in laws_at_cap[world.name]:
            rate = law.condition_probability
            rows.append((law, rate, needed_trials(law.expected, rate, detect_tv, share, power, max_samples)))
        # A law that cannot reach the target within the cap gets the cap: as close as allowed.
        wanted = [max_samples if needed is None else needed for _, _, needed in rows]
        samples = min(max_samples, round_up(max([min_samples, *wanted])))
        # Laws checked at the planned size (conditional laws may drop out when rare).
        kept = {law.law for law in planned_laws(world, samples, rule)}
        out.append(WorldBudget(world.name, samples, tuple(
            LawBudget(world.name, law.law, law.condition, rate, law.expected.size, needed,
                      law_detectable_tv(law.expected, samples * rate, share, power))
            for law, rate, needed in rows if law.law in kept)))
    return BudgetPlan(detect_tv, alpha, power, m, max_samples, min_samples, tuple(out))


@functools.lru_cache(maxsize=16)
def default_plan(detect_tv: float, alpha: float, max_samples: int, min_samples: int = MIN_SAMPLES,
                 rule: RuleSpec | None = None, checks: int | None = None) -> BudgetPlan:
    """The plan over every built-in world (what an audit uses, whichever worlds it runs), at the
    share alpha / ``checks`` (``exactcheck.step.plan.alpha_budget`` gives the audit's family)."""
    return plan_budget(default_worlds(), detect_tv, alpha, max_samples=max_samples, checks=checks,
                       min_samples=min(min_samples, max_samples), rule=rule)
