"""Which finding a user meets first: the order every report lists failures in, and the one it
headlines; and which checks every report folds into one line (those not run to their budget).

A broken invariant of the subject's own state leads (``CheckKind.CACHE_INVARIANT``: a KV cache,
conv window or recurrent state that does not hold what its record says): it names the place to fix
("layer 1 state 0: the conv window at forward call 6 is [0, 3], the recurrence gives [3, 0]"), and
the laws that are off in the same audit are its symptoms; a p-value of 1e-300 on the sequence law
says that something is wrong, the breach says what. A law whose emitted distribution is off comes
next: it is met on every call, with ordinary random numbers (the most evident first: smallest
adjusted p-value, then largest TV). Other deterministic findings follow by how likely their
trigger is per call in real use (``exactcheck.reachability``): a contract broken on every call or a
forbidden token emitted with ordinary random numbers before a forced uniform of probability
2^-53. So a verifier whose first-token law is off by TV 0.26 is headlined by that law, not by a
boundary case it also has, and a recurrent loop that restores a stale state by the state it
breaks, not by the law that breach bends.
"""
from __future__ import annotations

from typing import Iterable

from exactcheck.options import CheckKind
from exactcheck.report.verdict import Outcome, Verdict

__all__ = ["rank_failures", "per_call_probability", "how_reachable", "NOT_RUN", "not_run", "not_run_line"]

NOT_RUN = "not run to its budget"  # how the summary of a law the audit stopped short of begins


def per_call_probability(verdict: Verdict) -> float:
    """How likely a failure's trigger is per call: 1 for a law that is off (every call draws from
    it) and for a structural finding; the trigger's probability for a forced or observed one."""
    reach = verdict.reachability
    if verdict.kind.statistical or reach is None or reach.probability is None:
        return 1.0
    return reach.probability


def _key(verdict: Verdict) -> tuple:
    group = 0 if verdict.kind is CheckKind.CACHE_INVARIANT else 1 if verdict.kind.statistical else 2
    return (group, -per_call_probability(verdict), verdict.adjusted_pvalue or 0.0, -(verdict.tv_estimate or 0.0))


def rank_failures(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """``verdicts`` (failed ones) in the order a user meets them (stable among equals)."""
    return sorted(verdicts, key=_key)


def how_reachable(verdict: Verdict) -> str:
    """How a user meets a failure, in words: a law that is off is met on every call; a
    deterministic finding by its trigger's reachability (``exactcheck.reachability``)."""
    if verdict.kind.met is not None:  # the kind says how (a served check met on the requests it names)
        return verdict.kind.met
    if verdict.kind.statistical:
        return "a law that is off: met on every call, with ordinary random numbers"
    reach = verdict.reachability
    return reach.describe() if reach is not None else "on every call"


def not_run(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The checks not run to their budget (the audit stopped early on a defect, or was
    interrupted): inconclusive, each with the same reason. The terminal, the Markdown and the
    HTML fold them into one line (``not_run_line``) rather than repeat it per check."""
    return [v for v in verdicts if v.outcome is Outcome.INCONCLUSIVE and v.summary.startswith(NOT_RUN)]


def not_run_line(count: int, stopped_at: str | None, interrupted: bool = False) -> str:
    """"65 checks not run to their budget (the audit stopped early on W/law); they are
    inconclusive, not passed"."""
    why = "the audit was interrupted" if interrupted and not stopped_at else (
        f"the audit stopped early on {stopped_at or 'a defect'}")
    if count == 1:
        return f"1 check not run to its budget ({why}); it is inconclusive, not passed"
    return f"{count:,} checks not run to their budget ({why}); they are inconclusive, not passed"
