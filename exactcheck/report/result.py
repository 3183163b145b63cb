"""What an audit returns: its verdicts with how they were reached, one type per kind of audit on
a shared base.

- ``StepAuditResult``: a step-level verifier through the worlds (``exactcheck audit``): trials,
  a budget planned to detect a TV, early stopping.
- ``GeneratorAuditResult``: an end-to-end generator through the model worlds (``exactcheck e2e``):
  generations at a fixed budget.
- ``GreedyAuditResult``: greedy identity and final caches on real models (``exactcheck greedy``):
  deterministic checks only, no false-alarm budget.
- ``GrammarAuditResult``: a generator under a grammar mask on SmolLM2 (``exactcheck grammar``):
  greedy identity, validity and chain-rule tests under Holm.

Renderers ask the result (``kind``, ``settings_text``, ``budget_text``) rather than inferring the
kind from which fields are empty. ``result_type`` picks the type when a report is read back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from exactcheck.options import DEFAULT_REQUIRE, AuditOptions, CheckKind, PseudoWorld, AuditKind
from exactcheck.report.ranking import rank_failures
from exactcheck.report.verdict import Outcome, Verdict

__all__ = ["AuditResult", "StepAuditResult", "GeneratorAuditResult", "GreedyAuditResult", "TreeAuditResult",
           "TreeLoopAuditResult", "GrammarAuditResult", "ServeAuditResult", "result_type", "GateSubject", "GateResult",
           "SelftestResult"]


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
        return f"{self.samples_drawn:,} {self.unit} of {self.samples_planned:,} planned, fixed budget"

    def rule_fields(self) -> dict | None:
        """The JSON report's ``rule`` object (step audits: the rule judged by, and its note)."""
        return None

    def budget_fields(self) -> dict:
        """The JSON report's ``budget`` object."""
        return {"unit": self.unit, "samples_planned": self.samples_planned, "samples_drawn": self.samples_drawn,
                "interrupted": self.interrupted}


@dataclass(frozen=True)
class StepAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.VERIFIER
    label: ClassVar[str] = "step"
    unit: ClassVar[str] = "trials"
    command: ClassVar[str] = "audit"

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


@dataclass(frozen=True)
class GeneratorAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.GENERATOR
    label: ClassVar[str] = "end-to-end"
    unit: ClassVar[str] = "generations"
    command: ClassVar[str] = "e2e"

    def budget_text(self) -> str:
        return f"end-to-end audit: {self.samples_drawn:,} generations driven ({self.samples_planned:,} planned), fixed budget"


@dataclass(frozen=True)
class GreedyAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind("greedy")
    label: ClassVar[str] = "greedy"
    unit: ClassVar[str] = "greedy runs"
    command: ClassVar[str] = "greedy"

    def budget_text(self) -> str:
        return f"greedy identity: {self.samples_drawn:,} runs (prompt x draft length), each compared token for token"


@dataclass(frozen=True)
class GrammarAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind("grammar")
    label: ClassVar[str] = "grammar"
    unit: ClassVar[str] = "sampled outputs"
    command: ClassVar[str] = "grammar"

    def budget_text(self) -> str:
        return (f"grammar audit: {self.samples_drawn:,} of {self.samples_planned:,} sampled outputs, "
                "plus the greedy runs, fixed budget")


@dataclass(frozen=True)
class TreeAuditResult(AuditResult):
    kind: ClassVar[AuditKind] = AuditKind.TREE
    label: ClassVar[str] = "tree"
    unit: ClassVar[str] = "trials"
    command: ClassVar[str] = "tree"

    def budget_text(self) -> str:
        return (f"tree audit: {self.samples_drawn:,} trials through the speculative loop "
                f"({self.samples_planned:,} planned), fixed budget")


@dataclass(frozen=True)
class TreeLoopAuditResult(AuditResult):
    """A tree generator audited end to end through cached tree models (``exactcheck tree-loop``,
    ``exactcheck.tree.generation_audit``)."""

    kind: ClassVar[AuditKind] = AuditKind("tree-loop")
    label: ClassVar[str] = "tree-loop"
    unit: ClassVar[str] = "generations"
    command: ClassVar[str] = "tree-loop"

    def budget_text(self) -> str:
        return (f"tree generation audit: {self.samples_drawn:,} generations through cached tree models "
                f"({self.samples_planned:,} planned), fixed budget")


@dataclass(frozen=True)
class ServeAuditResult(AuditResult):
    """A served system audited over HTTP against a reference (``exactcheck.serve``)."""

    kind: ClassVar[AuditKind] = AuditKind("serve")
    label: ClassVar[str] = "serve"
    unit: ClassVar[str] = "requests"
    command: ClassVar[str] = "serve"
    reference: str = ""  # the reference endpoint the laws came from
    traffic: str = ""  # the client's line: requests sent, taken from the journal, retried, tokens

    def budget_text(self) -> str:
        return (f"serve audit: {self.samples_drawn:,} sampled requests ({self.samples_planned:,} planned) against "
                f"the reference {self.reference}; {self.traffic}")

    def budget_fields(self) -> dict:
        return {**super().budget_fields(), "reference": self.reference, "traffic": self.traffic}


def result_type(data: dict) -> type[AuditResult]:
    """The result type of a JSON report, by the label its class registered (``AuditResult``
    subclasses register themselves); reports written before ``kind`` existed are told apart by the
    fields they had (level "greedy"/"grammar", a planned detectable TV)."""
    label = data.get("kind")
    if label is None and data.get("level") in ("greedy", "grammar"):
        label = data["level"]
    if label is not None:
        if label not in _REGISTERED:
            raise ValueError(f"a report of an audit kind this exactcheck does not know ({label!r}); known: "
                             f"{', '.join(_REGISTERED)}")
        return _REGISTERED[label]
    return StepAuditResult if data.get("budget", {}).get("detect_tv") else GeneratorAuditResult


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
