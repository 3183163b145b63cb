"""What exactcheck prints on a terminal: the one-screen summary of an audit, the selftest's table
rows, and the gate's lines. The command line prints these strings and nothing of its own making,
so "how a result is shown" is decided here, beside the Markdown, HTML and JUnit renderers. What
comes from the subject (its name, exception text, frames) reaches the terminal through
``terminal_text``: an ANSI escape or another control character is printed visibly (``\\x1b``),
never executed."""
from __future__ import annotations

from typing import TYPE_CHECKING

from exactcheck.report.escaping import terminal_text
from exactcheck.report.ranking import how_reachable, not_run, not_run_line, rank_failures
from exactcheck.report.result import AuditResult
from exactcheck.report.verdict import Outcome

if TYPE_CHECKING:
    from exactcheck.report.result import GateResult, SelftestResult

__all__ = ["audit_summary", "selftest_header", "selftest_row", "selftest_footer", "gate_lines", "gate_verdict",
           "interrupted_line", "DETAILED_FAILURES"]

DETAILED_FAILURES = 3  # failures shown in full; the rest get a line each
OTHER_LINES = 5  # inconclusive checks listed one per line before the rest become a count


def audit_summary(result: AuditResult, passing: bool = False) -> str:
    """One screen: the verdict line, then each gating finding with its evidence and reproduce
    line (the one a user meets most often first), then one-liners for the rest, inconclusive
    checks folded into counts, the budget, and with ``passing`` a line per check that passed."""
    status = "PASSED" if result.passed else "FAILED"
    failed = result.ranked_failures()
    first = f" on {failed[0].check} ({failed[0].outcome.value})" if failed else ""
    lines = [f"{result.title()}: {status}{first} ({result.counts_text()}; {result.settings_text()}, "
             f"{result.duration_s:.1f} s)"]
    note = getattr(result, "rule_note", "")
    if note:
        lines.append(f"  {note}")
    for v in failed[:DETAILED_FAILURES]:
        lines += ["", v.describe()]
    if failed:
        lines.append("")
    lines += [f"  {v.outcome.value:<18} {v.check}: {v.summary}" for v in failed[DETAILED_FAILURES:]]
    lines += [f"  {v.category.value} finding (not required; --require {v.category.flag} makes it fail) "
              f"{v.check}: {v.summary}" for v in result.not_required]
    unrun = not_run(result.verdicts)
    other = [v for v in result.verdicts if v.outcome in (Outcome.INCONCLUSIVE, Outcome.UNREACHABLE)
             and v not in unrun]
    lines += [f"  {v.outcome.value:<18} {v.check}: {v.summary}" for v in other[:OTHER_LINES]]
    if len(other) > OTHER_LINES:
        more = len(other) - OTHER_LINES
        lines.append(f"  ... and {more} more inconclusive check{'s' * (more != 1)} (see the report)")
    if unrun:
        lines.append(f"  {not_run_line(len(unrun), result.stopped_at, result.interrupted)}")
    lines.append(f"  {result.budget_text()}")
    if passing:
        lines += [f"  exact              {v.check}: {v.summary}" for v in result.verdicts if v.outcome is Outcome.EXACT]
    return terminal_text("\n".join(lines))


_COLUMNS = (f"{'subject':<28} {'result':<9} {'caught by':<42} {'category':<11} {'TV':>7} {'adj. p':>8} "
            f"{'time':>6}  reachability")


def selftest_header() -> str:
    return _COLUMNS + "\n" + "-" * len(_COLUMNS)


def selftest_row(name: str, audit: AuditResult, reference: bool) -> str:
    """One row of the selftest table: the reference's checks, or what caught a mutant."""
    short = name.split(":")[-1]
    forced = ""
    if reference:
        result = "passes" if audit.passed else "FAILS"
        caught = f"{len(audit.verdicts) - len(audit.failed)}/{len(audit.verdicts)} checks exact"
        tv = p = category = "-"
    else:
        best = audit.strongest_failure()
        result = "detected" if best else "MISSED"
        caught = best.check if best else "-"
        category = best.category.value if best else "-"
        tv = "-" if not best or best.tv_estimate is None else f"{best.tv_estimate:.4f}"
        p = "-" if not best else f"{best.adjusted_pvalue:.1e}"
        if best is not None:  # how a user meets what caught it (a law that is off: on every call)
            forced = how_reachable(best)
    return terminal_text(f"{short:<28} {result:<9} {caught:<42} {category:<11} {tv:>7} {p:>8} "
                         f"{audit.duration_s:5.1f}s  {forced}")


def selftest_footer(result: "SelftestResult", seconds: float) -> str:
    detected = len(result.mutants) - len(result.undetected)
    reference = ("interrupted" if getattr(result.reference, "interrupted", False) else "passes"
                 if result.reference.passed else "FAILS")
    incomplete = (f" (INCOMPLETE: {len(result.mutants)} of {len(result.planned)} mutants audited before it was "
                  f"stopped)" if getattr(result, "interrupted", False) else "")
    return (f"reference {reference}; {detected} of {len(result.mutants)} mutants detected{incomplete}; "
            f"{seconds:.1f} s in all")


def gate_lines(results: "list[GateResult]") -> str:
    """Each subject's line, with its blocking findings in full (the one met most often first)."""
    lines = []
    for result in results:
        status = "passes" if result.passed else "FAILS"
        exempt = [v.check for v in result.audit.failed if result.exempted(v)]
        lines.append(f"{result.subject.name}: {status} ({len(result.audit.verdicts)} checks, "
                     f"{len(result.blocking)} failed" + (f", {len(exempt)} failed but exempt" if exempt else "")
                     + f"; level {result.subject.level}, {result.audit.duration_s:.1f} s)")
        lines += ["  " + v.describe().replace("\n", "\n  ")
                  for v in rank_failures(result.blocking)[:DETAILED_FAILURES]]
    return terminal_text("\n".join(lines))


def gate_verdict(results: "list[GateResult]") -> str:
    passed = all(r.passed for r in results)
    return f"exactcheck gate: {'PASSED' if passed else 'FAILED'} ({sum(r.passed for r in results)} of {len(results)} subjects pass)"


def interrupted_line(result: AuditResult, written: str = "") -> str:
    """Ctrl-C during an audit: how far it got, and the partial report if one was written."""
    where = f"; partial report, marked incomplete: {written}" if written else ""
    return terminal_text(f"exactcheck: interrupted after {result.samples_drawn:,} of {result.samples_planned:,} "
                         f"{result.unit}{where}")
