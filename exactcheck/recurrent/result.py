"""The result of a recurrent-state audit (its own type: it registers itself by its label)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from exactcheck.options import AuditKind
from exactcheck.report.result import AuditResult

__all__ = ["RecurrentAuditResult"]


@dataclass(frozen=True)
class RecurrentAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind("recurrent")
    label: ClassVar[str] = "recurrent"
    unit: ClassVar[str] = "generations"
    command: ClassVar[str] = "recurrent"

    budget_words: ClassVar[str] = ("recurrent-state audit: {drawn:,} generations driven ({planned:,} planned), fixed "
                                   "budget")
