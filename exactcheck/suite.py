"""What an audit runs: levels (samples per world) and the built-in worlds."""
from __future__ import annotations

import enum
import hashlib

from toy_models import ContextWorld, StepWorld, context_worlds, step_worlds

__all__ = ["Level", "default_worlds", "derive_seed"]

class Level(enum.Enum):
    """Audit depth: the number of independent trials driven through each world."""

    QUICK = "quick"
    STANDARD = "standard"
    RELEASE = "release"

    @property
    def samples_per_world(self) -> int:
        return {Level.QUICK: 20_000, Level.STANDARD: 200_000, Level.RELEASE: 2_000_000}[self]

    @property
    def property_examples(self) -> int:
        """Random cases searched per property and forced value, after the fixed edge corpus."""
        return {Level.QUICK: 8, Level.STANDARD: 12, Level.RELEASE: 200}[self]


def default_worlds() -> list[StepWorld | ContextWorld]:
    """Every built-in world, step worlds first."""
    return [*step_worlds(), *context_worlds()]


def derive_seed(root: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` under ``root``: adding or dropping a check does not
    shift any other check's random stream."""
    digest = hashlib.sha256(f"{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)
