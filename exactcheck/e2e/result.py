"""The end-to-end kinds' results (each registers itself by its label):

- ``GeneratorAuditResult``: an end-to-end generator through the model worlds (``exactcheck e2e``):
  generations at a fixed budget.
- ``GreedyAuditResult``: greedy identity and final caches on real models (``exactcheck greedy``):
  deterministic checks only, no false-alarm budget.
- ``GrammarAuditResult``: a generator under a grammar mask on SmolLM2 (``exactcheck grammar``):
  greedy identity, validity and chain-rule tests under Holm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from exactcheck.options import AuditKind
from exactcheck.report.result import AuditResult

__all__ = ["GeneratorAuditResult", "GreedyAuditResult", "GrammarAuditResult"]


@dataclass(frozen=True)
class GeneratorAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.GENERATOR
    label: ClassVar[str] = "end-to-end"
    unit: ClassVar[str] = "generations"
    command: ClassVar[str] = "e2e"

    budget_words: ClassVar[str] = "end-to-end audit: {drawn:,} generations driven ({planned:,} planned), fixed budget"


@dataclass(frozen=True)
class GreedyAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind("greedy")
    label: ClassVar[str] = "greedy"
    unit: ClassVar[str] = "greedy runs"
    command: ClassVar[str] = "greedy"

    budget_words: ClassVar[str] = ("greedy identity: {drawn:,} runs (prompt x draft length), each compared token for "
                                   "token")

    @classmethod
    def report_fields(cls, data: dict) -> dict:
        fields = super().report_fields(data)
        return {**fields, "alpha": fields["alpha"] or None}  # earlier versions wrote 0 for no budget


@dataclass(frozen=True)
class GrammarAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind("grammar")
    label: ClassVar[str] = "grammar"
    unit: ClassVar[str] = "sampled outputs"
    command: ClassVar[str] = "grammar"

    budget_words: ClassVar[str] = ("grammar audit: {drawn:,} of {planned:,} sampled outputs, plus the greedy runs, "
                                   "fixed budget")
