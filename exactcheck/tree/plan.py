"""The plan of a tree audit (``exactcheck.options.AuditPlan``): the tree worlds of the subject's
sibling mode, their laws (exactness: ``sequence``, ``first_token``; conformance: ``step_law@RULE``
for the rule the user names or the subject declares), the forced-value properties
(``exactcheck.tree.properties.TREE_PROPERTIES``: boundary coins and row independence always, the
rule's decisions where a rule is judged; they spend none of alpha), the alpha budget and the trials
per world (the fewest that detect the level's TV with power 0.9 at the law's share
of alpha, up to the level's cap).
"""
from __future__ import annotations

from exactcheck.errors import UsageError
from exactcheck.options import AlphaBudget, AuditOptions, AuditPlan, Check, CheckKind, PseudoWorld
from exactcheck.stats.planning import trials_to_detect
from exactcheck.contracts.tree_verifier import sibling_sampling
from exactcheck.tree.laws import RULE_SIBLINGS
from exactcheck.tree.properties import RULE_TREE_PROPERTIES, TREE_PROPERTIES
from toy_models.tree_worlds import TreeWorld, tree_worlds

__all__ = ["plan_tree_audit", "tree_worlds_for", "judged_tree_rule", "MIN_TRIALS"]

MIN_TRIALS = 2_000


def tree_worlds_for(subject) -> list[TreeWorld]:
    """The built-in tree worlds whose siblings are drawn as ``subject`` declares; only the greedy
    ones for a subject that verifies greedily (``greedy = True``)."""
    mode = sibling_sampling(subject)
    greedy_only = bool(getattr(subject, "greedy", False))
    return [w for w in tree_worlds() if w.siblings == mode and (w.greedy or not greedy_only)]


def judged_tree_rule(subject, options: AuditOptions) -> str | None:
    """The tree rule the subject is judged by: the one the user names (``--rule``), else the one it
    declares (``tree_rule``), else none (exactness alone)."""
    rule = options.tree_rule or getattr(subject, "tree_rule", None)
    if rule is not None and rule not in RULE_SIBLINGS:
        raise UsageError(f"tree rule {rule!r} is not a registered tree rule; known: {sorted(RULE_SIBLINGS)}")
    if options.tree_rule and RULE_SIBLINGS[rule] != sibling_sampling(subject):
        raise UsageError(f"tree rule {rule!r} is exact for {RULE_SIBLINGS[rule]} siblings; the subject declares "
                         f"{sibling_sampling(subject)} (sibling_sampling)")
    return rule


def plan_tree_audit(subject, options: AuditOptions) -> tuple[AuditPlan, dict[str, int]]:
    """The checks, alpha budget and trials per world of an audit of ``subject``."""
    worlds = tree_worlds_for(subject)
    properties = PseudoWorld.PROPERTIES.value
    searched = options.properties and (not options.worlds or properties in options.worlds)
    if options.worlds:
        known = {w.name for w in worlds}
        unknown = set(options.worlds) - known - {properties}
        if unknown:
            raise UsageError(f"unknown tree world(s) {sorted(unknown)} for {sibling_sampling(subject)} siblings; "
                             f"known: {sorted(known | {properties})}")
        worlds = [w for w in worlds if w.name in options.worlds]
    rule = judged_tree_rule(subject, options)
    checks = []
    for w in worlds:
        checks += [Check(f"{w.name}/sequence", CheckKind.LAW, w.name, "sequence"),
                   Check(f"{w.name}/first_token", CheckKind.LAW, w.name, "first_token")]
        if rule is not None and RULE_SIBLINGS[rule] == w.siblings:
            checks.append(Check(f"{w.name}/step_law@{rule}", CheckKind.LAW, w.name, f"step_law@{rule}"))
    budget = AlphaBudget(options.alpha, len(checks), stop_early=False)
    if searched:  # deterministic: spends none of alpha
        checks += [Check(f"{properties}/{name}", CheckKind.PROPERTY, properties, name) for name in TREE_PROPERTIES
                   if rule is not None or name not in RULE_TREE_PROPERTIES]
    trials = {}
    for w in worlds:
        needed = trials_to_detect(w.sequence_law(), options.target_tv, budget.first_share, options.cap)
        trials[w.name] = int(min(options.cap, max(MIN_TRIALS, needed or options.cap)))  # a cap given wins
    return AuditPlan(options, tuple(checks), budget, tuple(trials.items()), worlds=tuple(worlds)), trials


