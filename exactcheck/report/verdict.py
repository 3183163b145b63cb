"""The verdict: one frozen record per check, carried from the statistics to every report.

A ``Verdict`` names its check, says what was found (``outcome``, ``summary``) and carries the
check's ``CheckKind`` (from the plan) and one typed evidence record:

- ``LawEvidence`` for the statistical kinds (a step or context world's law, a generation law, a
  chain-rule test): the test statistic, p-values and alpha share, the TV estimate with its
  interval and the TV the check could detect, the certificate of a passing law, the e-process's
  log e-value, the deviating cells;
- ``FindingEvidence`` for the deterministic kinds (a property at forced random numbers, the
  invalid-input probe, output validity, a cache invariant, greedy identity, a world's contract):
  p = 0 (a finding) or 1 (held), how reachable the trigger is, the shrunk counterexample, the
  subject's frames of a crash.

The JSON form keeps the flat fields of earlier reports (``to_dict``), plus ``check_kind``;
``from_dict`` reads both.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from exactcheck.options import Category, CheckKind, PseudoWorld
from exactcheck.reachability import Reachability

__all__ = ["Outcome", "Category", "Evidence", "Verdict", "CellDeviation", "LawEvidence", "FindingEvidence",
           "TotalVariation"]


class Outcome(enum.Enum):
    EXACT = "exact"
    DEFECT = "defect"
    CONTRACT_VIOLATION = "contract-violation"
    CRASHED = "crashed"
    INCONCLUSIVE = "inconclusive"
    UNREACHABLE = "unreachable-boundary"
    # the subject follows the lossy rule it declares; what that rule costs is in the summary
    LOSSY = "lossy-by-design"

    @property
    def failed(self) -> bool:
        """Whether this outcome means the subject is not exact (audit exits 1)."""
        return self in (Outcome.DEFECT, Outcome.CONTRACT_VIOLATION, Outcome.CRASHED)

    def describe(self) -> str:
        return {
            Outcome.EXACT: "no defect found at the stated false-alarm rate",
            Outcome.DEFECT: "the emitted law differs from the exact law",
            Outcome.CONTRACT_VIOLATION: "the subject's output broke the verifier contract",
            Outcome.CRASHED: "the subject raised an exception",
            Outcome.INCONCLUSIVE: "the check could not be carried out; it neither passes nor fails",
            Outcome.UNREACHABLE: ("a boundary behaviour whose trigger is rarer than the reachability "
                                  "floor: shown, never failing"),
            Outcome.LOSSY: ("the subject follows the lossy rule it declares; its output law differs from the "
                            "target's by the exact TV stated"),
        }[self]

    @property
    def passing(self) -> bool:
        """Whether a statistical check with this outcome may still be turned into a defect by Holm."""
        return self in (Outcome.EXACT, Outcome.LOSSY)


class Evidence(enum.Enum):
    """What a statistical verdict rests on; set where the verdict is made, never guessed."""

    FIXED_BUDGET = "fixed-budget test"  # a p-value at the full budget, through Holm
    SEQUENTIAL = "anytime-valid e-value"  # an e-process that crossed its threshold while driving
    DETERMINISTIC = "deterministic"  # p = 0 or 1: a forbidden outcome, a property, an invariant
    NONE = "none"  # not judged, not run


@dataclass(frozen=True)
class CellDeviation:
    """One cell of the law with its observed and expected counts."""

    cell: str
    observed: int
    expected: float


@dataclass(frozen=True)
class TotalVariation:
    """The plug-in TV of the observed law against the exact one, its 95% interval, and the
    smallest TV the check finds with power 0.9 at its samples and alpha share."""

    estimate: float
    interval: tuple[float, float]
    detectable: float | None = None


@dataclass(frozen=True)
class LawEvidence:
    """What a statistical check rests on. ``basis``: a fixed-budget test (its p-value goes
    through Holm), an e-process that crossed its threshold, outcomes of exact probability 0
    (deterministic, spends no alpha), or none (not run to its budget)."""

    basis: Evidence
    statistic: float | None = None
    statistic_name: str | None = None
    df: int | None = None
    pvalue: float | None = None
    adjusted_pvalue: float | None = None  # Holm-adjusted over the whole audit (or Bonferroni for e-values)
    alpha_share: float | None = None  # the threshold this check was compared with
    tv: TotalVariation | None = None
    certificate: float | None = None  # TV <= this at confidence 1 - alpha (exact verdicts only)
    log_evidence: float | None = None  # largest log e-value of the law's e-process over its looks
    cells: tuple[CellDeviation, ...] = ()  # the most deviating cells
    # observed vs expected counts on up to 32 cells (the likeliest and the most deviating), kept
    # for failed statistical checks and accepted-length laws: what the HTML report plots
    law_cells: tuple[CellDeviation, ...] = ()
    reachability: Reachability | None = None  # impossible outcomes: how often they were seen
    # a subject that declares no rule: (rule, p-value) for every registered exact rule judged
    fits: tuple[tuple[str, float], ...] = ()

    def test_lines(self) -> list[str]:
        lines = []
        if self.statistic is not None:
            dof = f" on {self.df} degrees of freedom" if self.df is not None else ""
            lines.append(f"{self.statistic_name}: {_num(self.statistic)}{dof}")
        if self.statistic is None and self.pvalue == 0 and self.reachability is None:
            lines.append(_IMPOSSIBLE)
        elif self.statistic is None and self.reachability is not None:
            lines += [_NEVER, f"reachability: {self.reachability.describe()}"]
        elif self.basis is Evidence.SEQUENTIAL:
            lines.append(f"anytime-valid p-value 1/e: {_num(self.pvalue)} (Bonferroni-adjusted "
                         f"{_num(self.adjusted_pvalue)}, alpha share {_num(self.alpha_share)})")
        elif self.statistic is not None:
            lines.append(f"p-value: {_num(self.pvalue)} (Holm-adjusted {_num(self.adjusted_pvalue)}, "
                         f"alpha share {_num(self.alpha_share)})")
        return lines

    def detail_lines(self, samples: int, failed: bool) -> list[str]:
        lines = []
        if self.tv is not None:
            low, high = self.tv.interval
            lines.append(f"total variation: {self.tv.estimate:.4f} (95% interval {low:.4f} to {high:.4f})")
            if self.tv.detectable is not None and failed:
                these = "this one sample" if samples == 1 else f"these {samples:,} samples"
                lines.append(f"power: at {these} a TV of {self.tv.detectable:.4f} is found "
                             f"9 times in 10; smaller ones are found less often, and this one was")
            elif self.tv.detectable is not None:
                lines.append(f"smallest TV detectable at power 0.9 with these samples: {self.tv.detectable:.4f}")
        if self.certificate is not None:
            lines.append(f"certificate: TV <= {self.certificate:.4f} at confidence 1 - alpha")
        if self.fits:
            lines.append("p-value under each registered exact rule: " + ", ".join(f"{n} {_num(p)}" for n, p in self.fits))
        lines += [f"  {dev.cell}: observed {dev.observed:,}, expected {dev.expected:,.1f}" for dev in self.cells[:5]]
        return lines


@dataclass(frozen=True)
class FindingEvidence:
    """What a deterministic check rests on: ``pvalue`` 0 (a finding an exact subject never
    produces) or 1 (held), None when not judged; how reachable the trigger is in real use; the
    shrunk counterexample (``exactcheck.reproducer/1``) of a property; the subject's own frames
    ("file:line in function", innermost last) of a crash."""

    pvalue: float | None = None
    adjusted_pvalue: float | None = None
    reachability: Reachability | None = None
    reproducer: dict | None = None
    traceback: tuple[str, ...] = ()

    @property
    def basis(self) -> Evidence:
        return Evidence.NONE if self.pvalue is None and self.reachability is None else Evidence.DETERMINISTIC

    def test_lines(self) -> list[str]:
        if self.pvalue == 0 and self.reachability is None:
            return [_IMPOSSIBLE]
        if self.reachability is not None:
            return [_NEVER, f"reachability: {self.reachability.describe()}"]
        return []

    def detail_lines(self, samples: int, failed: bool) -> list[str]:
        lines = []
        if self.reproducer is not None:
            case = self.reproducer["case"]
            lines.append("minimal case: " + ", ".join(f"{k}={v}" for k, v in case.items()))
            lines.append(f"forced uniform: {self.reproducer['value']}"
                         + _fewest_forced(self.reproducer.get("forced_elements")))
        if self.traceback:
            lines.append("raised at (the subject's frames, innermost last):")
            lines += [f"  {frame}" for frame in self.traceback]
        return lines


def _fewest_forced(forced: list[int] | None) -> str:
    """The shrunk forced set in words: how many of the call's draws must take the forced value
    (none: the call breaks with its own random numbers), and which."""
    if forced is None:
        return ""
    if not forced:
        return "; fewest forced draws that still break it: none (it breaks with every draw left to the subject's generator)"
    shown = ", ".join(map(str, forced[:8])) + (", ..." if len(forced) > 8 else "")
    return (f"; fewest forced draws that still break it: {len(forced)} "
            f"(element{'s' * (len(forced) != 1)} {shown} of the call's draws)")


_IMPOSSIBLE = "deterministic finding: impossible for an exact subject (p = 0); it spends none of alpha"
_NEVER = "deterministic finding: an exact subject never does this at these random numbers (p = 0; it spends none of alpha)"


@dataclass(frozen=True)
class Verdict:
    check: str  # "world/law"
    world: str
    law: str
    condition: str
    outcome: Outcome
    summary: str  # one line: what was found
    samples: int
    seed: int
    reproduce: str
    kind: CheckKind
    evidence: LawEvidence | FindingEvidence = field(default_factory=FindingEvidence)
    category: Category = Category.EXACTNESS

    def __post_init__(self):
        expected = LawEvidence if self.kind.statistical else FindingEvidence
        if not isinstance(self.evidence, expected):
            raise TypeError(f"a {self.kind.value} verdict carries {expected.__name__}, not "
                            f"{type(self.evidence).__name__}")

    # ---- read-through to the evidence record (None where the kind has no such fact) ----
    @property
    def pvalue(self) -> float | None:
        return self.evidence.pvalue

    @property
    def adjusted_pvalue(self) -> float | None:
        return self.evidence.adjusted_pvalue

    @property
    def reachability(self) -> Reachability | None:
        return self.evidence.reachability

    @property
    def statistic(self) -> float | None:
        return getattr(self.evidence, "statistic", None)

    @property
    def tv(self) -> TotalVariation | None:
        return getattr(self.evidence, "tv", None)

    @property
    def tv_estimate(self) -> float | None:
        return None if self.tv is None else self.tv.estimate

    @property
    def tv_interval(self) -> tuple[float, float] | None:
        return None if self.tv is None else self.tv.interval

    @property
    def detectable_tv(self) -> float | None:
        return None if self.tv is None else self.tv.detectable

    @property
    def tv_certificate(self) -> float | None:
        return getattr(self.evidence, "certificate", None)

    @property
    def log_evidence(self) -> float | None:
        return getattr(self.evidence, "log_evidence", None)

    @property
    def alpha_share(self) -> float | None:
        return getattr(self.evidence, "alpha_share", None)

    @property
    def law_cells(self) -> tuple[CellDeviation, ...]:
        return getattr(self.evidence, "law_cells", ())

    @property
    def reproducer(self) -> dict | None:
        return getattr(self.evidence, "reproducer", None)

    @property
    def traceback(self) -> tuple[str, ...]:
        return getattr(self.evidence, "traceback", ())

    @property
    def evidence_kind(self) -> Evidence:
        return self.evidence.basis

    def describe(self) -> str:
        """Failure message in a fixed shape: a verdict line, a blank line, one fact per line
        with its bound, then how to reproduce."""
        lines = [f"{self.law} law in world {self.world}: {self.outcome.value} — {self.summary}", ""]
        lines += self.evidence.test_lines()
        unit = "cases" if self.kind is CheckKind.PROPERTY else "samples"
        lines.append(f"{unit}: {self.samples:,} ({self.condition})")
        lines += self.evidence.detail_lines(self.samples, self.outcome.failed)
        lines.append(f"reproduce: {self.reproduce}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The JSON form: the flat fields reports have always had, plus ``check_kind``."""
        e = self.evidence
        law = e if isinstance(e, LawEvidence) else LawEvidence(Evidence.NONE)
        data = {
            "check": self.check, "world": self.world, "law": self.law, "condition": self.condition,
            "outcome": self.outcome.value, "summary": self.summary, "samples": self.samples, "seed": self.seed,
            "reproduce": self.reproduce, "statistic": law.statistic, "statistic_name": law.statistic_name,
            "df": law.df, "pvalue": e.pvalue, "adjusted_pvalue": e.adjusted_pvalue, "alpha_share": law.alpha_share,
            "tv_estimate": self.tv_estimate, "tv_interval": list(self.tv_interval) if self.tv_interval else None,
            "detectable_tv": self.detectable_tv, "tv_certificate": law.certificate,
            "log_evidence": law.log_evidence, "evidence": [_cell(c) for c in law.cells],
            "reproducer": self.reproducer, "law_cells": [_cell(c) for c in law.law_cells],
            "category": self.category.value,
            "reachability": None if e.reachability is None else e.reachability.to_dict(),
            "traceback": list(self.traceback), "evidence_kind": e.basis.value, "check_kind": self.kind.value,
        }
        if law.fits:
            data["rule_fits"] = dict(law.fits)
        for key in ("statistic", "pvalue", "adjusted_pvalue", "log_evidence"):
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict, law_kind: CheckKind = CheckKind.LAW) -> "Verdict":
        """A verdict from its JSON form. Reports written before ``check_kind`` existed get the kind
        their check names imply (``law_kind`` for a statistical law: the audit kind says whether
        it was a step or a generation law)."""
        number = {key: float(data[key]) if isinstance(data.get(key), str) else data.get(key)
                  for key in ("statistic", "pvalue", "adjusted_pvalue", "log_evidence")}
        kind = CheckKind(data["check_kind"]) if data.get("check_kind") else _legacy_kind(data, law_kind)
        reach = Reachability(**data["reachability"]) if data.get("reachability") else None
        if kind.statistical:
            basis = data.get("evidence_kind")
            if basis is None:  # a report written before the field existed
                basis = (Evidence.SEQUENTIAL.value if str(data.get("statistic_name") or "").startswith("log e-value")
                         else Evidence.FIXED_BUDGET.value if number["statistic"] is not None else Evidence.NONE.value)
            tv = None if data.get("tv_estimate") is None else TotalVariation(
                data["tv_estimate"], tuple(data["tv_interval"]), data.get("detectable_tv"))
            evidence = LawEvidence(
                Evidence(basis), number["statistic"], data.get("statistic_name"), data.get("df"), number["pvalue"],
                number["adjusted_pvalue"], data.get("alpha_share"), tv, data.get("tv_certificate"),
                number["log_evidence"], tuple(CellDeviation(**c) for c in data.get("evidence", ())),
                tuple(CellDeviation(**c) for c in data.get("law_cells", ())), reach,
                tuple((name, float(p)) for name, p in data.get("rule_fits", {}).items()))
        else:
            evidence = FindingEvidence(number["pvalue"], number["adjusted_pvalue"], reach, data.get("reproducer"),
                                       tuple(data.get("traceback", ())))
        return cls(check=data["check"], world=data["world"], law=data["law"], condition=data["condition"],
                   outcome=Outcome(data["outcome"]), summary=data["summary"], samples=data["samples"],
                   seed=data["seed"], reproduce=data["reproduce"], kind=kind, evidence=evidence,
                   category=Category(data.get("category", "exactness")))


def _legacy_kind(data: dict, law_kind: CheckKind) -> CheckKind:
    """The kind of a verdict in a report that did not record it, from what its check is called."""
    named = {"contract": CheckKind.CONTRACT, "cache_rollback": CheckKind.CACHE_INVARIANT,
             "final_cache": CheckKind.CACHE_INVARIANT, "greedy_identity": CheckKind.GREEDY_IDENTITY,
             "valid_outputs": CheckKind.VALIDITY}
    if data["world"] == PseudoWorld.PROPERTIES.value:
        return CheckKind.PROPERTY
    if data["world"] == PseudoWorld.INPUTS.value:
        return CheckKind.INPUTS
    if data["law"] in named:
        return named[data["law"]]
    return law_kind if data.get("tv_estimate") is not None or not data.get("statistic_name") else CheckKind.CHAIN_RULE


def _cell(cell: CellDeviation) -> dict:
    return {"cell": cell.cell, "observed": cell.observed, "expected": cell.expected}


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0 or (abs(x) >= 1e-3 and abs(x) < 1e5):
        return f"{x:.4g}"
    return f"{x:.3e}"
