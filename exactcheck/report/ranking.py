"""Which finding a user meets first: the order every report lists failures in, and the one it
headlines.

A law whose emitted distribution is off is met on every call, with ordinary random numbers: it
leads (the most evident first: smallest adjusted p-value, then largest TV). Deterministic findings
follow by how likely their trigger is per call in real use (``exactcheck.reachability``): a
contract broken on every call or a forbidden token emitted with ordinary random numbers before a
forced uniform of probability 2^-53. So a verifier whose first-token law is off by TV 0.26 is
headlined by that law, not by a boundary case it also has.
"""
from __future__ import annotations

from typing import Iterable

from exactcheck.options import CheckKind
from exactcheck.report.verdict import Verdict

__all__ = ["rank_failures", "per_call_probability", "how_reachable"]


def per_call_probability(verdict: Verdict) -> float:
    """How likely a failure's trigger is per call: 1 for a law that is off (every call draws from
    it) and for a structural finding; the trigger's probability for a forced or observed one."""
    reach = verdict.reachability
    if verdict.kind.statistical or reach is None or reach.probability is None:
        return 1.0
    return reach.probability


def _key(verdict: Verdict) -> tuple:
    law = verdict.kind.statistical
    return (0 if law else 1, -per_call_probability(verdict), verdict.adjusted_pvalue or 0.0,
            -(verdict.tv_estimate or 0.0))


def rank_failures(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """``verdicts`` (failed ones) in the order a user meets them (stable among equals)."""
    return sorted(verdicts, key=_key)


def how_reachable(verdict: Verdict) -> str:
    """How a user meets a failure, in words: a law that is off is met on every call; a
    deterministic finding by its trigger's reachability (``exactcheck.reachability``)."""
    if verdict.kind is CheckKind.SPECULATION:
        return "on the requests the check names (speculation switched off for them): met on every such request"
    if verdict.kind.statistical:
        return "a law that is off: met on every call, with ordinary random numbers"
    reach = verdict.reachability
    return reach.describe() if reach is not None else "on every call"
