"""What an audit runs: levels (the TV each law is planned to detect) and the built-in worlds."""
from __future__ import annotations

import enum
import hashlib

from toy_models import ContextWorld, StepWorld, context_worlds, step_worlds

__all__ = ["Level", "default_worlds", "large_worlds", "derive_seed"]

class Level(enum.Enum):
    """Audit depth, defined by the TV every law is planned to detect with power 0.9 at its
    share of alpha (``exactcheck.planning``), and the most trials one world may use for it."""

    QUICK = "quick"
    STANDARD = "standard"
    RELEASE = "release"

    @property
    def detect_tv(self) -> float:
        return {Level.QUICK: 0.05, Level.STANDARD: 0.01, Level.RELEASE: 0.003}[self]

    @property
    def max_samples(self) -> int:
        """The cap on trials per world; a law whose condition is too rare to reach ``detect_tv``
        within it is reported with the TV it does reach."""
        return {Level.QUICK: 50_000, Level.STANDARD: 1_000_000, Level.RELEASE: 10_000_000}[self]

    @property
    def chain_sequences(self) -> int:
        """Sequences generated through a large-vocabulary chain-rule world (``large_worlds``)."""
        return {Level.QUICK: 200, Level.STANDARD: 1_000, Level.RELEASE: 5_000}[self]

    @property
    def min_samples(self) -> int:
        """The floor on trials per world. Certifying "TV <= eps" costs more than detecting eps
        (the bound adds a concentration radius to the plug-in TV); the floor lets a passing
        audit certify a three-cell law to about the level's TV (standard: <= 0.01)."""
        return {Level.QUICK: 5_000, Level.STANDARD: 150_000, Level.RELEASE: 1_500_000}[self]

    @property
    def property_examples(self) -> int:
        """Random cases searched per property and forced value, after the fixed edge corpus."""
        return {Level.QUICK: 8, Level.STANDARD: 12, Level.RELEASE: 200}[self]


def default_worlds() -> list[StepWorld | ContextWorld]:
    """Every built-in world, step worlds first."""
    return [*step_worlds(), *context_worlds()]


def large_worlds():
    """Worlds audited only when named (``--world``): their laws are never enumerated and they
    are checked by the chain-rule tests (``exactcheck.chain_rule``); V = 50,000 costs minutes."""
    from toy_models.zipf_world import zipf_world
    return [zipf_world()]


def derive_seed(root: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` under ``root``: adding or dropping a check does not
    shift any other check's random stream."""
    digest = hashlib.sha256(f"{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
