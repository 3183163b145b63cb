"""An audit: every check of the suite on one subject, under one false-alarm budget.

world -> drive -> samples -> laws -> statistics -> Holm -> verdicts. Each world is driven once
with its own seed (derived from the root seed and the world's name); every law of that world is
checked on the same samples. Holm's method over all checks keeps the probability that an exact
subject gets any defect verdict at most alpha, whatever the dependence between checks.
"""
from __future__ import annotations

import datetime as _dt
import math
import platform
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from exactcheck import __version__
from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS, chain_rule_tests, drive_chain
from exactcheck.step.contract import Verifier, acceptance_rule
from exactcheck.step.drive import drive
from exactcheck.executors import Executor, LocalExecutor, shard_seed, split
from exactcheck.errors import ContractViolation, SubjectCrashed, UsageError
from exactcheck.step.invalid_inputs import MUST_REFUSE, probe_invalid_inputs
from exactcheck.stats.laws import LawComparison, LawPlan, compare
from exactcheck.stats.sequential import EProcess, batch_schedule
from exactcheck.progress import Progress
from exactcheck.memory import device_max_elements
from exactcheck.stats.goodness_of_fit import GoodnessOfFit, goodness_of_fit, holm, tv_certificate
from exactcheck.step.properties import FORCED_VALUES as FORCED_VALUE_NAMES
from exactcheck.step.properties import PropertyResult, reproducer, search
from exactcheck.reachability import observed_in, structural
from exactcheck.plan import (DEFAULT_ALPHA, DEFAULT_CALL_ELEMENTS, DEFAULT_REQUIRE, AlphaBudget, AuditOptions,
                             AuditPlan, CheckKind, derive_seed, plan_step_audit)
from exactcheck.report.result import AuditResult, StepAuditResult
from exactcheck.report.verdict import Category, CellDeviation, Evidence, Outcome, Verdict
from toy_models import ContextWorld, StepWorld

__all__ = ["AuditResult", "StepAuditResult", "run_audit", "planned_checks", "DEFAULT_ALPHA", "reproducer_path", "DEFAULT_REQUIRE",
           "resolve_device"]
STATISTIC_NAME = "Pearson X^2 (pooled)"
E_STATISTIC_NAME = "log e-value (Dirichlet-mixture likelihood ratio)"


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device; a UsageError (one line, exit 2) if torch cannot use it."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise UsageError(f"device ({device}) is not a torch device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device ({device}) is not available: torch sees no CUDA device")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"device ({device}) is not available: torch sees {torch.cuda.device_count()} CUDA "
                         f"device(s), cuda:0 to cuda:{torch.cuda.device_count() - 1}")
    return device


def _evidence(comparison: LawComparison, n: int, most: int = 8) -> tuple[CellDeviation, ...]:
    expected = comparison.plan.expected * n
    observed = comparison.counts
    score = np.where(expected > 0, np.abs(observed - expected) / np.sqrt(np.maximum(expected, 1e-300)),
                     np.where(observed > 0, np.inf, 0.0))
    top = np.argsort(-score, kind="stable")[:most]
    return tuple(CellDeviation(comparison.plan.label(int(i)), int(observed[i]), float(expected[i]))
                 for i in top if score[i] > 0)


def plot_cells(comparison: LawComparison, n: int, most: int = 32) -> tuple[CellDeviation, ...]:
    """Up to ``most`` cells for an expected-vs-observed plot: the likeliest half and the most
    deviating half, in cell order."""
    expected = comparison.plan.expected * n
    observed = comparison.counts
    deviation = np.abs(observed - expected)
    likeliest = np.argsort(-expected, kind="stable")[:most // 2]
    deviating = np.argsort(-deviation, kind="stable")[:most - len(likeliest)]
    cells = sorted(set(likeliest.tolist()) | set(deviating.tolist()))
    return tuple(CellDeviation(comparison.plan.label(int(i)), int(observed[i]), float(expected[i])) for i in cells)


def keep_plots_where_needed(verdicts: list[Verdict]) -> list[Verdict]:
    """Drop the plot cells of passing checks (accepted-length laws keep theirs)."""
    return [v if v.outcome.failed or v.law == "accepted_length" or not v.law_cells else replace(v, law_cells=())
            for v in verdicts]


def _statistical_summary(gof: GoodnessOfFit) -> str:
    if gof.impossible:
        return f"{gof.impossible:,} samples fell on outcomes of exact probability 0"
    return f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}"


@dataclass
class _WorldRun:
    """One world's progress through its batches."""

    world: StepWorld | ContextWorld
    seed: int
    budget: int
    plans: list[LawPlan]
    batches: list[int]
    counts: list[np.ndarray]
    processes: list[EProcess | None]
    drawn: int = 0
    failure: Verdict | None = None

    @property
    def finished(self) -> bool:
        return self.failure is not None or self.drawn >= self.budget


def run_audit(subject: Verifier, *, subject_name: str | None = None, options: AuditOptions | None = None,
              progress: bool = True, executor: Executor | None = None, **settings) -> AuditResult:
    """Audit a step-level verifier on the built-in worlds and return every verdict.

    ``options`` (an ``AuditOptions``), or its fields as keywords: ``level`` (default quick),
    ``seed``, ``alpha``, ``device``, ``worlds``, ``properties``, ``stop_early``, ``detect_tv``,
    ``max_samples``, ``require``. ``plan_step_audit`` decides what runs and how alpha is split
    (``exactcheck.plan``); this function executes that plan.

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
    options = replace(options, acceptance_rule=acceptance_rule(subject).value)
    device = resolve_device(options.device)
    if options.call_elements == "auto":  # fixed from here on: the report and reproducers name it
        options = replace(options, call_elements=device_max_elements(device))
    return run_plan(subject, plan_step_audit(options), subject_name, device, progress, executor)


def shard_counts(subject, world, plans, size: int, seed: int, device: str,
                 max_elements: int = DEFAULT_CALL_ELEMENTS):
    """One shard: ``size`` trials of ``world`` driven with ``seed`` in verify calls of at most
    ``max_elements`` target_probs elements, counted into each law's cells (what a Ray task
    returns: counts, not samples), or the subject's failure as a value."""
    try:
        samples = drive(subject, world, size, seed, device, max_elements)
    except (SubjectCrashed, ContractViolation) as exc:
        return exc
    return [compare(plan, samples).counts for plan in plans]


def run_plan(subject: Verifier, audit_plan: AuditPlan, subject_name: str | None = None,
             device: torch.device = torch.device("cpu"), progress: bool = True,
             executor: Executor | None = None) -> AuditResult:
    """Execute a step-audit plan (``exactcheck.plan.plan_step_audit``) on ``subject``."""
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
        world_seed = derive_seed(seed, world.name)
        runs.append(_WorldRun(
            world, world_seed, n, plans, batch_schedule(n) if stop_early else [n],
            [np.zeros(p.expected.size, dtype=np.int64) for p in plans],
            [EProcess(p.expected, n * p.condition_probability) if stop_early else None for p in plans]))
    threshold = budget.log_e_threshold
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    bar = Progress(sum(r.budget for r in runs), unit="trial", desc="exactcheck: laws", enabled=progress)

    def reproduce(world: str) -> str:
        return options.reproduce(name, world)

    evident: tuple[_WorldRun, int] | None = None  # (world, law index) whose e-process crossed
    interrupted = False  # Ctrl-C: keep what was drawn, report it marked incomplete
    executor = executor or LocalExecutor()
    shards = options.shards
    try:
        for batch_index in range(max(len(r.batches) for r in runs) if runs else 0):
            # every live world's shards of this batch go out at once; their counts come back and
            # are merged, in world order, before the look (a sharded batch is one batch)
            live = [r for r in runs if not r.finished and batch_index < len(r.batches)]
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
                    run.failure = _drive_failure(failure, run, size, reproduce(run.world.name))
                    bar.step(run.world.name, run.budget - run.drawn)
                    if stop_early and run.failure.outcome.failed:
                        evident = (run, -1)
                    continue
                run.drawn += size
                for i, process in enumerate(run.processes):
                    run.counts[i] += sum(c[i] for c in counted)
                    if process is not None and process.look(run.counts[i]) >= threshold and not evident:
                        evident = (run, i)
                bar.step(run.world.name, size)
            if evident:
                break
    except KeyboardInterrupt:
        interrupted = True
    bar.close()
    bar = Progress(len(chains) + len(searched) + bool(searched), unit="check", desc="exactcheck: checks",
                   enabled=progress)

    pending: list[Verdict] = []
    for run in runs:
        base = dict(world=run.world.name, seed=run.seed, reproduce=reproduce(run.world.name))
        if run.failure is not None:
            pending.append(run.failure)
            continue
        for i, plan in enumerate(run.plans):
            pending.append(_law_verdict(run, i, base, budget, evident, interrupted))

    try:
        for world in chains if not interrupted else ():
            pending.extend(_chain_verdicts(subject, world, level.chain_sequences, derive_seed(seed, world.name),
                                           device, reproduce(world.name), evident is not None))
            bar.step(world.name)

        for prop in searched if not interrupted else ():
            prop_seed = derive_seed(seed, f"properties/{prop}")
            result = search(subject, prop, level.property_examples, prop_seed, device)
            pending.append(_property_verdict(result, name, prop_seed, reproduce(f"properties/{prop}")))
            bar.step(f"properties/{prop}")

        if any(c.kind is CheckKind.INPUTS for c in audit_plan.checks) and not interrupted:
            pending.append(_inputs_verdict(subject, seed, reproduce("inputs"), device))
            bar.step("inputs")
    except KeyboardInterrupt:
        interrupted = True
    bar.close()
    if interrupted:  # every planned check still gets a verdict: the ones not reached say so
        pending += unreached_verdicts(audit_plan, pending, seed, reproduce)

    verdicts = keep_plots_where_needed(_apply_holm(pending, budget))
    stopped = None
    if evident:
        run, i = evident
        stopped = run.failure.check if i < 0 else f"{run.world.name}/{run.plans[i].law}"
    return StepAuditResult(
        subject=name, level=level.value, seed=seed, alpha=budget.alpha, device=str(device),
        verdicts=tuple(verdicts), started=started, duration_s=time.perf_counter() - clock,
        environment={"exactcheck": __version__, "torch": torch.__version__,
                     "python": platform.python_version(), "platform": platform.platform()},
        detect_tv=options.target_tv, stop_early=stop_early, samples_planned=sum(r.budget for r in runs),
        samples_drawn=sum(r.drawn for r in runs), stopped_early_at=stopped, require=options.require,
        interrupted=interrupted, call_elements=options.max_elements)


def unreached_verdicts(audit_plan: AuditPlan, pending: list[Verdict], seed: int, reproduce) -> list[Verdict]:
    """After Ctrl-C: an inconclusive "not run" verdict for every planned check that has none
    (a world whose subject broke its contract has one contract verdict in place of its laws).
    ``reproduce(world)`` gives each its reproduce line."""
    reached = {v.check for v in pending}
    broken = {v.world for v in pending if v.law == "contract"}
    return [Verdict(check=c.name, world=c.world, law=c.law, condition="", samples=0, seed=seed,
                    outcome=Outcome.INCONCLUSIVE, reproduce=reproduce(c.world),
                    summary="not run: the audit was interrupted (Ctrl-C) before this check")
            for c in audit_plan.checks if c.name not in reached and c.world not in broken]


def planned_checks(**settings) -> list[str]:
    """The names of the checks ``run_audit`` with these settings will report, in its order,
    without running anything (``plan_step_audit(...).names``). A world on which the subject
    crashes or breaks the contract is reported by one ``WORLD/contract`` verdict in place of its
    laws."""
    return plan_step_audit(AuditOptions.build(**settings)).names


def _drive_failure(exc: Exception, run: _WorldRun, size: int, reproduce: str) -> Verdict:
    world = run.world
    base = dict(world=world.name, seed=run.seed, reproduce=reproduce)
    low_precision = getattr(world, "input_dtype", torch.float32) != torch.float32
    if low_precision and isinstance(exc, SubjectCrashed):
        return Verdict(check=f"{world.name}/contract", law="contract", condition="every verify call",
                       outcome=Outcome.INCONCLUSIVE, samples=size,
                       summary=f"does not take {world.input_dtype} inputs: {exc}", **base)
    return _failure_verdict(exc, samples=size, **base)


def _law_verdict(run: _WorldRun, i: int, base: dict, budget: AlphaBudget,
                 evident: tuple[_WorldRun, int] | None, interrupted: bool = False) -> Verdict:
    """The verdict of law ``i`` of ``run``: an e-process detection, a fixed-budget test (its
    p-value still to go through Holm), or not run to its budget because the audit stopped."""
    plan, counts = run.plans[i], run.counts[i]
    gof = goodness_of_fit(counts, plan.expected, budget.first_share)
    common = dict(base, check=f"{run.world.name}/{plan.law}", law=plan.law,
                  condition=plan.condition, samples=gof.samples)
    process = run.processes[i]
    tv = dict(tv_estimate=gof.tv_estimate, tv_interval=gof.tv_interval,
              detectable_tv=gof.detectable_tv,
              log_evidence=process.largest if process is not None else None,
              evidence=_evidence(LawComparison(plan, counts), gof.samples),
              law_cells=plot_cells(LawComparison(plan, counts), gof.samples))
    if gof.impossible:
        tv["reachability"] = observed_in(gof.impossible, gof.samples, "samples on outcomes of exact probability 0:")
    if evident is not None and evident[0] is run and evident[1] == i:
        log_e = process.largest
        e_p = math.exp(-log_e) if math.isfinite(log_e) else 0.0
        summary = (_statistical_summary(gof) if gof.impossible else
                   f"TV {gof.tv_estimate:.4f}, e-value {_e(log_e)} after {run.drawn:,} of "
                   f"{run.budget:,} planned trials (stopped early)")
        return Verdict(outcome=Outcome.DEFECT, summary=summary, statistic=log_e,
                       statistic_name=E_STATISTIC_NAME, pvalue=e_p, evidence_kind=Evidence.SEQUENTIAL,
                       adjusted_pvalue=min(1.0, e_p / budget.e_share * budget.alpha),
                       alpha_share=budget.e_share,
                       **tv, **common)
    if run.drawn < run.budget:
        where = "" if evident is None else f" at {evident[0].world.name}" + (
            f"/{evident[0].plans[evident[1]].law}" if evident[1] >= 0 else "")
        why = ("the audit was interrupted (Ctrl-C)" if interrupted and evident is None
               else f"the audit stopped early on a defect{where}")
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not run to its budget: {why} after {run.drawn:,} of {run.budget:,} trials"), **tv, **common)
    if gof.samples == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"no trial met the condition ({plan.condition}) although the exact law expects "
            "it often; see the accepted_length verdict"), **common)
    return Verdict(outcome=Outcome.EXACT, summary=_statistical_summary(gof), evidence_kind=Evidence.FIXED_BUDGET,
                   tv_certificate=tv_certificate(counts, plan.expected, budget.alpha),
                   statistic=gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
                   pvalue=gof.pvalue, **tv, **common)


def _chain_verdicts(subject, world, sequences: int, seed: int, device, reproduce: str,
                    stopped: bool) -> list[Verdict]:
    """The chain-rule tests of a large-vocabulary world (p-values still to go through Holm)."""
    base = dict(world=world.name, seed=seed, reproduce=reproduce)
    condition = f"{sequences:,} sequences x {world.length} tokens, teacher-forced conditionals"
    if stopped:
        return [Verdict(check=f"{world.name}/{name}", law=name, condition=condition,
                        outcome=Outcome.INCONCLUSIVE, samples=0,
                        summary="not run: the audit stopped early on a defect", **base)
                for name in CHAIN_RULE_TESTS]
    try:
        samples = drive_chain(subject, world, sequences, seed, device)
    except (SubjectCrashed, ContractViolation) as exc:
        return [_failure_verdict(exc, samples=sequences, **base)]
    return [Verdict(check=f"{world.name}/{t.name}", law=t.name, condition=condition,
                    outcome=Outcome.EXACT, summary=t.detail, samples=t.tokens,
                    statistic=t.statistic, statistic_name=t.statistic_name, pvalue=t.pvalue, **base)
            for t in chain_rule_tests(world, samples.sequences, derive_seed(seed, "pit"))]


def _e(log_e: float) -> str:
    if not math.isfinite(log_e):
        return "inf"
    return f"e^{log_e:.1f}" if log_e > 20 else f"{math.exp(log_e):.3g}"


def _failure_verdict(exc: Exception, *, world: str, seed: int, reproduce: str, samples: int,
                     law: str = "contract", condition: str = "every verify call") -> Verdict:
    crashed = isinstance(exc, SubjectCrashed)
    return Verdict(check=f"{world}/{law}", world=world, law=law, condition=condition,
                   outcome=Outcome.CRASHED if crashed else Outcome.CONTRACT_VIOLATION,
                   summary=str(exc), samples=samples, seed=seed, reproduce=reproduce, pvalue=0.0,
                   traceback=exc.frames if crashed else (),
                   reachability=structural(f"with ordinary random numbers, on a call of {samples:,} trials"))


def _property_verdict(result: PropertyResult, subject: str, seed: int, reproduce: str) -> Verdict:
    """A deterministic verdict: a shrunk counterexample (p = 0) with its reachability, an
    unreachable boundary behaviour (shown, not failing), or none found (p = 1)."""
    common = dict(check=f"properties/{result.property}", world="properties", law=result.property,
                  condition="forced uniforms: " + ", ".join(FORCED_VALUE_NAMES)
                  if result.property != "same_seed" else "unforced, same generator seed twice",
                  samples=result.examples, seed=seed,
                  category=Category.REPRODUCIBILITY if result.property == "same_seed" else Category.EXACTNESS)
    note = f" ({result.note})" if result.note else ""
    failure = result.failure
    if failure is None and result.unrepeatable is not None:
        found = result.unrepeatable
        return Verdict(outcome=Outcome.INCONCLUSIVE, reproducer=reproducer(subject, found, seed), reproduce=reproduce,
                       summary=(f"not judged: a counterexample did not recur when the same case was run again, "
                                f"so it is not reported as a defect (the subject is not deterministic under forced "
                                f"draws, or a draw escaped exactcheck's control on this device); seen once: "
                                f"{found.message}"), **dict(common, category=Category.REPRODUCIBILITY))
    if failure is None and result.unreachable is not None:
        found = result.unreachable
        return Verdict(outcome=Outcome.UNREACHABLE, reproducer=reproducer(subject, found, seed),
                       reachability=found.reachability, reproduce=reproduce, summary=(
                           f"no reachable counterexample in {result.examples} cases; boundary behaviour "
                           f"below the reachability floor: {found.message} ({found.reachability.describe()})"),
                       **common)
    if failure is None:
        if result.examples == 0:
            return Verdict(outcome=Outcome.INCONCLUSIVE, summary=result.note, reproduce=reproduce,
                           **common)
        return Verdict(outcome=Outcome.EXACT, pvalue=1.0, reproduce=reproduce, summary=(
            f"held on {result.examples} generated cases{note}"), **common)
    outcome = Outcome.DEFECT
    if result.property == "contract":
        outcome = Outcome.CRASHED if failure.crashed else Outcome.CONTRACT_VIOLATION
    record = reproducer(subject, failure, seed)
    value = f" with every uniform {failure.value}" if failure.value else ""
    return Verdict(outcome=outcome, pvalue=0.0, reproducer=record, reachability=failure.reachability,
                   traceback=failure.frames, reproduce=f"exactcheck replay REPORT_DIR/{reproducer_path(common['check'], subject)}",
                   summary=f"counterexample{value}: {failure.message}", **common)


def _inputs_verdict(subject, seed: int, reproduce: str, device="cpu") -> Verdict:
    """How invalid inputs are handled (category input-handling): garbage output is a contract
    violation, silently accepting NaN, inf, negative or all-zero probabilities is reported
    (inconclusive), refusing them passes. A subject that raises on the valid base case too is
    not credited with refusing anything."""
    common = dict(check="inputs/invalid", world="inputs", law="invalid",
                  condition="NaN, inf, negative, all-zero and unnormalised rows", seed=0,
                  reproduce=reproduce, category=Category.INPUT_HANDLING)
    probes = probe_invalid_inputs(subject, seed, device)
    if probes and probes[0].handling == "broken on valid input":
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=0, summary=(
            f"not judged: the subject fails on the valid base case too ({probes[0].detail}), so its "
            "errors on corrupted inputs say nothing"), **common)

    def line(kind):
        return "; ".join(f"{p.corruption} in {p.where}: {p.detail}" for p in probes if p.handling == kind)

    garbage = [p for p in probes if p.handling == "garbage"]
    silent = [p for p in probes if p.handling == "accepted" and p.corruption in MUST_REFUSE]
    refused = [p for p in probes if p.handling == "error"]
    common["samples"] = len(probes)
    if garbage:
        return Verdict(outcome=Outcome.CONTRACT_VIOLATION, pvalue=0.0,
                       summary="returned garbage for invalid input: " + line("garbage"),
                       reachability=structural("on every call with such an input"), **common)
    summary = (f"refused {len(refused)} of {len(probes)} corrupted inputs with an exception; "
               + (f"accepted silently: {'; '.join(f'{p.corruption} in {p.where} -> {p.detail}' for p in silent)}"
                  if silent else "accepted only unnormalised rows"))
    if silent:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=summary, **common)
    return Verdict(outcome=Outcome.EXACT, pvalue=1.0, summary=summary, **common)


def reproducer_path(check: str, subject: str = "") -> str:
    """Where a report directory keeps the reproducer of ``check`` of ``subject`` (one file per
    subject and check, so subjects failing the same property in one gate keep theirs apart)."""
    slug = "".join(ch if ch.isalnum() or ch in "._" else "-" for ch in subject).strip("-")
    return "reproducers/" + (f"{slug}--" if slug else "") + check.replace("/", "-") + ".json"


def _apply_holm(pending: list[Verdict], budget: AlphaBudget) -> list[Verdict]:
    """Holm at the budget's ``holm_alpha`` over the fixed-budget statistical checks; adjusted
    p-values are scaled by alpha / holm_alpha so every verdict compares its adjusted p-value with alpha.
    E-process detections arrive decided. Deterministic findings (a forbidden outcome, a broken
    contract, a crash, a property counterexample: p = 0; a property that held: p = 1) cannot
    occur by chance on an exact subject, so they spend none of alpha."""
    out = list(pending)
    alpha, holm_alpha, scale = budget.alpha, budget.holm_alpha, budget.holm_scale
    for i, v in enumerate(pending):
        if v.adjusted_pvalue is not None:
            continue
        if v.pvalue is not None and v.statistic is None:
            out[i] = replace(v, adjusted_pvalue=v.pvalue,
                             outcome=Outcome.DEFECT if v.pvalue == 0 and v.outcome is Outcome.EXACT
                             else v.outcome)
    tested = [i for i, v in enumerate(pending)
              if v.pvalue is not None and v.statistic is not None and v.adjusted_pvalue is None]
    adjusted, shares = holm([pending[i].pvalue for i in tested], holm_alpha)
    for i, adj, share in zip(tested, adjusted, shares):
        v = pending[i]
        outcome = v.outcome
        adj = min(1.0, adj * scale)
        if v.outcome is Outcome.EXACT and adj <= alpha:
            outcome = Outcome.DEFECT
        certificate = v.tv_certificate if outcome is Outcome.EXACT else None
        out[i] = replace(v, outcome=outcome, adjusted_pvalue=adj, alpha_share=share,
                         tv_certificate=certificate)
    return out
