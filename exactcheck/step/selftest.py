"""The selftest: audit the reference and every mutant; the suite's power, measured."""
from __future__ import annotations

from typing import Callable

from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA
from exactcheck.report.result import AuditResult, SelftestResult
from exactcheck.step.mutants import MUTANTS
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.step.runner import run_audit

__all__ = ["SelftestResult", "run_selftest", "REFERENCE_NAME"]

REFERENCE_NAME = "exactcheck.contracts.reference_verifier:reference_verifier"


def run_selftest(level: str = "standard", seed: int = 0, alpha: float = DEFAULT_ALPHA,
                 device: str = "cpu", mutants: list[str] | None = None,
                 on_audit: Callable[[str, AuditResult], None] | None = None,
                 stop_early: bool = True, detect_tv: float | None = None,
                 max_samples: int | None = None, call_elements: int | str | None = None,
                 jobs: int = 1, progress: bool = True) -> SelftestResult:
    """Audit ``reference_verifier`` and each mutant (all, or those named). With ``stop_early``
    a mutant's audit ends at the first evident defect (see ``run_audit``), and its property
    searches run first (``properties_first``): a mutant found at forced random numbers draws no
    trials. The reference runs every check in full. ``jobs`` > 1: the audits run in that many
    worker processes (``exactcheck.executors.worker_pool``), each the same seeded audit as in the
    serial run, so the verdicts are the same; ``on_audit`` still sees them in order. ``progress``:
    each audit's progress on stderr (a bar on a terminal, a line every few seconds in a log)."""
    names = list(MUTANTS) if mutants is None else mutants
    unknown = [m for m in names if m not in MUTANTS]
    if unknown:
        raise UsageError(f"unknown mutant(s) {unknown}; known: {list(MUTANTS)}")

    def audit(verifier, name, mutant=True):
        return run_audit(verifier, subject_name=name, level=level, seed=seed, alpha=alpha,
                         device=device, progress=progress, stop_early=stop_early,
                         detect_tv=detect_tv, max_samples=max_samples, call_elements=call_elements,
                         properties_first=mutant and stop_early)

    if jobs < 1:
        raise UsageError(f"--jobs ({jobs}) must be at least 1")
    if jobs > 1:
        settings = dict(level=level, seed=seed, alpha=alpha, device=device, stop_early=stop_early, detect_tv=detect_tv,
                        max_samples=max_samples, call_elements=call_elements)
        return _run_in_workers(names, settings, on_audit, jobs)
    reference = audit(reference_verifier, REFERENCE_NAME, mutant=False)
    rows = []
    # Ctrl-C (or SIGTERM) anywhere from here on stops the selftest and keeps what it finished: the
    # reference, and each mutant whose audit ended (an audit interrupted inside is not a row)
    try:
        if on_audit and not reference.interrupted:
            on_audit(REFERENCE_NAME, reference)
        for m in names if not reference.interrupted else ():
            result = audit(MUTANTS[m].verifier, f"exactcheck.step.mutants:{m}")
            if result.interrupted:
                break
            rows.append((m, MUTANTS[m].defect, result))
            if on_audit:
                on_audit(f"exactcheck.step.mutants:{m}", result)
    except KeyboardInterrupt:
        pass
    interrupted = reference.interrupted or len(rows) < len(names)
    return SelftestResult(level, seed, alpha, reference, tuple(rows), interrupted, tuple(names))


def _audit_one(mutant: str | None, settings: dict) -> AuditResult:
    """One selftest audit in a worker: the reference (``mutant`` None) or that mutant."""
    verifier = reference_verifier if mutant is None else MUTANTS[mutant].verifier
    name = REFERENCE_NAME if mutant is None else f"exactcheck.step.mutants:{mutant}"
    return run_audit(verifier, subject_name=name, progress=False, properties_first=mutant is not None
                     and settings["stop_early"], **settings)


def _run_in_workers(names: list[str], settings: dict, on_audit, jobs: int) -> SelftestResult:
    from exactcheck.executors import worker_pool
    pool = worker_pool(jobs)
    rows = []
    reference = None
    try:
        # the longest audit (the reference, every check in full) first, then the mutants in order
        futures = [pool.submit(_audit_one, None, settings)] + [pool.submit(_audit_one, m, settings) for m in names]
        reference = futures[0].result()
        if on_audit:
            on_audit(REFERENCE_NAME, reference)
        for m, future in zip(names, futures[1:]):
            result = future.result()
            rows.append((m, MUTANTS[m].defect, result))
            if on_audit:
                on_audit(f"exactcheck.step.mutants:{m}", result)
    except KeyboardInterrupt:
        if reference is None:
            raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    interrupted = len(rows) < len(names)
    return SelftestResult(settings["level"], settings["seed"], settings["alpha"], reference, tuple(rows), interrupted,
                          tuple(names))
