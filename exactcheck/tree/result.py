"""The tree kinds' results: a tree verifier through the speculative loop (``exactcheck tree``) and a
tree generator through cached tree models (``exactcheck tree-loop``); each registers itself by its label."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from exactcheck.options import AuditKind
from exactcheck.report.result import AuditResult

__all__ = ["TreeAuditResult", "TreeLoopAuditResult"]


@dataclass(frozen=True)
class TreeAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.TREE
    label: ClassVar[str] = "tree"
    unit: ClassVar[str] = "trials"
    command: ClassVar[str] = "tree"

    budget_words: ClassVar[str] = ("tree audit: {drawn:,} trials through the speculative loop ({planned:,} planned), "
                                   "fixed budget")


@dataclass(frozen=True)
class TreeLoopAuditResult(AuditResult):
    """A tree generator audited end to end through cached tree models (``exactcheck tree-loop``,
    ``exactcheck.tree.generation_audit``)."""

    kind: ClassVar[AuditKind] = AuditKind("tree-loop")
    label: ClassVar[str] = "tree-loop"
    unit: ClassVar[str] = "generations"
    command: ClassVar[str] = "tree-loop"

    budget_words: ClassVar[str] = ("tree generation audit: {drawn:,} generations through cached tree models "
                                   "({planned:,} planned), fixed budget")
