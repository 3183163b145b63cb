"""A law to check, as data: its cells' exact expected probabilities (``LawPlan``) and the counts the
samples put in them (``LawComparison``). The statistics read nothing else: the worlds that make the
expected laws live with the audit kinds (``exactcheck.step.laws`` for step and context worlds, which
also says which laws judge exactness and which conformance; ``exactcheck.generation.laws`` for a
decoding policy's sequence law), so this module knows no world."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


__all__ = ["LawComparison", "LawPlan", "MIN_CONDITIONAL_SAMPLES", "CONFORMANCE_LAWS"]

# A conditional law (correction, bonus) is checked only when the exact law expects at least this
# many trials in its condition; the choice depends on the law and n, never on the samples.
MIN_CONDITIONAL_SAMPLES = 100
# the step laws that depend on the verification rule
CONFORMANCE_LAWS = ("accepted_length", "correction_token", "step_output")


@dataclass(frozen=True)
class LawPlan:
    """One law to check on a world: its name, condition and exact expected law. ``conformance``:
    the law is rule-specific (a conformance check); ``alternatives``: for a subject that declares
    no rule, (rule, expected law) for every registered exact rule; ``lossy``: for a subject that
    declares a lossy rule, what its rule costs on this world."""

    law: str
    condition: str
    expected: np.ndarray
    label: Callable[[int], str]
    condition_probability: float = 1.0  # P(a trial counts for this law), exact (under the planning rule)
    conformance: bool = False
    alternatives: tuple[tuple[str, np.ndarray], ...] = ()
    lossy_rule: str = ""  # the lossy rule declared, and what it costs on the world:
    lossy_tv: float | None = None  # the exact TV of its output law from the target's
    # coarsenings of a joint law its e-process also watches (cell -> group maps): each a mixture
    # with fewer cells to learn (``exactcheck.stats.sequential.EProcess``)
    groupings: tuple = ()

    @property
    def lossy(self) -> str:
        if not self.lossy_rule:
            return ""
        return (f"lossy by design ({self.lossy_rule}): its output law on this world is TV {self.lossy_tv:.4f} "
                "from the target's (exact)")


@dataclass(frozen=True)
class LawComparison:
    plan: LawPlan
    counts: np.ndarray
