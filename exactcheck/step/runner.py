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
from exactcheck.report.result import AuditResult, StepAuditResult
from exactcheck.report.verdict import Verdict
from exactcheck.reproduce import replay_line, step_audit_line
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
    ``MIN_PROPERTY_SECONDS``, and stop at their deadlines."""
    options, budget = audit_plan.options, audit_plan.budget
    level, seed, stop_early = options.level, options.seed, options.stop_early
    name = subject_name or getattr(subject, "__name__", None) or type(subject).__name__
    kinds = {c.world: c.kind for c in audit_plan.checks}
    chains = [w for w in audit_plan.worlds if kinds.get(w.name) is CheckKind.CHAIN_RULE]
    searched = [c.law for c in audit_plan.checks if c.kind is CheckKind.PROPERTY]
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
    threshold = budget.log_e_threshold

    by_command = ":" in name or builtin_verifiers().get(name) is subject  # the command names it as it is

    def reproduce(world: str) -> str:
        return step_audit_line(options, name, world, by_command)

    audit = AuditRun(audit_plan.checks, budget, seed, reproduce, progress=progress)

    properties = PseudoWorld.PROPERTIES.value
    rule = judged_rule(options)

    def gating(verdict: Verdict) -> bool:
        return verdict.outcome.failed and verdict.category.value in options.require

    def search_properties(checks_bar: Progress, stop_at_finding: bool = False) -> list[Verdict]:
        """Each planned property's verdict; with ``stop_at_finding``, the searches after the first
        that fails the audit are not run (inconclusive verdicts that say so). With worker processes
        (``--jobs``, no time budget) every search starts at once, and their verdicts are taken in
        order, so the serial run's."""
        found: list[Verdict] = []
        parallel = {}
        if hasattr(executor, "search") and until is None:
            parallel = {prop: executor.search(prop, level.property_examples,
                                              derive_seed(seed, f"{properties}/{prop}"), device)
                        for prop in searched}
        for index, prop in enumerate(searched):
            stopper = next((v.check for v in found if gating(v)), None) if stop_at_finding else None
            if stopper:
                check = next(c for c in audit_plan.checks if c.name == f"{properties}/{prop}")
                found.append(not_run_verdict(check, seed, reproduce(check.name),
                                             f"not run: the audit stopped on a defect at {stopper} before this search"))
                checks_bar.step(check.name)
                continue
            prop_seed = derive_seed(seed, f"{properties}/{prop}")
            deadline = None
            if until is not None:  # an even share of the time left, for each property still to search
                now = time.perf_counter()
                deadline = now + max(MIN_PROPERTY_SECONDS, (until - now) / (len(searched) - index))
            result = (parallel[prop]() if prop in parallel else
                      search(subject, prop, level.property_examples, prop_seed, device, rule, deadline))
            line = reproduce(f"{properties}/{prop}")
            found.append(property_verdict(result, name, prop_seed, line, options.rule,
                                          replay_line(f"{properties}/{prop}", name, level.value, seed, line)))
            checks_bar.step(f"{properties}/{prop}")
        return found

    # ``properties_first`` under early stopping (and no time budget, whose share the laws take
    # first): every law gets one look, at ``FIRST_LOOK_SHARE`` of its world's budget (a law off on
    # every call is the finding a user meets first, and it stops the audit there); then the
    # property searches run, and the first counterexample that fails the audit stops it: the
    # searches after it and the rest of the law phase are not run. With no finding, the laws go on.
    first_look = bool(options.properties_first and stop_early and until is None and searched)
    searched_first: list[Verdict] = []
    certain: str | None = None  # the check whose finding stopped the audit before the rest of its trials
    if first_look:
        for run in runs:
            run.batches = first_look_schedule(run.budget, FIRST_LOOK_SHARE)
    bar = audit.bar(sum(r.budget for r in runs), unit="trial", desc="exactcheck: laws")

    evident: tuple[WorldRun, int] | None = None  # (world, law index) whose e-process crossed
    executor = executor or LocalExecutor()
    shards = options.shards

    def draw_batches(indices) -> None:
        """The laws' batches ``indices``, each world's in turn, until one is evident."""
        nonlocal evident
        for batch_index in indices:
            # every live world's shards of this batch go out at once; their counts come back and
            # are merged, in world order, before the look (a sharded batch is one batch)
            live = [r for r in runs if not r.finished and batch_index < len(r.batches)]
            if not live:
                break
            calls = []
            for run in live:
                batch_seed = run.seed if not stop_early else derive_seed(run.seed, f"batch/{batch_index}")
                calls.append([(subject, run.world, run.plans, size, shard_seed(batch_seed, j, shards), str(device),
                               options.max_elements)
                              for j, size in enumerate(split(run.batches[batch_index], shards))])
            results = iter(executor.submit(shard_counts, [call for shard_calls in calls for call in shard_calls]))
            for run, shard_calls in zip(live, calls):
                shard_results = [next(results) for _ in shard_calls]
                if evident:
                    continue  # the audit stopped: this batch's shards are not counted
                size = run.batches[batch_index]
                counted = [result() for result in shard_results]
                failure = next((c for c in counted if isinstance(c, Exception)), None)
                if failure is not None:
                    run.failure = drive_failure(failure, run, size, reproduce(run.world.name))
                    bar.step(run.world.name, run.budget - run.drawn)
                    if stop_early and run.failure.outcome.failed:
                        evident = (run, -1)
                    continue
                run.drawn += size
                for i, processes in enumerate(run.processes):
                    run.counts[i] += sum(c[i] for c in counted)
                    # intersection-union: a law with alternatives is evident when every one is
                    if processes is not None and run.look(i) >= threshold and not evident:
                        evident = (run, i)
                bar.step(run.world.name, size)
            if evident:
                break

    batches = max((len(r.batches) for r in runs), default=0)
    with audit.interruptible():
        if first_look:
            draw_batches([0])
    if first_look and not (evident or audit.interrupted):
        first_bar = audit.bar(len(searched), unit="check", desc="exactcheck: properties")
        with audit.interruptible():
            searched_first = search_properties(first_bar, stop_at_finding=True)
        first_bar.close()
        certain = next((v.check for v in searched_first if gating(v)), None)
    elif first_look and evident:  # a law stopped the audit at its first look: no search is run
        run, i = evident
        stopper = run.failure.check if i < 0 else f"{run.world.name}/{run.plans[i].law}"
        searched_first = [not_run_verdict(c, seed, reproduce(c.name),
                                          f"not run: the audit stopped on a defect at {stopper} before this search")
                          for c in audit_plan.checks if c.kind is CheckKind.PROPERTY]
    with audit.interruptible():
        if not (certain or audit.interrupted or evident):
            draw_batches(range(1 if first_look else 0, batches))
    bar.close()
    bar = audit.bar(len(chains) + (0 if searched_first else len(searched)) + bool(searched), unit="check",
                   desc="exactcheck: checks")

    stopped = certain
    if evident:
        run, i = evident
        stopped = run.failure.check if i < 0 else f"{run.world.name}/{run.plans[i].law}"
    for run in runs:
        if run.failure is not None:
            audit.add(run.failure)
            continue
        audit.extend(law_verdict(run, i, reproduce(run.world.name), budget, stopped, audit.interrupted)
                    for i in range(len(run.plans)))
    audit.extend(searched_first)
    with audit.interruptible():
        for world in chains if not audit.interrupted else ():
            audit.extend(chain_verdicts(subject, world, level.chain_sequences, derive_seed(seed, world.name),
                                       device, reproduce(world.name), stopped is not None, rule))
            bar.step(world.name)

        if searched and not searched_first and not audit.interrupted:
            audit.extend(search_properties(bar))

        if any(c.kind is CheckKind.INPUTS for c in audit_plan.checks) and not audit.interrupted:
            audit.add(inputs_verdict(subject, seed, reproduce(PseudoWorld.INPUTS.value), device))
            bar.step(PseudoWorld.INPUTS.value)
    audit.planned, audit.drawn = sum(r.budget for r in runs), sum(r.drawn for r in runs)
    result = audit.finish(
        StepAuditResult, subject=name, level=level.value, seed=seed, alpha=budget.alpha, device=str(device),
        environment=run_environment(), detect_tv=options.target_tv, stop_early=stop_early,
        stopped_early_at=stopped, require=options.require, call_elements=options.max_elements,
        rule=options.acceptance_rule, max_seconds=options.max_seconds, trials=options.trials)
    return replace(result, rule_note=rule_note(result.verdicts, rule, audit_plan.laws))
