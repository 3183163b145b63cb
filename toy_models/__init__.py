"""Worlds that exactcheck drives subjects through: toy laws whose exact answers are known."""
from toy_models.context_lm import ContextWorld, ToyLM, context_worlds, make_context_world
from toy_models.step_worlds import StepWorld, step_worlds, three_token

__all__ = [
    "ContextWorld",
    "StepWorld",
    "ToyLM",
    "context_worlds",
    "make_context_world",
    "step_worlds",
    "three_token",
]
