"""A served system's audit result (``exactcheck serve``); it registers itself by its label."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from exactcheck.options import AuditKind
from exactcheck.report.result import AuditResult
from exactcheck.serve import check_kinds  # noqa: F401  (declares the check kinds only a served audit's reports name)

__all__ = ["ServeAuditResult"]


@dataclass(frozen=True)
class ServeAuditResult(AuditResult):
    """A served system audited over HTTP against a reference (``exactcheck.serve``)."""

    kind: ClassVar[AuditKind] = AuditKind("serve")
    label: ClassVar[str] = "serve"
    unit: ClassVar[str] = "requests"
    command: ClassVar[str] = "serve"
    reference: str = ""  # the reference endpoint the laws came from
    traffic: str = ""  # the client's line: requests sent, taken from the journal, retried, tokens

    budget_words: ClassVar[str] = ("serve audit: {drawn:,} sampled requests ({planned:,} planned) against the "
                                   "reference {result.reference}; {result.traffic}")

    def budget_fields(self) -> dict:
        return {**super().budget_fields(), "reference": self.reference, "traffic": self.traffic}
