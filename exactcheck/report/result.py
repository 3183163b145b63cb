"""What an audit returns: its verdicts with how they were reached, on one shared base,
``AuditResult``. Each kind's own type lives in its kind (``exactcheck.step.result``,
``e2e.result``, ``tree.result``, ``recurrent.result``, ``serve.result``) and registers itself by its
label; the kinds' registry (``exactcheck.audit_kinds``) imports them all.

Renderers ask the result (``kind``, ``settings_text``, ``budget_text``) rather than inferring the
kind from which fields are empty. ``result_type`` picks the registered type when a report is read
back, and ``report_fields`` turns the report's fields (those of earlier versions included) into
the type's.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from exactcheck.options import DEFAULT_REQUIRE, AuditOptions, CheckKind, PseudoWorld, AuditKind
from exactcheck.report.ranking import rank_failures
from exactcheck.report.verdict import Outcome, Verdict

__all__ = ["AuditResult", "result_type", "GateSubject", "GateResult", "SelftestResult"]


_REGISTERED: dict[str, type] = {}  # label -> result type (``AuditResult.__init_subclass__``)


@dataclass(frozen=True)
class AuditResult:
    """The shared base: the subject, its verdicts, how many samples were planned and drawn, and
    which finding categories gate pass/fail. ``alpha`` is None for an audit of deterministic
    checks only; ``level`` is None where an audit has no levels."""

    kind: ClassVar[AuditKind]  # the audit kind: its row in ``exactcheck.audit_kinds.AUDIT_KINDS``
    label: ClassVar[str]  # the kind as a JSON report names it ("kind": the schema's word, kept stable)
    unit: ClassVar[str]  # what a sample is: trials, generations, runs, outputs
    command: ClassVar[str]  # the ``exactcheck`` command that runs this kind: what titles name
    # the kind's budget line (``budget_text``): samples drawn and planned as {drawn} and {planned}
    budget_words: ClassVar[str] = "{drawn:,} {result.unit} of {planned:,} planned, fixed budget"
    # the kind of a law verdict in a report written before verdicts carried ``check_kind``
    law_check: ClassVar[CheckKind] = CheckKind.GENERATOR_LAW

    subject: str
    level: str | None
    seed: int
    alpha: float | None
    device: str
    verdicts: tuple[Verdict, ...]
    started: str
    duration_s: float
    environment: dict
    samples_planned: int = 0
    samples_drawn: int = 0
    # the finding categories that decide pass/fail (Category values); others are shown only
    require: tuple[str, ...] = DEFAULT_REQUIRE
    interrupted: bool = False  # Ctrl-C ended the audit: a partial report, marked incomplete, never a pass

    def __init_subclass__(cls, **keywords):
        """A result type registers itself by its label, so that a JSON report of its kind reads back
        (``result_type``) wherever the class is defined: a new kind's result type is its own."""
        super().__init_subclass__(**keywords)
        label = cls.__dict__.get("label")
        if label is not None:
            known = _REGISTERED.setdefault(label, cls)
            if known is not cls and known.__qualname__ != cls.__qualname__:
                raise TypeError(f"two result types are labelled {label!r}: {known.__qualname__}, {cls.__qualname__}")
            _REGISTERED[label] = cls

    def gates(self, verdict: Verdict) -> bool:
        """Whether ``verdict`` fails this audit: a failed outcome in a required category."""
        return verdict.outcome.failed and verdict.category.value in self.require

    @property
    def failed(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if self.gates(v))

    @property
    def not_required(self) -> tuple[Verdict, ...]:
        """Findings in categories this audit does not gate on (shown, not failing)."""
        return tuple(v for v in self.verdicts if v.outcome.failed and not self.gates(v))

    @property
    def undrivable(self) -> bool:
        """The subject crashed on every world it was driven through: it could not be driven."""
        driven = [v for v in self.verdicts if v.kind not in (CheckKind.PROPERTY, CheckKind.INPUTS)
                  and v.world != PseudoWorld.PROCESS.value]  # a killed worker is a finding: exit 1
        return (self.samples_drawn == 0 and any(v.outcome is Outcome.CRASHED for v in driven)
                and all(v.outcome in (Outcome.CRASHED, Outcome.INCONCLUSIVE) for v in driven))

    @property
    def passed(self) -> bool:
        return not self.failed and not self.interrupted

    @property
    def stopped_at(self) -> str | None:
        """The check whose evidence stopped the audit early (step audits only)."""
        return None

    def count(self, outcome: Outcome) -> int:
        return sum(v.outcome is outcome for v in self.verdicts)

    def counts_text(self) -> str:
        """"3 exact, 2 defect, 1 non-gating finding": the checks by outcome, where a failed outcome
        counts as such only if it gates this audit; failed checks in categories the audit does not
        require (``not_required``, e.g. the step audit's ``properties/same_seed``) are counted
        apart. Every headline (terminal, Markdown, HTML, pull-request comment) prints this."""
        apart = set(map(id, self.not_required))
        kept = [v for v in self.verdicts if id(v) not in apart]
        parts = [f"{n} {o.value}" for o in Outcome if (n := sum(v.outcome is o for v in kept))]
        if apart:
            parts.append(f"{len(apart)} non-gating finding{'s' * (len(apart) != 1)}")
        return ", ".join(parts)

    def title(self) -> str:
        """"exactcheck e2e mod:gen": the command and the subject, as a report's headline names them."""
        return f"exactcheck {self.command} {self.subject}"

    def ranked_failures(self) -> list[Verdict]:
        """The failed verdicts, the one a user meets most often first (``exactcheck.report.ranking``)."""
        return rank_failures(self.failed)

    def strongest_failure(self) -> Verdict | None:
        """The failure a report headlines: the first of ``ranked_failures``."""
        ranked = self.ranked_failures()
        return ranked[0] if ranked else None

    # ---- what renderers print ----
    def alpha_text(self) -> str:
        if self.alpha is None:
            return "deterministic checks only (no false-alarm budget is spent)"
        return f"false-alarm budget α = {self.alpha:g} for the whole audit (Holm over the statistical checks)"

    def settings_text(self) -> str:
        """"level standard, seed 0, alpha 0.001" (what a one-line summary names)."""
        parts = ([f"level {self.level}"] if self.level else []) + [f"seed {self.seed}"]
        parts.append(f"alpha {self.alpha:g}" if self.alpha is not None else "deterministic checks only")
        return ", ".join(parts)

    def budget_text(self) -> str:
        """The budget line: the kind's ``budget_words`` with the samples drawn and planned (``{drawn}``,
        ``{planned}``) and the result's fields (``{result.reference}``) filled in."""
        return self.budget_words.format(drawn=self.samples_drawn, planned=self.samples_planned, result=self)

    def rule_fields(self) -> dict | None:
        """The JSON report's ``rule`` object (step audits: the rule judged by, and its note)."""
        return None

    def budget_fields(self) -> dict:
        """The JSON report's ``budget`` object."""
        return {"unit": self.unit, "samples_planned": self.samples_planned, "samples_drawn": self.samples_drawn,
                "interrupted": self.interrupted}

    # ---- how a JSON report reads back ----
    @classmethod
    def report_fields(cls, data: dict) -> dict:
        """The fields of this type that the JSON report ``data`` holds besides the verdicts and the
        shared head: its ``budget`` object's (``budget_fields`` in reverse), and the level and alpha.
        Fields that earlier versions wrote for every kind and this type has not are dropped; earlier
        versions wrote the kind's label in place of a level."""
        own = {f.name for f in fields(cls)}  # (not the ClassVars: unit, label, ...)
        budget = {k: v for k, v in data.get("budget", {}).items() if k in own}
        level = None if data["level"] == cls.label else data["level"]
        return {**budget, "level": level, "alpha": data["alpha"]}


def result_type(data: dict) -> type[AuditResult]:
    """The result type of a JSON report, by the label its class registered (``AuditResult``
    subclasses register themselves when their kind is imported: ``exactcheck.audit_kinds`` imports
    every kind); reports written before ``kind`` existed are told apart by the fields they had
    (level "greedy"/"grammar", a planned detectable TV: a step audit's; else an end-to-end one's)."""
    label = data.get("kind")
    if label is None:
        level = data.get("level")
        label = level if level in ("greedy", "grammar") else (
            "step" if data.get("budget", {}).get("detect_tv") else "end-to-end")
    if label not in _REGISTERED:
        raise ValueError(f"a report of an audit kind this exactcheck does not know ({label!r}); known: "
                         f"{', '.join(_REGISTERED) or 'none (import exactcheck.audit_kinds to load the kinds)'}")
    return _REGISTERED[label]


# --- what a gate and a selftest return: several audits, each a result above

@dataclass(frozen=True)
class GateSubject:
    name: str
    kind: AuditKind
    target: str  # MODULE:CALLABLE or a built-in generator name
    options: AuditOptions
    settings: dict = field(default_factory=dict, hash=False)  # what only this kind takes (e.g. policies)
    exempt: tuple[str, ...] = ()

    @property
    def level(self) -> str:
        return self.options.level.value


@dataclass(frozen=True)
class GateResult:
    subject: GateSubject
    audit: AuditResult

    def exempted(self, verdict: Verdict) -> bool:
        return verdict.check in self.subject.exempt or verdict.world in self.subject.exempt

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        """Failed checks that are not exempt: each one fails the gate."""
        return tuple(v for v in self.audit.failed if not self.exempted(v))

    @property
    def passed(self) -> bool:
        return not self.blocking


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
