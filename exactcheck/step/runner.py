"""The step audit: every check of the plan on one step-level verifier, under one false-alarm budget.

world -> drive -> samples -> laws -> statistics -> Holm -> verdicts. Each world is driven once
with its own seed (derived from the root seed and the world's name); every law of that world is
checked on the same samples. Holm's method over the plan's family keeps the probability that an
exact subject gets any defect verdict at most alpha, whatever the dependence between checks.
``exactcheck.step.plan`` decides what runs; ``exactcheck.step.verdicts`` builds each verdict.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from exactcheck.audit_run import AuditRun
from exactcheck.core import not_run_verdict, resolve_device, run_environment
from exactcheck.errors import ContractViolation, SubjectCrashed, UsageError
from exactcheck.executors import Executor, LocalExecutor, shard_seed, split
from exactcheck.memory import device_max_elements
from exactcheck.options import AuditOptions, AuditPlan, CheckKind, PseudoWorld, derive_seed
from exactcheck.progress import Progress
from exactcheck.report.result import AuditResult
from exactcheck.step.result import StepAuditResult
from exactcheck.report.verdict import Verdict
from exactcheck.reproduce import replay_line
from exactcheck.step.reproduce import step_audit_line
from exactcheck.stats.sequential import EProcess, batch_schedule, first_look_schedule
from exactcheck.rules import declared_rule
from exactcheck.contracts.verifier import Verifier
from exactcheck.subject_call import call_time_limit
from exactcheck.step.drive import drive
from exactcheck.step.plan import LAW_SHARE, judged_rule, plan_step_audit
from exactcheck.step.properties import search
from exactcheck.step.subjects import builtin_verifiers
from exactcheck.step.workers import shard_counts
from exactcheck.step.verdicts import (WorldRun, chain_verdicts, drive_failure, inputs_verdict, law_alternatives,
                                      law_verdict, property_verdict, rule_note)

__all__ = ["run_audit", "run_plan", "measure_speed", "PILOT_TRIALS"]


def run_audit(subject: Verifier, *, subject_name: str | None = None, options: AuditOptions | None = None,
              progress: bool = True, executor: Executor | None = None, **settings) -> AuditResult:
    """Audit a step-level verifier on the built-in worlds and return every verdict.

    ``options`` (an ``AuditOptions``), or its fields as keywords: ``level`` (default quick),
    ``seed``, ``alpha``, ``device``, ``worlds``, ``properties``, ``stop_early``, ``detect_tv``,
    ``max_samples``, ``require``, ``shards``, ``call_elements``. ``plan_step_audit`` decides what
    runs and how alpha is split (``exactcheck.step.plan``); this function executes that plan.

    The budget: every world gets the trials its laws need to detect ``detect_tv`` (default: the
    level's) with power 0.9 at their Holm share of alpha, at most ``max_samples`` (default: the
    level's cap); see ``exactcheck.stats.planning``.

    ``stop_early=True`` drives the worlds in growing batches, round robin, and stops the whole
    audit the first time an anytime-valid e-process shows a defect (half of alpha, Bonferroni)
    or a sample lands on an impossible outcome; checks that reach their budget get the
    fixed-budget Pearson test under Holm with the other half. ``stop_early=False`` drives each
    world once to its budget and spends all of alpha on Holm.

    ``properties=False`` skips the deterministic property search (``exactcheck.step.properties``);
    it cannot change the false-alarm rate, which only the statistical checks spend.

    ``require``: the finding categories that fail the audit (exactness always; add
    "reproducible" and/or "input-handling"); findings in other categories are reported only.

    ``shards`` = N > 1 splits every batch of every world into N shards with seeds derived from
    the batch seed, run on ``executor`` (``exactcheck.executors``: this process by default, or Ray
    tasks); their counts are merged before each look, so alpha and early stopping are unchanged
    and the verdicts are the same on every executor."""
    options = AuditOptions.of(options, settings)
    if not callable(subject):
        raise UsageError(f"subject ({subject!r}) is not callable")
    options = judged_by(options, subject)
    with call_time_limit(options.call_timeout):  # this audit's calls; a hang trips it once
        return _run_audit(subject, options, subject_name, progress, executor)


def _run_audit(subject, options: AuditOptions, subject_name, progress, executor) -> AuditResult:
    begun = time.perf_counter()
    device = resolve_device(options.device)
    if options.call_elements == "auto":  # fixed from here on: the report and reproducers name it
        options = replace(options, call_elements=device_max_elements(device))
    if options.max_seconds is not None and options.trials is None:
        # the budget becomes trials per world, fixed from here on: reproduce lines name them
        planned = plan_step_audit(options)
        speeds = measure_speed(subject, planned, device)
        # the laws get their share of the budget less what measuring the speed took
        law_seconds = max(0.0, LAW_SHARE * options.max_seconds - (time.perf_counter() - begun))
        fitted = plan_step_audit(options, speeds, law_seconds)
        options = replace(options, trials=tuple(sorted((w, n) for w, n in fitted.samples
                                                       if planned.world_samples(w) != n)) or None,
                          looks_from_one=False)
    until = None if options.max_seconds is None else begun + options.max_seconds
    workers = None
    if options.jobs > 1:
        if executor is not None or options.shards > 1:
            raise UsageError(f"--jobs {options.jobs} runs the batches in worker processes; shards and executors "
                             "split them another way: give one or the other")
        from exactcheck.step.workers import PlanWorkers
        executor = workers = PlanWorkers(subject, options, options.jobs)
    try:
        return run_plan(subject, plan_step_audit(options), subject_name, device, progress, executor, until)
    finally:
        if workers is not None:
            workers.close()


PILOT_TRIALS = 16  # trials per world that measure a subject's speed under ``max_seconds``
MIN_PROPERTY_SECONDS = 10.0  # under ``max_seconds``: the least time each property search gets
# ``properties_first``: the share of each world's budget its laws see at their first look, before
# any property search (a law off on every call is found there in well under a second)
FIRST_LOOK_SHARE = 1 / 64


def measure_speed(subject, audit_plan: AuditPlan, device) -> dict[str, float]:
    """Seconds per trial of ``subject`` on each law world of the plan: a warm-up call, then
    ``PILOT_TRIALS`` trials timed (their samples are not used: the audit draws its own with its own
    seeds). A world the subject fails on costs nothing here; the audit reports the failure."""
    seconds = {}
    law_worlds = {c.world for c in audit_plan.checks if c.kind is CheckKind.LAW}
    for world_name, _ in audit_plan.samples:
        if world_name not in law_worlds:
            continue
        world = audit_plan.world(world_name)
        seed = derive_seed(audit_plan.options.seed, f"speed/{world_name}")
        try:
            drive(subject, world, 2, seed, device, audit_plan.options.max_elements)  # warm-up
            clock = time.perf_counter()
            drive(subject, world, PILOT_TRIALS, seed + 1, device, audit_plan.options.max_elements)
            seconds[world_name] = (time.perf_counter() - clock) / PILOT_TRIALS
        except (SubjectCrashed, ContractViolation):
            seconds[world_name] = 0.0
    return seconds


def judged_by(options: AuditOptions, subject) -> AuditOptions:
    """The options with the rule the subject is judged by: the one the user names (``rule``), else
    the one the subject declares (``acceptance_rule``), else none (any registered exact rule)."""
    try:
        declared = declared_rule(subject)
    except ValueError as exc:
        raise UsageError(f"the subject's acceptance_rule: {exc}") from None
    rule = options.rule or (declared.label if declared is not None else None)
    return replace(options, acceptance_rule=rule)


def run_plan(subject: Verifier, audit_plan: AuditPlan, subject_name: str | None = None,
             device: torch.device = torch.device("cpu"), progress: bool = True,
             executor: Executor | None = None, until: float | None = None) -> AuditResult:
    """Execute a step-audit plan (``exactcheck.step.plan.plan_step_audit``) on ``subject`` on
    ``device`` (resolved once by ``run_audit``). ``until`` (a ``time.perf_counter`` value, from
    ``max_seconds``): the property searches share the time left, each at least
    ``MIN_PROPERTY_SECONDS``, and stop at their deadlines.

    Four steps: plan (each law world's run, the audit's bookkeeping), drive (the laws' batches,
    with the property searches first under ``properties_first``), judge (the law verdicts, then
    the chain-rule worlds, the property searches and the input checks), finish (Holm, the result)."""
    run = _PlanRun(subject, audit_plan, subject_name, device, progress, executor, until)
    run.drive()
    run.judge()
    return run.finish()


def _world_runs(audit_plan: AuditPlan, kinds: dict) -> list[WorldRun]:
    """One ``WorldRun`` per law world of the plan, in the plan's order: its seed, its budget, its
    looks (one at the budget without early stopping) and, under early stopping, its e-processes."""
    options, seed, stop_early = audit_plan.options, audit_plan.options.seed, audit_plan.options.stop_early
    runs = []
    for world_name, n in audit_plan.samples:
        if kinds.get(world_name) is not CheckKind.LAW:
            continue
        world = audit_plan.world(world_name)
        plans = list(audit_plan.world_laws(world_name))
        runs.append(WorldRun(
            # under a time budget (a slow subject, each call costly) the looks start at the first share
            world, derive_seed(seed, world.name), n, plans,
            batch_schedule(n, from_one=options.looks_from_one) if stop_early else [n],
            [np.zeros(p.expected.size, dtype=np.int64) for p in plans],
            [[EProcess(expected, n * p.condition_probability, p.groupings) for _, expected in law_alternatives(p)]
             if stop_early else None for p in plans]))
    return runs


class _PlanRun:
    """One execution of a step-audit plan: what it runs (the law worlds' ``WorldRun``s, the
    chain-rule worlds, the property searches) and where it stands (``evident``: the world and law
    index whose e-process crossed, -1 for a failure; ``certain``: the property whose finding
    stopped the audit; ``searched_first``: the verdicts of the searches run before the laws went on)."""

    def __init__(self, subject: Verifier, audit_plan: AuditPlan, subject_name: str | None, device: torch.device,
                 progress: bool, executor: Executor | None, until: float | None):
        self.subject, self.audit_plan, self.device, self.until = subject, audit_plan, device, until
        self.options, self.budget = options, budget = audit_plan.options, audit_plan.budget
        self.level, self.seed, self.stop_early = options.level, options.seed, options.stop_early
        self.name = name = subject_name or getattr(subject, "__name__", None) or type(subject).__name__
        kinds = {c.world: c.kind for c in audit_plan.checks}
        self.chains = [w for w in audit_plan.worlds if kinds.get(w.name) is CheckKind.CHAIN_RULE]
        self.searched = [c.law for c in audit_plan.checks if c.kind is CheckKind.PROPERTY]
        self.runs = _world_runs(audit_plan, kinds)
        self.threshold = budget.log_e_threshold
        self.by_command = ":" in name or builtin_verifiers().get(name) is subject  # the command names it as it is
        self.audit = AuditRun(audit_plan.checks, budget, self.seed, self.reproduce, progress=progress)
        self.rule = judged_rule(options)
        # ``properties_first`` under early stopping (and no time budget, whose share the laws take
        # first): every law gets one look, at ``FIRST_LOOK_SHARE`` of its world's budget (a law off on
        # every call is the finding a user meets first, and it stops the audit there); then the
        # property searches run, and the first counterexample that fails the audit stops it: the
        # searches after it and the rest of the law phase are not run. With no finding, the laws go on.
        self.first_look = bool(options.properties_first and self.stop_early and until is None and self.searched)
        self.searched_first: list[Verdict] = []
        self.certain: str | None = None  # the check whose finding stopped the audit before the rest of its trials
        self.evident: tuple[WorldRun, int] | None = None  # (world, law index) whose e-process crossed
        self.stopped: str | None = None  # the check the audit stopped early at, once judged
        self.executor = executor or LocalExecutor()

    def reproduce(self, world: str) -> str:
        return step_audit_line(self.options, self.name, world, self.by_command)

    def gating(self, verdict: Verdict) -> bool:
        return verdict.outcome.failed and verdict.category.value in self.options.require

    def evident_check(self) -> str:
        """The check whose e-process crossed, or whose world failed (``evident``)."""
        run, i = self.evident
        return run.failure.check if i < 0 else f"{run.world.name}/{run.plans[i].law}"

    # drive

    def drive(self) -> None:
        """The laws' batches, each world's in turn, until one is evident; under ``first_look``
        the first batch, then the property searches, then (with no finding) the rest."""
        audit, runs, first_look = self.audit, self.runs, self.first_look
        if first_look:
            for run in runs:
                run.batches = first_look_schedule(run.budget, FIRST_LOOK_SHARE)
        bar = audit.bar(sum(r.budget for r in runs), unit="trial", desc="exactcheck: laws")
        batches = max((len(r.batches) for r in runs), default=0)
        with audit.interruptible():
            if first_look:
                self.draw_batches(bar, [0])
        if first_look and not (self.evident or audit.interrupted):
            self.search_first()
        elif first_look and self.evident:  # a law stopped the audit at its first look: no search is run
            stopper = self.evident_check()
            self.searched_first = [
                not_run_verdict(c, self.seed, self.reproduce(c.name),
                                f"not run: the audit stopped on a defect at {stopper} before this search")
                for c in self.audit_plan.checks if c.kind is CheckKind.PROPERTY]
        with audit.interruptible():
            if not (self.certain or audit.interrupted or self.evident):
                self.draw_batches(bar, range(1 if first_look else 0, batches))
        bar.close()

    def search_first(self) -> None:
        """The property searches between the laws' first look and the rest, stopping at the first
        finding that fails the audit (``certain``)."""
        first_bar = self.audit.bar(len(self.searched), unit="check", desc="exactcheck: properties")
        with self.audit.interruptible():
            self.searched_first = self.search_properties(first_bar, stop_at_finding=True)
        first_bar.close()
        self.certain = next((v.check for v in self.searched_first if self.gating(v)), None)

    def draw_batches(self, bar: Progress, indices) -> None:
        """The laws' batches ``indices``, each world's in turn, until one is evident."""
        for batch_index in indices:
            # every live world's shards of this batch go out at once; their counts come back and
            # are merged, in world order, before the look (a sharded batch is one batch)
            live = [r for r in self.runs if not r.finished and batch_index < len(r.batches)]
            if not live:
                break
            calls = [self.shard_calls(run, batch_index) for run in live]
            results = iter(self.executor.submit(shard_counts, [call for shard_calls in calls for call in shard_calls]))
            for run, shard_calls in zip(live, calls):
                shard_results = [next(results) for _ in shard_calls]
                if self.evident:
                    continue  # the audit stopped: this batch's shards are not counted
                self.count(bar, run, run.batches[batch_index], [result() for result in shard_results])
            if self.evident:
                break

    def shard_calls(self, run: WorldRun, batch_index: int) -> list[tuple]:
        """The ``shard_counts`` calls of one world's batch: one per shard, each with its seed."""
        batch_seed = run.seed if not self.stop_early else derive_seed(run.seed, f"batch/{batch_index}")
        shards = self.options.shards
        return [(self.subject, run.world, run.plans, size, shard_seed(batch_seed, j, shards), str(self.device),
                 self.options.max_elements)
                for j, size in enumerate(split(run.batches[batch_index], shards))]

    def count(self, bar: Progress, run: WorldRun, size: int, counted: list) -> None:
        """Merge one world's batch (its shards' counts, or the failure one of them met), then look."""
        failure = next((c for c in counted if isinstance(c, Exception)), None)
        if failure is not None:
            run.failure = drive_failure(failure, run, size, self.reproduce(run.world.name))
            bar.step(run.world.name, run.budget - run.drawn)
            if self.stop_early and run.failure.outcome.failed:
                self.evident = (run, -1)
            return
        run.drawn += size
        for i, processes in enumerate(run.processes):
            run.counts[i] += sum(c[i] for c in counted)
            # intersection-union: a law with alternatives is evident when every one is
            if processes is not None and run.look(i) >= self.threshold and not self.evident:
                self.evident = (run, i)
        bar.step(run.world.name, size)

    def search_properties(self, checks_bar: Progress, stop_at_finding: bool = False) -> list[Verdict]:
        """Each planned property's verdict; with ``stop_at_finding``, the searches after the first
        that fails the audit are not run (inconclusive verdicts that say so). With worker processes
        (``--jobs``, no time budget) every search starts at once, and their verdicts are taken in
        order, so the serial run's."""
        properties, seed, level, searched = PseudoWorld.PROPERTIES.value, self.seed, self.level, self.searched
        found: list[Verdict] = []
        parallel = {}
        if hasattr(self.executor, "search") and self.until is None:
            parallel = {prop: self.executor.search(prop, level.property_examples,
                                                   derive_seed(seed, f"{properties}/{prop}"), self.device)
                        for prop in searched}
        for index, prop in enumerate(searched):
            stopper = next((v.check for v in found if self.gating(v)), None) if stop_at_finding else None
            if stopper:
                check = next(c for c in self.audit_plan.checks if c.name == f"{properties}/{prop}")
                found.append(not_run_verdict(check, seed, self.reproduce(check.name),
                                             f"not run: the audit stopped on a defect at {stopper} before this search"))
                checks_bar.step(check.name)
                continue
            prop_seed = derive_seed(seed, f"{properties}/{prop}")
            result = (parallel[prop]() if prop in parallel else
                      search(self.subject, prop, level.property_examples, prop_seed, self.device, self.rule,
                             self.deadline(index)))
            line = self.reproduce(f"{properties}/{prop}")
            found.append(property_verdict(result, self.name, prop_seed, line, self.options.rule,
                                          replay_line(f"{properties}/{prop}", self.name, level.value, seed, line)))
            checks_bar.step(f"{properties}/{prop}")
        return found

    def deadline(self, index: int) -> float | None:
        """Under a time budget, the deadline of the ``index``-th property search: an even share of
        the time left for each property still to search, at least ``MIN_PROPERTY_SECONDS``."""
        if self.until is None:
            return None
        now = time.perf_counter()
        return now + max(MIN_PROPERTY_SECONDS, (self.until - now) / (len(self.searched) - index))

    # judge

    def judge(self) -> None:
        """Every verdict, in the plan's order: the law worlds' (or their failures), the searches run
        first, then the chain-rule worlds, the property searches and the input checks."""
        audit, searched = self.audit, self.searched
        bar = audit.bar(len(self.chains) + (0 if self.searched_first else len(searched)) + bool(searched),
                        unit="check", desc="exactcheck: checks")
        self.stopped = self.evident_check() if self.evident else self.certain
        for run in self.runs:
            if run.failure is not None:
                audit.add(run.failure)
                continue
            audit.extend(law_verdict(run, i, self.reproduce(run.world.name), self.budget, self.stopped,
                                     audit.interrupted)
                         for i in range(len(run.plans)))
        audit.extend(self.searched_first)
        with audit.interruptible():
            for world in self.chains if not audit.interrupted else ():
                audit.extend(chain_verdicts(self.subject, world, self.level.chain_sequences,
                                            derive_seed(self.seed, world.name), self.device,
                                            self.reproduce(world.name), self.stopped is not None, self.rule))
                bar.step(world.name)

            if searched and not self.searched_first and not audit.interrupted:
                audit.extend(self.search_properties(bar))

            if any(c.kind is CheckKind.INPUTS for c in self.audit_plan.checks) and not audit.interrupted:
                audit.add(inputs_verdict(self.subject, self.seed, self.reproduce(PseudoWorld.INPUTS.value),
                                         self.device))
                bar.step(PseudoWorld.INPUTS.value)

    # finish

    def finish(self) -> AuditResult:
        """Holm over the plan's statistical checks, and the typed result with the rule's note."""
        audit, options, runs = self.audit, self.options, self.runs
        audit.planned, audit.drawn = sum(r.budget for r in runs), sum(r.drawn for r in runs)
        result = audit.finish(
            StepAuditResult, subject=self.name, level=self.level.value, seed=self.seed, alpha=self.budget.alpha,
            device=str(self.device), environment=run_environment(), detect_tv=options.target_tv,
            stop_early=self.stop_early, stopped_early_at=self.stopped, require=options.require,
            call_elements=options.max_elements, rule=options.acceptance_rule, max_seconds=options.max_seconds,
            trials=options.trials)
        return replace(result, rule_note=rule_note(result.verdicts, self.rule, self.audit_plan.laws))
