"""The step audit's result: trials, a budget planned to detect a TV, early stopping (``exactcheck audit``).

Its type registers itself by its label, so a JSON report of a step audit reads back as one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from exactcheck.options import AuditKind, CheckKind
from exactcheck.report.result import AuditResult

__all__ = ["StepAuditResult"]


@dataclass(frozen=True)
class StepAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.VERIFIER
    label: ClassVar[str] = "step"
    unit: ClassVar[str] = "trials"
    command: ClassVar[str] = "audit"
    law_check: ClassVar[CheckKind] = CheckKind.LAW

    detect_tv: float = 0.0  # the TV the budget was planned to detect (power 0.9)
    stop_early: bool = False
    stopped_early_at: str | None = None  # the check whose evidence stopped the audit
    # target_probs elements per verify call (None in reports of earlier versions: 2^24)
    call_elements: int | None = None
    rule: str | None = None  # the rule the subject was judged by (None: any registered exact rule)
    rule_note: str = ""  # one line on the rule (``exactcheck.step.verdicts.rule_note``)
    max_seconds: float | None = None  # the time budget the trials were cut to fit (``--max-seconds``)
    # trials per world that replaced the planned budget (cut to fit ``max_seconds``, or named)
    trials: tuple[tuple[str, int], ...] | None = None

    @property
    def stopped_at(self) -> str | None:
        return self.stopped_early_at

    def alpha_text(self) -> str:
        split = "half to the early-stopping e-processes, half to Holm" if self.stop_early else "Holm"
        return f"false-alarm budget α = {self.alpha:g} for the whole audit ({split} over the statistical checks)"

    def budget_text(self) -> str:
        if self.trials:
            why = (f"cut to fit --max-seconds {self.max_seconds:g}" if self.max_seconds is not None
                   else "set by --trials")
            head = (f"budget {why} ({', '.join(f'{w} {n:,}' for w, n in self.trials)} trials), in place of the one "
                    f"planned to detect TV ≥ {self.detect_tv:g}: each law states the TV it could detect")
        else:
            head = f"budget planned to detect TV ≥ {self.detect_tv:g} on every law (power 0.9)"
        return (f"{head}: {self.samples_drawn:,} of {self.samples_planned:,} planned trials drawn"
                + (f"; stopped early on {self.stopped_at}" if self.stopped_at else ""))

    def budget_fields(self) -> dict:
        return {"detect_tv": self.detect_tv, "stop_early": self.stop_early, **super().budget_fields(),
                "stopped_at": self.stopped_at, "call_elements": self.call_elements,
                "max_seconds": self.max_seconds, "trials": None if self.trials is None else dict(self.trials)}

    def rule_fields(self) -> dict | None:
        return {"rule": self.rule, "note": self.rule_note}

    @classmethod
    def report_fields(cls, data: dict) -> dict:
        budget = dict(data.get("budget", {}))
        fields = super().report_fields({**data, "budget": {**budget, "stopped_early_at": budget.get("stopped_at")}})
        if fields.get("trials"):
            fields["trials"] = tuple(sorted(fields["trials"].items()))
        if data.get("rule"):
            fields.update(rule=data["rule"].get("rule"), rule_note=data["rule"].get("note", ""))
        return fields
