"""What an audit command prints and writes, and the status it exits with: the one-screen summary
and the report files of an audit (``show_audit``, the presentation most audit kinds' rows use),
an interrupted audit's line and partial report, the status of an audit whose subject could not
be driven, and the reports a command was asked for and could not write (``LOST``: such a command
never exits 0). What the text says is ``exactcheck.report``'s; this module decides only what is
printed where, and in which order.

exit status: 0 every check passed; 1 a defect was found; 2 a usage error or a subject that could
not be driven at all; 130 interrupted (Ctrl-C, SIGTERM).
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from exactcheck.report.result import AuditResult

__all__ = ["EXIT_PASS", "EXIT_DEFECT", "EXIT_USAGE", "EXIT_INTERRUPTED", "LOST", "lost_report", "interrupted",
           "print_and_write", "exit_status", "write_and_list", "show_audit"]

EXIT_PASS, EXIT_DEFECT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

LOST: list[str] = []  # reports this command could not write: it then never exits 0 (``cli.main`` reads it)


def lost_report(error: Exception) -> None:
    print(f"exactcheck: error: {error}", file=sys.stderr)
    LOST.append(str(error))


def interrupted(result: AuditResult, report: str | None, stem: str) -> int:
    """Ctrl-C (or SIGTERM) during an audit: one line, the partial report (marked incomplete) if
    asked for, 130."""
    from exactcheck.report.terminal import interrupted_line
    written = ""
    if report:
        from exactcheck.report.files import ReportWriteError, write_report
        from exactcheck.report.json_md import audit_to_json
        try:
            written = str(write_report(audit_to_json(result), report, stem)[0])
        except ReportWriteError as exc:
            lost_report(exc)
    print(interrupted_line(result, written), file=sys.stderr)
    return EXIT_INTERRUPTED


def print_and_write(result: AuditResult, report: str | None, stem: str, passing: bool = False) -> AuditResult:
    """Write the report first (so reproduce lines name the real directory), then print; a report
    that cannot be written still leaves the verdict printed (and an exit status of at least 2)."""
    from exactcheck.report.terminal import audit_summary
    paths, lost = (), None
    if report:
        from exactcheck.report.files import ReportWriteError, write_report
        from exactcheck.report.json_md import audit_from_json, audit_to_json
        data = audit_to_json(result)
        try:
            paths = write_report(data, report, stem)
            result = audit_from_json(data)
        except ReportWriteError as exc:
            lost = exc
    print(audit_summary(result, passing))
    for path in paths:
        print(f"report: {path}")
    if lost is not None:
        lost_report(lost)
    return result


def exit_status(result: AuditResult, subject: str) -> int:
    """0 passed, 1 a defect, 2 (with one error line and the subject's frames on stderr) a subject
    that crashed on every world it was driven through: it could not be driven at all."""
    from exactcheck.report.verdict import Outcome
    if result.undrivable:
        crash = next(v for v in result.verdicts if v.outcome is Outcome.CRASHED)
        print(f"exactcheck: error: {subject} could not be driven: it crashed on every world "
              f"({crash.summary})", file=sys.stderr)
        for frame in crash.traceback:
            print(f"  {frame}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PASS if result.passed else EXIT_DEFECT


def write_and_list(data: dict, report: str, stem: str) -> tuple:
    """Write a report and print its paths; one that cannot be written is said so (never exit 0)."""
    from exactcheck.report.files import ReportWriteError, write_report
    try:
        paths = write_report(data, report, stem)
    except ReportWriteError as exc:
        lost_report(exc)
        return ()
    for path in paths:
        print(f"report: {path}")
    return paths


def show_audit(result: AuditResult, args, stem: str, *, passing: bool = False, undrivable: bool = True) -> int:
    """How most audit kinds end their command: an interrupted audit's line and partial report
    (130), else the summary (with the passing checks when ``passing``) after the report files are
    written (``args.report``), and the exit status: 0, 1, or 2 for a subject that could not be
    driven at all (``undrivable``; else 0 or 1)."""
    if result.interrupted:
        return interrupted(result, args.report, stem)
    result = print_and_write(result, args.report, stem, passing)
    if undrivable:
        return exit_status(result, args.subject)
    return EXIT_PASS if result.passed else EXIT_DEFECT
