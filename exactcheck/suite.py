"""The built-in suite: the step and context worlds every step audit drives, and the large worlds
audited when named (``exactcheck.step.plan`` plans them)."""
from __future__ import annotations

from toy_models import ContextWorld, StepWorld, context_worlds, step_worlds

__all__ = ["default_worlds", "large_worlds"]

def default_worlds() -> list[StepWorld | ContextWorld]:
    """Every built-in world, step worlds first."""
    return [*step_worlds(), *context_worlds()]


def large_worlds():
    """Worlds audited only when named (``--world``): their laws are never enumerated and they
    are checked by the chain-rule tests (``exactcheck.stats.chain_rule``); V = 50,000 costs minutes."""
    from toy_models.zipf_world import zipf_world
    return [zipf_world()]
