"""The audit of a tree verifier: exactness by the output law, conformance by its declared rule.

Per tree world whose siblings are drawn as the subject declares (``sibling_sampling``):

- ``sequence``: trials through the speculative loop (``exactcheck.tree.drive``) against the
  target's exact float64 law of the first ``length`` tokens, and its ``first_token`` marginal
  (pooled Pearson, Holm over the audit at alpha): **exactness**, whatever the rule;
- ``step_law@RULE`` (a subject that declares ``tree_rule``): each trial's first verify call's
  emitted tuple against the rule's exact step law (``exactcheck.tree.laws.step_law``):
  **conformance**;
- a crash or a broken contract on a world: one ``WORLD/contract`` verdict in place of its laws;
- ``properties/tree_no_forbidden_token``: every draw of a call forced to 0 and to 1 - ulp on an
  edge corpus of trees and on generated ones (``exactcheck.tree.properties``): a token the target
  forbids is a finding whatever the rule (deterministic: spends none of alpha).

Trials per world are planned as the step audit plans a law: the fewest that detect the level's TV
(0.05 quick, 0.01 standard) with power 0.9 at the law's share of alpha, up to the level's cap.
"""
from __future__ import annotations

import datetime as _dt
import time

import numpy as np

from exactcheck.core import (STATISTIC_NAME, apply_holm, deviating_cells, failure_verdict, keep_plots_where_needed,
                             plot_cells, resolve_device, run_environment)
from exactcheck.errors import SubjectError, UsageError
from exactcheck.subject_call import call_time_limit
from exactcheck.options import (AlphaBudget, AuditOptions, AuditPlan, Category, Check, CheckKind, PseudoWorld,
                                derive_seed)
from exactcheck.progress import Progress
from exactcheck.report.result import TreeAuditResult
from exactcheck.report.verdict import Evidence, LawEvidence, Outcome, TotalVariation, Verdict
from exactcheck.reproduce import tree_audit_line
from exactcheck.stats.goodness_of_fit import goodness_of_fit, tv_certificate
from exactcheck.stats.laws import LawComparison, LawPlan
from exactcheck.stats.planning import trials_to_detect
from exactcheck.tree.contract import sibling_sampling
from exactcheck.tree.drive import TreeSamples, drive_tree
from exactcheck.tree.laws import RULE_SIBLINGS, step_law
from exactcheck.tree.properties import TREE_PROPERTY, tree_boundary_verdict
from toy_models.tree_worlds import TreeWorld, tree_worlds

__all__ = ["run_tree_audit", "plan_tree_audit", "tree_worlds_for"]

MIN_TRIALS = 2_000


def tree_worlds_for(subject) -> list[TreeWorld]:
    """The built-in tree worlds whose siblings are drawn as ``subject`` declares; only the greedy
    ones for a subject that verifies greedily (``greedy = True``)."""
    mode = sibling_sampling(subject)
    greedy_only = bool(getattr(subject, "greedy", False))
    return [w for w in tree_worlds() if w.siblings == mode and (w.greedy or not greedy_only)]


def _rule(subject, options: AuditOptions) -> str | None:
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
    rule = _rule(subject, options)
    checks = []
    for w in worlds:
        checks += [Check(f"{w.name}/sequence", CheckKind.LAW, w.name, "sequence"),
                   Check(f"{w.name}/first_token", CheckKind.LAW, w.name, "first_token")]
        if rule is not None and RULE_SIBLINGS[rule] == w.siblings:
            checks.append(Check(f"{w.name}/step_law@{rule}", CheckKind.LAW, w.name, f"step_law@{rule}"))
    budget = AlphaBudget(options.alpha, len(checks), stop_early=False)
    if searched:  # deterministic: spends none of alpha
        checks.append(Check(f"{properties}/{TREE_PROPERTY}", CheckKind.PROPERTY, properties, TREE_PROPERTY))
    trials = {}
    for w in worlds:
        needed = trials_to_detect(w.sequence_law(), options.target_tv, budget.first_share, options.cap)
        trials[w.name] = int(min(options.cap, max(MIN_TRIALS, needed or options.cap)))  # a cap given wins
    return AuditPlan(options, tuple(checks), budget, tuple(trials.items()), worlds=tuple(worlds)), trials


def _codes(sequences: np.ndarray, vocab: int) -> np.ndarray:
    codes = np.zeros(sequences.shape[0], dtype=np.int64)
    for j in range(sequences.shape[1]):
        codes = codes * vocab + sequences[:, j]
    return codes


def _law_verdict(name: str, law: str, condition: str, expected: np.ndarray, observed: np.ndarray, label, share: float,
                 alpha: float, base: dict, category: Category = Category.EXACTNESS) -> Verdict:
    # cells of probability 0 (a greedy world's law is one cell) are merged into one "other" cell, as
    # the end-to-end laws do, so the TV interval is not widened by thousands of empty cells
    support = np.flatnonzero(expected > 0)
    if support.size < expected.size:
        position = np.full(expected.size, support.size, dtype=np.int64)
        position[support] = np.arange(support.size)
        observed = position[observed]
        expected = np.concatenate([expected[support], [0.0]])
        old_label = label
        label = lambda i: old_label(int(support[i])) if i < support.size else "any outcome of probability 0"  # noqa: E731
    counts = np.bincount(observed, minlength=expected.size).astype(np.int64)
    gof = goodness_of_fit(counts, expected, share)
    comparison = LawComparison(LawPlan(law, condition, expected, label), counts)
    summary = (f"{gof.impossible:,} trials fell on outcomes of exact probability 0; TV {gof.tv_estimate:.4f}"
               if gof.impossible else f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}")
    return Verdict(outcome=Outcome.EXACT, summary=summary, check=f"{name}/{law}", law=law, condition=condition,
                   samples=gof.samples, kind=CheckKind.LAW, category=category, **base, evidence=LawEvidence(
                       Evidence.DETERMINISTIC if gof.impossible else Evidence.FIXED_BUDGET,
                       statistic=None if gof.impossible else gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
                       pvalue=gof.pvalue, tv=TotalVariation(gof.tv_estimate, gof.tv_interval, gof.detectable_tv),
                       certificate=tv_certificate(counts, expected, alpha),
                       cells=deviating_cells(comparison, gof.samples), law_cells=plot_cells(comparison, gof.samples)))


def tree_verdicts(samples: TreeSamples, rule: str | None, share: float, alpha: float, base: dict) -> list[Verdict]:
    """The law verdicts of one world's trials (before Holm)."""
    w = samples.world
    vocab, length = w.vocab_size, w.length
    seq = samples.sequences.numpy()
    law = w.sequence_law()
    verdicts = [
        _law_verdict(w.name, "sequence", f"whole sequences of {length} tokens through the loop", law,
                     _codes(seq, vocab), lambda i: str([int(x) for x in np.unravel_index(i, (vocab,) * length)]),
                     share, alpha, base),
        _law_verdict(w.name, "first_token", "first token of every trial", law.reshape(vocab, -1).sum(1), seq[:, 0],
                     lambda i: f"token {i}", share, alpha, base)]
    if rule is not None and RULE_SIBLINGS[rule] == w.siblings:
        step = step_law(w, w.world.prompt_state, rule)
        outcomes = sorted(step)
        index = {o: i for i, o in enumerate(outcomes)}
        observed = np.array([index.get(o, len(outcomes)) for o in samples.first_steps], dtype=np.int64)
        verdicts.append(_law_verdict(
            w.name, f"step_law@{rule}", f"the first verify call's emitted tokens, rule {rule}",
            np.array([step[o] for o in outcomes] + [0.0]), observed,
            lambda i: str(list(outcomes[i])) if i < len(outcomes) else "any other", share, alpha, base,
            Category.CONFORMANCE))
    return verdicts


def run_tree_audit(subject, *, options: AuditOptions | None = None, subject_name: str | None = None,
                   progress: bool = True, **settings) -> TreeAuditResult:
    """Audit a tree verifier (``exactcheck.tree.contract``) on the tree worlds of its sibling mode.
    ``subject_name`` is how the ``exactcheck tree`` command names it; given, reproduce lines are
    commands. The device is resolved here, once; the loop below gets the ``torch.device``."""
    options = AuditOptions.of(options, settings)
    if not callable(subject):
        raise UsageError(f"subject ({subject!r}) is not callable")
    device = resolve_device(options.device)
    with call_time_limit(options.call_timeout):  # this audit's calls; a hang trips it once
        return _run_tree_audit(subject, options, device, subject_name, progress)


def _run_tree_audit(subject, options: AuditOptions, device, subject_name, progress) -> TreeAuditResult:
    plan, trials = plan_tree_audit(subject, options)
    rule = _rule(subject, options)
    name = subject_name or getattr(subject, "__name__", type(subject).__name__)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    bar = Progress(sum(trials.values()), unit="trial", desc="exactcheck: tree trials", enabled=progress)
    pending, drawn = [], 0
    for w in plan.worlds:
        world_seed = derive_seed(options.seed, w.name)
        reproduce = tree_audit_line(options, name, w.name, by_command=bool(subject_name))
        base = dict(world=w.name, seed=world_seed, reproduce=reproduce)
        try:
            samples = drive_tree(subject, w, trials[w.name], world_seed, device=device)
        except SubjectError as exc:
            pending.append(failure_verdict(exc, world=w.name, seed=world_seed, reproduce=base["reproduce"],
                                           samples=trials[w.name], condition="every verify call"))
            continue
        bar.step(w.name, samples.size)
        drawn += samples.size
        pending += tree_verdicts(samples, rule, plan.budget.first_share, plan.budget.alpha, base)
    bar.close()
    properties = PseudoWorld.PROPERTIES.value
    if f"{properties}/{TREE_PROPERTY}" in plan.names:
        pending.append(tree_boundary_verdict(subject, device, derive_seed(options.seed, f"{properties}/{TREE_PROPERTY}"),
                                             tree_audit_line(options, name, properties, by_command=bool(subject_name))))
    verdicts = keep_plots_where_needed(apply_holm(pending, plan.budget))
    return TreeAuditResult(subject=name, level=options.level.value, seed=options.seed, alpha=plan.budget.alpha,
                           device=str(device), verdicts=tuple(verdicts), started=started,
                           duration_s=time.perf_counter() - clock, environment=run_environment(),
                           samples_planned=sum(trials.values()), samples_drawn=drawn, require=options.require)
