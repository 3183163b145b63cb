"""The samples a drive hands to the statistics: what a verifier emitted on independent trials of a
step world, or the first tokens of independent speculative generations. The statistics read
these records (``exactcheck.step.laws.compare``); the drives (``exactcheck.step.drive``) make them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

from exactcheck.options import PADDING
from toy_models import ContextWorld, StepWorld

__all__ = ["StepSamples", "SequenceSamples", "Samples"]


@dataclass(frozen=True)
class StepSamples:
    """What a verifier emitted on ``n`` independent one-call trials of a step world."""

    world: StepWorld
    outputs: torch.Tensor  # [n, k+1] int64, validated
    draft_tokens: torch.Tensor  # [n, k] int64
    seed: int
    calls: int

    @property
    def size(self) -> int:
        return self.outputs.shape[0]

    @property
    def accepted(self) -> torch.Tensor:
        """Number of drafts accepted per trial (emitted tokens - 1)."""
        return (self.outputs != PADDING).sum(1) - 1

    @property
    def last_token(self) -> torch.Tensor:
        """The correction or bonus token of each trial."""
        return self.outputs.gather(1, self.accepted[:, None])[:, 0]


@dataclass(frozen=True)
class SequenceSamples:
    """The first ``world.length`` tokens of ``n`` independent speculative generations (of a
    ``ContextWorld`` here, or a large-vocabulary world driven by ``exactcheck.step.drive.drive_chain``)."""

    world: ContextWorld
    sequences: torch.Tensor  # [n, L] int64
    seed: int
    calls: int
    steps: int  # verify steps done for trials still short of `length` (the useful work)

    @property
    def size(self) -> int:
        return self.sequences.shape[0]


Samples = Union[StepSamples, SequenceSamples]
