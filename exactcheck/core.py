"""What every audit runner shares (the step audit, the end-to-end audit, the two real-model
audits), under public names: the device an audit runs on, Holm over the plan's statistical
checks, the cells a law verdict shows, the verdict of a subject that crashed or broke its
contract, the verdicts of checks an interrupted audit did not reach, and the environment a
report records.

A runner executes its plan (``exactcheck.options.AuditPlan``) and builds ``Verdict``s; this module
turns pending verdicts into decided ones. Holm selects its members by the verdict's
``CheckKind`` and the basis of its evidence, never by which fields happen to be set.
"""
from __future__ import annotations

import platform
import sys
from dataclasses import replace
from typing import Callable

import numpy as np
import torch

from exactcheck.version import __version__
from exactcheck.errors import SubjectCrashed, UsageError
from exactcheck.options import AlphaBudget, CheckKind
from exactcheck.reachability import structural
from exactcheck.report.verdict import CellDeviation, Evidence, FindingEvidence, LawEvidence, Outcome, Verdict
from exactcheck.reachability import observed_in
from exactcheck.report.verdict import TotalVariation
from exactcheck.stats.goodness_of_fit import goodness_of_fit, holm, tv_certificate
from exactcheck.stats.laws import LawComparison, LawPlan

__all__ = ["resolve_device", "apply_holm", "deviating_cells", "plot_cells", "keep_plots_where_needed", "sample_law_verdict",
           "impossible_summary",
           "failure_verdict", "not_run_verdict", "unreached_verdicts", "INTERRUPTED", "run_environment", "STATISTIC_NAME",
           "E_STATISTIC_NAME"]

STATISTIC_NAME = "Pearson X^2 (pooled)"
E_STATISTIC_NAME = "log e-value (Dirichlet-mixture likelihood ratio)"


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch device; a UsageError (one line, exit 2) if torch cannot use it.
    Called once, by an audit's entry point; every layer below receives the result."""
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


def apply_holm(pending: list[Verdict], budget: AlphaBudget) -> list[Verdict]:
    """Decide the pending verdicts of an audit.

    The fixed-budget tests of the statistical kinds (``CheckKind.statistical``) go through Holm at
    the budget's ``holm_alpha`` over a family of ``budget.checks`` (members the audit did not run
    count as p = 1); adjusted p-values are scaled by alpha / holm_alpha so every verdict compares
    its adjusted p-value with alpha. E-process detections arrive decided. Deterministic evidence
    (a forbidden outcome, a broken contract, a crash, a property counterexample: p = 0; a check
    that held: p = 1) cannot occur by chance on an exact subject, so it spends none of alpha."""
    out = list(pending)
    alpha, scale = budget.alpha, budget.holm_scale
    tested = []
    for i, v in enumerate(pending):
        e = v.evidence
        if e.adjusted_pvalue is not None or e.pvalue is None:
            continue
        if v.kind.statistical and e.basis is Evidence.FIXED_BUDGET:
            tested.append(i)
        elif e.basis is Evidence.DETERMINISTIC:
            out[i] = replace(v, evidence=replace(e, adjusted_pvalue=e.pvalue),
                             outcome=Outcome.DEFECT if e.pvalue == 0 and v.outcome.passing else v.outcome)
    adjusted, shares = holm([pending[i].pvalue for i in tested], budget.holm_alpha,
                            family=max(budget.checks, len(tested)))
    for i, adj, share in zip(tested, adjusted, shares):
        v = pending[i]
        adj = min(1.0, adj * scale)
        outcome = Outcome.DEFECT if v.outcome.passing and adj <= alpha else v.outcome
        certificate = v.evidence.certificate if outcome.passing else None
        out[i] = replace(v, outcome=outcome, evidence=replace(v.evidence, adjusted_pvalue=adj, alpha_share=share,
                                                              certificate=certificate))
    return out


def deviating_cells(comparison: LawComparison, n: int, most: int = 8) -> tuple[CellDeviation, ...]:
    """The ``most`` cells whose observed count is furthest from the exact law's, in standard
    deviations (a count on a cell of probability 0 first)."""
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


def impossible_summary(count: int, unit: str) -> str:
    """"3 samples fell on outcomes of exact probability 0", "1 sample fell on an outcome ...":
    ``unit`` is the plural ("samples", "trials", "generations")."""
    if count == 1:
        return f"1 {unit.removesuffix('s')} fell on an outcome of exact probability 0"
    return f"{count:,} {unit} fell on outcomes of exact probability 0"


def sample_law_verdict(plan: LawPlan, counts: np.ndarray, share: float, alpha: float, base: dict,
                       kind: CheckKind, unit: str, note: str | None = None, lossy: str | None = None) -> Verdict:
    """The pending verdict of a fixed-budget law: ``counts`` of ``plan.expected``'s cells tested by
    the pooled chi-square at ``share`` (Holm decides it later, ``apply_holm``), with its TV
    estimate, interval, certificate and the cells to show; samples on cells of exact probability 0
    are a deterministic finding. ``base``: the verdict's world, seed and reproduce line; ``unit``:
    what a sample is ("generations", "requests"); ``note`` leads the summary ("decoded greedily:
    ..."); ``lossy``: a lossy mode's name, whose summary prices it by its TV interval."""
    gof = goodness_of_fit(counts, plan.expected, share)
    if gof.impossible:
        summary = impossible_summary(gof.impossible, unit)
    else:
        summary = f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}"
    if note and not lossy:
        summary = f"{note}; {summary}"
    if lossy:
        low, high = gof.tv_interval
        summary = (f"lossy by design ({lossy}): TV {gof.tv_estimate:.4f}, 95% interval {low:.4f} to "
                   f"{high:.4f}; p = {gof.pvalue:.3g}")
    comparison = LawComparison(plan, counts)
    return Verdict(
        outcome=Outcome.EXACT, summary=summary, check=f"{base['world']}/{plan.law}", law=plan.law,
        condition=plan.condition, samples=gof.samples, kind=kind, **base, evidence=LawEvidence(
            Evidence.DETERMINISTIC if gof.impossible else Evidence.FIXED_BUDGET,
            statistic=None if gof.impossible else gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
            pvalue=gof.pvalue, tv=TotalVariation(gof.tv_estimate, gof.tv_interval, gof.detectable_tv),
            certificate=tv_certificate(counts, plan.expected, alpha),
            cells=deviating_cells(comparison, gof.samples), law_cells=plot_cells(comparison, gof.samples),
            reachability=observed_in(gof.impossible, gof.samples, f"{unit} on outcomes of exact probability 0:")
            if gof.impossible else None))


def keep_plots_where_needed(verdicts: list[Verdict]) -> list[Verdict]:
    """Drop the plot cells of passing checks (accepted-length laws keep theirs)."""
    return [v if v.outcome.failed or v.law == "accepted_length" or not v.law_cells
            else replace(v, evidence=replace(v.evidence, law_cells=())) for v in verdicts]


def failure_verdict(exc: Exception, *, world: str, seed: int, reproduce: str, samples: int,
                    law: str = "contract", condition: str = "every verify call") -> Verdict:
    """The verdict standing for a world's checks when the subject crashed or broke its contract
    on it (deterministic: an exact subject keeps its contract on every call)."""
    crashed = isinstance(exc, SubjectCrashed)
    return Verdict(check=f"{world}/{law}", world=world, law=law, condition=condition,
                   outcome=Outcome.CRASHED if crashed else Outcome.CONTRACT_VIOLATION,
                   summary=str(exc), samples=samples, seed=seed, reproduce=reproduce, kind=CheckKind.CONTRACT,
                   evidence=FindingEvidence(pvalue=0.0, traceback=exc.frames if crashed else (),
                                            reachability=structural(
                                                f"with ordinary random numbers, on a call of {samples:,} trials")))


def not_run_verdict(check, seed: int, reproduce: str, summary: str, condition: str = "",
                    samples: int = 0) -> Verdict:
    """An inconclusive verdict for a planned check (``exactcheck.options.Check``) that was not
    carried out."""
    evidence = LawEvidence(Evidence.NONE) if check.kind.statistical else FindingEvidence()
    return Verdict(check=check.name, world=check.world, law=check.law, condition=condition, samples=samples,
                   seed=seed, outcome=Outcome.INCONCLUSIVE, reproduce=reproduce, summary=summary, kind=check.kind,
                   evidence=evidence)


INTERRUPTED = "not run: the audit was interrupted (Ctrl-C) before this check"


def unreached_verdicts(checks, pending: list[Verdict], seed: int, reproduce: Callable[[str], str],
                       words: str = INTERRUPTED) -> list[Verdict]:
    """After Ctrl-C: an inconclusive "not run" verdict for every planned check (``checks``) that
    has none (a world whose subject broke its contract has one contract verdict in place of its
    checks). ``reproduce(world)`` gives each its reproduce line."""
    reached = {v.check for v in pending}
    broken = {v.world for v in pending if v.kind is CheckKind.CONTRACT}
    return [not_run_verdict(c, seed, reproduce(c.world), words)
            for c in checks if c.name not in reached and c.world not in broken]


def run_environment(**extra) -> dict:
    """What a report records of the machine and the libraries (transformers where it is loaded)."""
    environment = {"exactcheck": __version__, "torch": torch.__version__, "numpy": np.__version__,
                   "python": platform.python_version(), "platform": platform.platform(),
                   "machine": platform.machine()}
    if "transformers" in sys.modules:
        environment["transformers"] = sys.modules["transformers"].__version__
    return {**environment, **extra}
