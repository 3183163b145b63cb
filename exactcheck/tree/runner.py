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
  forbids is a finding whatever the rule (deterministic: spends none of alpha);
- ``properties/tree_row_independence``: under forced draws, a row alone gives what it gave in its batch;
- ``properties/tree_rule_decisions`` (a rule judged): every draw forced just below and above each
  threshold the rule's walk reads (and 1 minus those): the path accepted must be the rule's under
  u or 1 - u.

Trials per world are planned as the step audit plans a law: the fewest that detect the level's TV
(0.05 quick, 0.01 standard) with power 0.9 at the law's share of alpha, up to the level's cap.
"""
from __future__ import annotations

from exactcheck.audit_run import AuditRun
from exactcheck.core import resolve_device, run_environment
from exactcheck.errors import SubjectError, UsageError
from exactcheck.subject_call import call_time_limit
from exactcheck.options import AuditOptions, CheckKind, PseudoWorld, derive_seed
from exactcheck.tree.result import TreeAuditResult
from exactcheck.tree.reproduce import tree_audit_line
from exactcheck.tree.drive import drive_tree
from exactcheck.tree.plan import judged_tree_rule, plan_tree_audit
from exactcheck.tree.properties import TREE_PROPERTIES
from exactcheck.tree.verdicts import tree_verdicts

__all__ = ["run_tree_audit"]


def run_tree_audit(subject, *, options: AuditOptions | None = None, subject_name: str | None = None,
                   progress: bool = True, **settings) -> TreeAuditResult:
    """Audit a tree verifier (``exactcheck.contracts.tree_verifier``) on the tree worlds of its sibling mode.
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
    rule = judged_tree_rule(subject, options)
    name = subject_name or getattr(subject, "__name__", type(subject).__name__)

    def reproduce(world: str) -> str:
        return tree_audit_line(options, name, world, by_command=bool(subject_name))

    run = AuditRun(plan.checks, plan.budget, options.seed, reproduce, progress=progress)
    run.planned = sum(trials.values())
    bar = run.bar(run.planned, unit="trial", desc="exactcheck: tree trials")
    with run.interruptible():
        for w in plan.worlds:
            world_seed = derive_seed(options.seed, w.name)
            base = dict(world=w.name, seed=world_seed, reproduce=reproduce(w.name))
            try:
                samples = drive_tree(subject, w, trials[w.name], world_seed, device=device)
            except SubjectError as exc:
                run.crashed(exc, world=w.name, seed=world_seed, samples=trials[w.name], condition="every verify call")
                continue
            bar.step(w.name, samples.size)
            run.drawn += samples.size
            run.extend(tree_verdicts(samples, rule, plan.budget.first_share, plan.budget.alpha, base))
        for check in plan.checks:
            if check.kind is CheckKind.PROPERTY:
                run.add(TREE_PROPERTIES[check.law](subject, device, derive_seed(options.seed, check.name),
                                                   reproduce(PseudoWorld.PROPERTIES.value), rule))
    return run.finish(TreeAuditResult, subject=name, level=options.level.value, seed=options.seed,
                      alpha=plan.budget.alpha, device=str(device), environment=run_environment(),
                      require=options.require)
