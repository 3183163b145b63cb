"""The verdicts of a step audit, one function per kind of check: a law of a driven world
(``law_verdict``), the chain-rule tests of a large world (``chain_verdicts``), a property searched
at forced random numbers (``property_verdict``), the invalid-input probe (``inputs_verdict``), and
a world whose subject crashed or broke its contract (``drive_failure``). The runner
(``exactcheck.step.runner``) decides when each is made; ``exactcheck.core.apply_holm`` decides the
pending statistical ones.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from exactcheck.core import (E_STATISTIC_NAME, STATISTIC_NAME, deviating_cells, failure_verdict, impossible_summary,
                             not_run_verdict, plot_cells)
from exactcheck.errors import ContractViolation, SubjectCrashed
from exactcheck.options import AlphaBudget, Category, Check, CheckKind, PseudoWorld, derive_seed
from exactcheck.reachability import observed_in, structural
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, TotalVariation, Verdict
from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS, chain_rule_tests
from exactcheck.stats.goodness_of_fit import GoodnessOfFit, goodness_of_fit, tv_certificate
from exactcheck.stats.laws import LawComparison, LawPlan
from exactcheck.stats.sequential import EProcess
from exactcheck.step.drive import drive_chain
from exactcheck.step.invalid_inputs import MUST_REFUSE, probe_invalid_inputs
from exactcheck.rules import RULES, RuleSpec
from exactcheck.step.properties import RULE_PROPERTIES, forced_values, PropertyResult, reproducer
from toy_models import ContextWorld, StepWorld

__all__ = ["WorldRun", "law_verdict", "chain_verdicts", "property_verdict", "inputs_verdict", "drive_failure"]


@dataclass
class WorldRun:
    """One world's progress through its batches."""

    world: StepWorld | ContextWorld
    seed: int
    budget: int
    plans: list[LawPlan]
    batches: list[int]
    counts: list[np.ndarray]
    processes: list[list[EProcess] | None]  # per law: one e-process per alternative
    drawn: int = 0
    failure: Verdict | None = None
    largest: list[float] = field(init=False)  # per law: the largest log e-value over the looks

    def __post_init__(self) -> None:
        self.largest = [0.0] * len(self.plans)

    def look(self, i: int) -> float:
        """Law ``i``'s log e-value after this batch: the smallest over its alternatives (a law
        with alternatives shows a defect only when none of them fits)."""
        current = min(process.look(self.counts[i]) for process in self.processes[i])
        self.largest[i] = max(self.largest[i], current)
        return current

    @property
    def finished(self) -> bool:
        return self.failure is not None or self.drawn >= self.budget


def _statistical_summary(gof: GoodnessOfFit) -> str:
    if gof.impossible:
        return impossible_summary(gof.impossible, "samples")
    return f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}"


def _e(log_e: float) -> str:
    if not math.isfinite(log_e):
        return "inf"
    return f"e^{log_e:.1f}" if log_e > 20 else f"{math.exp(log_e):.3g}"


def law_alternatives(plan: LawPlan) -> list[tuple[str | None, np.ndarray]]:
    """(rule, expected law) the law is judged against: its alternatives (a subject that declares
    no rule: every registered exact rule's), else its one expected law."""
    return list(plan.alternatives) or [(None, plan.expected)]


def _fit(counts: np.ndarray, plan: LawPlan, share: float):
    """The goodness of fit against the best-fitting alternative (largest p-value; the
    intersection-union test of "the subject follows one of them"), its expected law, and every
    alternative's p-value."""
    alternatives = law_alternatives(plan)
    fits = [goodness_of_fit(counts, expected, share) for _, expected in alternatives]
    best = max(range(len(fits)), key=lambda j: (fits[j].pvalue, -fits[j].tv_estimate))
    named = tuple((name, float(gof.pvalue)) for (name, _), gof in zip(alternatives, fits)) if plan.alternatives else ()
    return fits[best], alternatives[best], named


def _fits_text(named, best: str | None) -> str:
    if not named:
        return ""
    others = ", ".join(f"{name} p = {p:.3g}" for name, p in named if name != best)
    return f" (fits {best}; {others})"


def law_verdict(run: WorldRun, i: int, reproduce: str, budget: AlphaBudget,
                stopped: str | None, interrupted: bool = False) -> Verdict:
    """The verdict of law ``i`` of ``run``: an e-process detection, a fixed-budget test (its
    p-value still to go through Holm), or not run to its budget because the audit stopped
    (``stopped``: the check whose finding stopped it, this law's own name when its e-process did).
    A rule-specific law is a conformance check; a law of a lossy declared rule passes as lossy."""
    plan, counts = run.plans[i], run.counts[i]
    gof, (best, expected), named = _fit(counts, plan, budget.first_share)
    category = Category.CONFORMANCE if plan.conformance else Category.EXACTNESS
    common = dict(check=f"{run.world.name}/{plan.law}", world=run.world.name, law=plan.law, condition=plan.condition,
                  samples=gof.samples, seed=run.seed, reproduce=reproduce, kind=CheckKind.LAW, category=category)
    fitted = replace(plan, expected=expected)
    comparison = LawComparison(fitted, counts)
    seen = dict(tv=TotalVariation(gof.tv_estimate, gof.tv_interval, gof.detectable_tv),
                log_evidence=run.largest[i] if run.processes[i] is not None else None,
                cells=deviating_cells(comparison, gof.samples), law_cells=plot_cells(comparison, gof.samples),
                reachability=observed_in(gof.impossible, gof.samples, "samples on outcomes of exact probability 0:")
                if gof.impossible else None, fits=named)
    if stopped == f"{run.world.name}/{plan.law}" and run.drawn > 0:
        log_e = run.largest[i]
        e_p = math.exp(-log_e) if math.isfinite(log_e) else 0.0
        summary = (_statistical_summary(gof) if gof.impossible else
                   f"TV {gof.tv_estimate:.4f}, e-value {_e(log_e)} after {run.drawn:,} of "
                   f"{run.budget:,} planned trials (stopped early)")
        if plan.alternatives:
            summary += " against the best-fitting registered exact rule (" + ", ".join(n for n, _ in named) + ")"
        return Verdict(outcome=Outcome.DEFECT, summary=summary, **common, evidence=LawEvidence(
            Evidence.SEQUENTIAL, statistic=log_e, statistic_name=E_STATISTIC_NAME, pvalue=e_p,
            adjusted_pvalue=min(1.0, e_p / budget.e_share * budget.alpha), alpha_share=budget.e_share, **seen))
    if run.drawn < run.budget:
        why = ("the audit was interrupted (Ctrl-C)" if interrupted and stopped is None
               else f"the audit stopped early on a defect at {stopped}")
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not run to its budget: {why} after {run.drawn:,} of {run.budget:,} trials"), **common,
            evidence=LawEvidence(Evidence.NONE, **seen))
    if gof.samples == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"no trial met the condition ({plan.condition}) although the exact law expects "
            "it often; see the accepted_length verdict"), **common, evidence=LawEvidence(Evidence.NONE))
    summary = _statistical_summary(gof) + _fits_text(named, best)
    if plan.lossy:
        summary = f"{plan.lossy}; the subject follows its rule: {summary}"
    return Verdict(outcome=Outcome.LOSSY if plan.lossy else Outcome.EXACT, summary=summary, **common,
                   evidence=LawEvidence(Evidence.FIXED_BUDGET, statistic=gof.statistic, statistic_name=STATISTIC_NAME,
                                        df=gof.df, pvalue=gof.pvalue,
                                        certificate=tv_certificate(counts, expected, budget.alpha), **seen))


def rule_note(verdicts: list[Verdict], rule: RuleSpec | None, plans) -> str:
    """One line on the rule: for a subject that declares none and passes, which registered exact
    rule its conformance laws fit best (and how to gate on it); for a lossy declared rule, what it
    costs on the worlds audited (``plans``: the plan's laws per world); else nothing."""
    if rule is not None:
        costs = [law.lossy_tv for _, laws in plans for law in laws if law.lossy_tv is not None]
        if rule.exact or not costs:
            return ""
        return (f"declared rule {rule.label} is lossy by design: its output law is TV {min(costs):.4f} to "
                f"{max(costs):.4f} from the target's on the worlds audited (exact, by enumeration)")
    conformance = [v for v in verdicts if v.category is Category.CONFORMANCE and getattr(v.evidence, "fits", ())]
    if not conformance or any(v.outcome.failed for v in verdicts):
        return ""
    smallest = {name: min(dict(v.evidence.fits)[name] for v in conformance) for name, _ in conformance[0].evidence.fits}
    best = max(smallest, key=smallest.get)
    return (f"output law exact; acceptance matches {RULES[best].noun} (smallest p-value over its "
            f"{len(conformance)} conformance laws: {smallest[best]:.3g}); declare acceptance_rule = "
            f"\"{best}\" to gate on it")


def chain_verdicts(subject, world, sequences: int, seed: int, device: torch.device, reproduce: str,
                   stopped: bool, rule: RuleSpec | None = None) -> list[Verdict]:
    """The chain-rule tests of a large-vocabulary world (p-values still to go through Holm); not
    applicable to a lossy declared rule (they test the target's own law)."""
    condition = f"{sequences:,} sequences x {world.length} tokens, teacher-forced conditionals"
    if rule is not None and not rule.exact:
        return [not_run_verdict(Check(f"{world.name}/{name}", CheckKind.CHAIN_RULE, world.name, name), seed,
                                reproduce, f"not applicable: the declared rule {rule.label} is lossy by design; the "
                                           "chain-rule tests judge the target's own law", condition)
                for name in CHAIN_RULE_TESTS]
    if stopped:
        return [not_run_verdict(Check(f"{world.name}/{name}", CheckKind.CHAIN_RULE, world.name, name), seed,
                                reproduce, "not run: the audit stopped early on a defect", condition)
                for name in CHAIN_RULE_TESTS]
    try:
        samples = drive_chain(subject, world, sequences, seed, device)
    except (SubjectCrashed, ContractViolation) as exc:
        return [failure_verdict(exc, world=world.name, seed=seed, reproduce=reproduce, samples=sequences)]
    return [Verdict(check=f"{world.name}/{t.name}", world=world.name, law=t.name, condition=condition,
                    outcome=Outcome.EXACT, summary=t.detail, samples=t.tokens, seed=seed, reproduce=reproduce,
                    kind=CheckKind.CHAIN_RULE, evidence=LawEvidence(
                        Evidence.FIXED_BUDGET, statistic=t.statistic, statistic_name=t.statistic_name, pvalue=t.pvalue))
            for t in chain_rule_tests(world, samples.sequences, derive_seed(seed, "pit"))]


def drive_failure(exc: Exception, run: WorldRun, size: int, reproduce: str) -> Verdict:
    """The verdict standing for a world's laws when the subject crashed or broke its contract
    on it; a world of low-precision rows that the subject cannot take is not judged."""
    world = run.world
    low_precision = getattr(world, "input_dtype", torch.float32) != torch.float32
    if low_precision and isinstance(exc, SubjectCrashed):
        return Verdict(check=f"{world.name}/contract", world=world.name, law="contract", condition="every verify call",
                       outcome=Outcome.INCONCLUSIVE, samples=size, seed=run.seed, reproduce=reproduce,
                       summary=f"does not take {world.input_dtype} inputs: {exc}", kind=CheckKind.CONTRACT)
    return failure_verdict(exc, world=world.name, seed=run.seed, reproduce=reproduce, samples=size)


def property_verdict(result: PropertyResult, subject: str, seed: int, reproduce: str, rule: str | None = None,
                     replay: str | None = None) -> Verdict:
    """A deterministic verdict: a shrunk counterexample (p = 0) with its reachability, an
    unreachable boundary behaviour (shown, not failing), or none found (p = 1). The acceptance
    property is a conformance check; ``rule``: the rule the user named (kept in reproducers);
    ``replay``: a counterexample's reproduce line (``exactcheck.reproduce.replay_line``; default
    ``reproduce``), which a written report replaces with the replay of its reproducer file."""
    unforced = result.property == "same_seed"
    world = PseudoWorld.PROPERTIES.value
    category = (Category.REPRODUCIBILITY if unforced else Category.CONFORMANCE if result.property in RULE_PROPERTIES
                else Category.EXACTNESS)
    common = dict(check=f"{world}/{result.property}", world=world, law=result.property,
                  condition="forced uniforms: " + ", ".join(forced_values(result.property))
                  if not unforced else "unforced, same generator seed twice",
                  samples=result.examples, seed=seed, kind=CheckKind.PROPERTY, category=category)
    note = f" ({result.note})" if result.note else ""
    failure = result.failure
    if failure is None and result.unrepeatable is not None:
        found = result.unrepeatable
        return Verdict(outcome=Outcome.INCONCLUSIVE, reproduce=reproduce,
                       evidence=FindingEvidence(reproducer=reproducer(subject, found, seed, rule)),
                       summary=(f"not judged: a counterexample did not recur when the same case was run again, "
                                f"so it is not reported as a defect (the subject is not deterministic under forced "
                                f"draws, or a draw escaped exactcheck's control on this device); seen once: "
                                f"{found.message}"), **dict(common, category=Category.REPRODUCIBILITY))
    if failure is None and result.unreachable is not None:
        found = result.unreachable
        return Verdict(outcome=Outcome.UNREACHABLE, reproduce=reproduce, evidence=FindingEvidence(
            reproducer=reproducer(subject, found, seed, rule), reachability=found.reachability), summary=(
            f"no reachable counterexample in {result.examples} cases; boundary behaviour "
            f"below the reachability floor: {found.message} ({found.reachability.describe()})"), **common)
    if failure is None:
        if result.examples == 0:
            return Verdict(outcome=Outcome.INCONCLUSIVE, summary=result.note, reproduce=reproduce, **common)
        return Verdict(outcome=Outcome.EXACT, reproduce=reproduce, evidence=FindingEvidence(pvalue=1.0),
                       summary=f"held on {result.examples} generated cases{note}", **common)
    outcome = Outcome.DEFECT
    if result.property == "contract":
        outcome = Outcome.CRASHED if failure.crashed else Outcome.CONTRACT_VIOLATION
    value = f" with every uniform {failure.value}" if failure.value else ""
    return Verdict(outcome=outcome, reproduce=replay or reproduce,
                   summary=f"counterexample{value}: {failure.message}", **common, evidence=FindingEvidence(
                       pvalue=0.0, reproducer=reproducer(subject, failure, seed, rule), reachability=failure.reachability,
                       traceback=failure.frames))


def inputs_verdict(subject, seed: int, reproduce: str, device: torch.device) -> Verdict:
    """How invalid inputs are handled (category input-handling): garbage output is a contract
    violation, silently accepting NaN, inf, negative or all-zero probabilities is reported
    (inconclusive), refusing them passes. A subject that raises on the valid base case too is
    not credited with refusing anything."""
    world = PseudoWorld.INPUTS.value
    common = dict(check=f"{world}/invalid", world=world, law="invalid", kind=CheckKind.INPUTS,
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
        return Verdict(outcome=Outcome.CONTRACT_VIOLATION, summary="returned garbage for invalid input: " + line("garbage"),
                       evidence=FindingEvidence(pvalue=0.0, reachability=structural("on every call with such an input")),
                       **common)
    summary = (f"refused {len(refused)} of {len(probes)} corrupted inputs with an exception; "
               + (f"accepted silently: {'; '.join(f'{p.corruption} in {p.where} -> {p.detail}' for p in silent)}"
                  if silent else "accepted only unnormalised rows"))
    if silent:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=summary, **common)
    return Verdict(outcome=Outcome.EXACT, summary=summary, evidence=FindingEvidence(pvalue=1.0), **common)
