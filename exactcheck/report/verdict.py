"""The verdict: one frozen record per check, carried from the statistics to every report."""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, field

from exactcheck.reachability import Reachability

__all__ = ["Outcome", "Category", "Evidence", "Verdict", "CellDeviation"]


class Outcome(enum.Enum):
    EXACT = "exact"
    DEFECT = "defect"
    CONTRACT_VIOLATION = "contract-violation"
    CRASHED = "crashed"
    INCONCLUSIVE = "inconclusive"
    UNREACHABLE = "unreachable-boundary"

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
        }[self]


class Category(enum.Enum):
    """What a finding is about. An audit's pass/fail follows ``EXACTNESS`` unless more
    categories are required (``--require reproducible``, ``--require input-handling``)."""

    EXACTNESS = "exactness"  # laws, forbidden tokens, acceptance decisions, contract, crashes
    REPRODUCIBILITY = "reproducibility"  # the same seed gives the same output
    INPUT_HANDLING = "input-handling"  # NaN, inf, negative, all-zero rows

    @classmethod
    def parse(cls, name: str) -> "Category":
        """A category from its value or the CLI's words (``reproducible`` for reproducibility)."""
        aliases = {"reproducible": cls.REPRODUCIBILITY, "inputs": cls.INPUT_HANDLING}
        if name in aliases:
            return aliases[name]
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"category ({name!r}) must be one of exactness, reproducible, "
                             "input-handling") from None


class Evidence(enum.Enum):
    """What kind of evidence a verdict rests on; set where the verdict is made, never guessed."""

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
    statistic: float | None = None
    statistic_name: str | None = None
    df: int | None = None
    pvalue: float | None = None
    adjusted_pvalue: float | None = None  # Holm-adjusted over the whole audit
    alpha_share: float | None = None  # the Holm threshold this check was compared with
    tv_estimate: float | None = None
    tv_interval: tuple[float, float] | None = None
    detectable_tv: float | None = None
    tv_certificate: float | None = None  # TV <= this at confidence 1 - alpha (exact verdicts only)
    log_evidence: float | None = None  # largest log e-value of the law's e-process over its looks
    evidence: tuple[CellDeviation, ...] = field(default_factory=tuple)
    reproducer: dict | None = None  # a shrunk counterexample (exactcheck.reproducer/1)
    # observed vs expected counts on up to 32 cells (the likeliest and the most deviating), kept
    # for failed statistical checks and accepted-length laws: what the HTML report plots
    law_cells: tuple[CellDeviation, ...] = field(default_factory=tuple)
    category: Category = Category.EXACTNESS
    # deterministic findings: how likely their trigger is in real use
    reachability: Reachability | None = None
    # a crash: the subject's own frames ("file:line in function"), innermost last
    traceback: tuple[str, ...] = ()
    # the kind of evidence; None: not stated (the statistic's presence then decides, as before)
    evidence_kind: Evidence | None = None

    def describe(self) -> str:
        """Failure message in a fixed shape: a verdict line, a blank line, one fact per line
        with its bound, then how to reproduce."""
        head = f"{self.law} law in world {self.world}: {self.outcome.value} — {self.summary}"
        lines = [head, ""]
        if self.statistic is not None:
            dof = f" on {self.df} degrees of freedom" if self.df is not None else ""
            lines.append(f"{self.statistic_name}: {_num(self.statistic)}{dof}")
        if self.statistic is None and self.pvalue == 0 and self.reachability is None:
            lines.append("deterministic finding: impossible for an exact subject (p = 0); "
                         "it spends none of alpha")
        elif self.statistic is None and self.reachability is not None:
            lines.append("deterministic finding: an exact subject never does this at these random "
                         "numbers (p = 0; it spends none of alpha)")
            lines.append(f"reachability: {self.reachability.describe()}")
        elif self.evidence_kind is Evidence.SEQUENTIAL:
            lines.append(f"anytime-valid p-value 1/e: {_num(self.pvalue)} (Bonferroni-adjusted "
                         f"{_num(self.adjusted_pvalue)}, alpha share {_num(self.alpha_share)})")
        elif self.statistic is not None:
            lines.append(f"p-value: {_num(self.pvalue)} (Holm-adjusted {_num(self.adjusted_pvalue)}, "
                         f"alpha share {_num(self.alpha_share)})")
        unit = "cases" if self.world == "properties" else "samples"
        lines.append(f"{unit}: {self.samples:,} ({self.condition})")
        if self.tv_estimate is not None:
            low, high = self.tv_interval
            lines.append(f"total variation: {self.tv_estimate:.4f} (95% interval {low:.4f} to {high:.4f})")
            if self.detectable_tv is not None and self.outcome.failed:
                lines.append(f"power: at these {self.samples:,} samples a TV of {self.detectable_tv:.4f} is found "
                             f"9 times in 10; smaller ones are found less often, and this one was")
            elif self.detectable_tv is not None:
                lines.append(f"smallest TV detectable at power 0.9 with these samples: {self.detectable_tv:.4f}")
        if self.tv_certificate is not None:
            lines.append(f"certificate: TV <= {self.tv_certificate:.4f} at confidence 1 - alpha")
        if self.reproducer is not None:
            case = self.reproducer["case"]
            lines.append("minimal case: " + ", ".join(f"{k}={v}" for k, v in case.items()))
            forced = self.reproducer.get("forced_elements")
            lines.append(f"forced uniform: {self.reproducer['value']}" + (
                "" if forced is None else f"; fewest forced draws that still break it: {len(forced)} "
                f"(element {', '.join(map(str, forced[:8]))}{', ...' if len(forced) > 8 else ''} of the call's draws)"))
        for dev in self.evidence[:5]:
            lines.append(f"  {dev.cell}: observed {dev.observed:,}, expected {dev.expected:,.1f}")
        if self.traceback:
            lines.append("raised at (the subject's frames, innermost last):")
            lines += [f"  {frame}" for frame in self.traceback]
        lines.append(f"reproduce: {self.reproduce}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["outcome"] = self.outcome.value
        data["category"] = self.category.value
        data["evidence_kind"] = None if self.evidence_kind is None else self.evidence_kind.value
        data["traceback"] = list(self.traceback)
        data["tv_interval"] = list(self.tv_interval) if self.tv_interval else None
        for key in ("statistic", "pvalue", "adjusted_pvalue", "log_evidence"):
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = str(data[key])
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        data = dict(data)
        data["outcome"] = Outcome(data["outcome"])
        data["category"] = Category(data.get("category", "exactness"))
        kind = data.get("evidence_kind")
        if kind is None and str(data.get("statistic_name") or "").startswith("log e-value"):
            kind = Evidence.SEQUENTIAL.value  # a report written before the field existed
        data["evidence_kind"] = None if kind is None else Evidence(kind)
        data["reachability"] = Reachability(**data["reachability"]) if data.get("reachability") else None
        data["traceback"] = tuple(data.get("traceback", ()))
        data["tv_interval"] = tuple(data["tv_interval"]) if data["tv_interval"] else None
        data["evidence"] = tuple(CellDeviation(**e) for e in data["evidence"])
        data["law_cells"] = tuple(CellDeviation(**e) for e in data.get("law_cells", ()))
        for key in ("statistic", "pvalue", "adjusted_pvalue", "log_evidence"):
            if isinstance(data.get(key), str):
                data[key] = float(data[key])
        return cls(**data)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0 or (abs(x) >= 1e-3 and abs(x) < 1e5):
        return f"{x:.4g}"
    return f"{x:.3e}"
