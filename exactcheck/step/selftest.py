"""The selftest: audit the reference and every mutant; the suite's power, measured."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA
from exactcheck.report.result import AuditResult
from exactcheck.step.mutants import MUTANTS
from exactcheck.step.reference import reference_verifier
from exactcheck.step.runner import run_audit

__all__ = ["SelftestResult", "run_selftest", "REFERENCE_NAME"]

REFERENCE_NAME = "exactcheck.step.reference:reference_verifier"


@dataclass(frozen=True)
class SelftestResult:
    """The reference audit and one audit per mutant, at one level and seed."""

    level: str
    seed: int
    alpha: float
    reference: AuditResult
    mutants: tuple[tuple[str, str, AuditResult], ...]  # (name, defect, audit)
    # Ctrl-C or SIGTERM ended it: the audits finished (and the interrupted one, marked so) are
    # kept; ``planned`` names every mutant it was to audit
    interrupted: bool = False
    planned: tuple[str, ...] = ()

    @property
    def undetected(self) -> list[str]:
        return [name for name, _, audit in self.mutants if audit.passed]

    @property
    def passed(self) -> bool:
        return self.reference.passed and not self.undetected and not self.interrupted


def run_selftest(level: str = "standard", seed: int = 0, alpha: float = DEFAULT_ALPHA,
                 device: str = "cpu", mutants: list[str] | None = None,
                 on_audit: Callable[[str, AuditResult], None] | None = None,
                 stop_early: bool = True, detect_tv: float | None = None,
                 max_samples: int | None = None, call_elements: int | str | None = None) -> SelftestResult:
    """Audit ``reference_verifier`` and each mutant (all, or those named). With ``stop_early``
    a mutant's audit ends at the first evident defect (see ``run_audit``), and its property
    searches run first (``properties_first``): a mutant found at forced random numbers draws no
    trials. The reference runs every check in full."""
    names = list(MUTANTS) if mutants is None else mutants
    unknown = [m for m in names if m not in MUTANTS]
    if unknown:
        raise UsageError(f"unknown mutant(s) {unknown}; known: {list(MUTANTS)}")
    progress = on_audit is None and sys.stderr.isatty()

    def audit(verifier, name, mutant=True):
        return run_audit(verifier, subject_name=name, level=level, seed=seed, alpha=alpha,
                         device=device, progress=progress, stop_early=stop_early,
                         detect_tv=detect_tv, max_samples=max_samples, call_elements=call_elements,
                         properties_first=mutant and stop_early)

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
