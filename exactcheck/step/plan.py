"""The plan of a step-level verifier audit: which checks run, on how many trials, under which
share of alpha (``exactcheck.options.AuditPlan``).

The alpha family is fixed by the options, not by the worlds chosen: every law of every built-in
world at the level's cap plus the chain-rule tests of every large world. The planner sizes each
world's budget at that family's first Holm share and Holm runs over that family (the members an
audit does not run count as p = 1), so a world audited alone draws the same trials, is judged at
the same share and gives the same statistics as in the whole audit, and the detectable TV the plan
states is the one the tests deliver for any ``--world`` set.
"""
from __future__ import annotations

from dataclasses import replace

from exactcheck.errors import UsageError
from exactcheck.options import AlphaBudget, AuditOptions, AuditPlan, Check, CheckKind, PseudoWorld
from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS
from exactcheck.step.laws import planned_laws
from exactcheck.stats.planning import BudgetPlan
from exactcheck.step.budget import default_plan
from exactcheck.rules import RuleSpec, rule_spec
from exactcheck.step.properties import PROPERTIES
from toy_models.suite import default_worlds, large_worlds

__all__ = ["alpha_budget", "budget_plan", "plan_step_audit", "planned_checks", "judged_rule", "fit_to_seconds",
           "LAW_SHARE", "MIN_FITTED_TRIALS"]

# under ``max_seconds``: the share of the budget the laws' trials are planned to take (the rest is
# for the property search, the invalid-input probe and the speed measurement itself), and the
# fewest trials a world is cut to
LAW_SHARE = 0.6
MIN_FITTED_TRIALS = 200


def judged_rule(options: AuditOptions) -> RuleSpec | None:
    """The rule the subject is judged by (``AuditOptions.acceptance_rule``), or None: undeclared,
    judged against every registered exact rule."""
    return None if options.acceptance_rule is None else rule_spec(options.acceptance_rule)


def alpha_budget(options: AuditOptions) -> AlphaBudget:
    """The alpha split of every step audit with these options: the family is every law of every
    built-in world at the level's cap (the most there can be) and every large world's chain-rule
    tests."""
    rule = judged_rule(options)
    laws = sum(len(planned_laws(world, options.cap, rule)) for world in default_worlds())
    return AlphaBudget(options.alpha, laws + len(large_worlds()) * len(CHAIN_RULE_TESTS), options.stop_early)


def budget_plan(options: AuditOptions) -> BudgetPlan:
    """The trials each built-in world gets (``exactcheck.stats.planning.BudgetPlan``), sized at
    the first Holm share of ``alpha_budget``; planned on every built-in world, so a world's budget
    (and its samples) is the same when it is audited alone. The plan carries the split, so its
    text names both alphas: the audit's, and the Holm half it is planned at under early stopping."""
    budget = alpha_budget(options)
    return replace(default_plan(options.target_tv, budget.holm_alpha, options.cap, options.level.min_samples,
                                judged_rule(options), budget.checks), split=budget)


def fit_to_seconds(samples: dict[str, int], seconds_per_trial: dict[str, float], seconds: float) -> dict[str, int]:
    """Each world's trials cut by one factor so that, at the measured ``seconds_per_trial``, all
    of them take at most ``seconds`` (never below ``MIN_FITTED_TRIALS``, never above the plan)."""
    needed = sum(n * seconds_per_trial[w] for w, n in samples.items())
    factor = min(1.0, seconds / needed) if needed > 0 else 1.0
    return {w: n if factor >= 1 else min(n, max(MIN_FITTED_TRIALS, int(n * factor))) for w, n in samples.items()}


def plan_step_audit(options: AuditOptions, seconds_per_trial: dict[str, float] | None = None,
                    law_seconds: float | None = None) -> AuditPlan:
    """The laws of every chosen world at its planned budget, the chain-rule tests of named large
    worlds, the properties, the invalid-input probe. With ``options.max_seconds`` and the
    subject's measured ``seconds_per_trial`` per world, each world's budget is cut to fit
    ``law_seconds`` (default: ``LAW_SHARE`` of it; ``fit_to_seconds``); the laws are planned at the
    trials that remain."""
    properties, inputs = PseudoWorld.PROPERTIES.value, PseudoWorld.INPUTS.value
    chosen, chains, searched = default_worlds(), [], list(PROPERTIES) if options.properties else []
    probe = options.properties
    if options.worlds:
        large = large_worlds()
        known = ([w.name for w in chosen] + [w.name for w in large] + [properties, inputs]
                 + [f"{properties}/{p}" for p in PROPERTIES])
        unknown = set(options.worlds) - set(known)
        if unknown:
            raise UsageError(f"unknown world(s) {sorted(unknown)}; known: {known}")
        chosen = [w for w in chosen if w.name in options.worlds]
        chains = [w for w in large if w.name in options.worlds]
        searched = [p for p in searched if f"{properties}/{p}" in options.worlds or properties in options.worlds]
        probe = probe and inputs in options.worlds
    plan = budget_plan(options)
    rule = judged_rule(options)
    checks, samples, laws = [], [], []
    trials = {world.name: plan.samples(world.name) for world in chosen}
    if options.max_seconds is not None and seconds_per_trial is not None:
        seconds = LAW_SHARE * options.max_seconds if law_seconds is None else law_seconds
        trials = fit_to_seconds(trials, seconds_per_trial, seconds)
    for world, n in options.trials or ():
        if world not in trials and world not in [w.name for w in default_worlds()]:
            raise UsageError(f"trials: unknown world {world!r}; known: {[w.name for w in default_worlds()]}")
        if world in trials:
            trials[world] = n
    for world in chosen:
        n = trials[world.name]
        samples.append((world.name, n))
        laws.append((world.name, tuple(planned_laws(world, n, rule))))
        checks += [Check(f"{world.name}/{law.law}", CheckKind.LAW, world.name, law.law) for law in laws[-1][1]]
    for world in chains:
        samples.append((world.name, options.level.chain_sequences))
        checks += [Check(f"{world.name}/{test}", CheckKind.CHAIN_RULE, world.name, test) for test in CHAIN_RULE_TESTS]
    checks += [Check(f"{properties}/{p}", CheckKind.PROPERTY, properties, p) for p in searched]
    if probe:
        checks.append(Check(f"{inputs}/invalid", CheckKind.INPUTS, inputs, "invalid"))
    return AuditPlan(options, tuple(checks), alpha_budget(options), tuple(samples), worlds=(*chosen, *chains),
                     laws=tuple(laws))


def planned_checks(**settings) -> list[str]:
    """The names of the checks a step audit with these settings reports, in its order, without
    running anything. A world on which the subject crashes or breaks the contract is reported by
    one ``WORLD/contract`` verdict in place of its laws."""
    return plan_step_audit(AuditOptions.build(**settings)).names
