"""The speculative loop every sequence driver shares: propose k drafts with their rows, verify,
commit what the verifier emits, repeat until each trial has ``length`` tokens.

A ``Proposer`` is what differs between worlds: where a trial starts (``start``), how its next k
drafts and the target/draft rows along them are made (``propose``; the drafts are drawn from the
driver's generator) and which state a trial is in after the verifier accepted some drafts and
emitted one more token (``advance``). ``exactcheck.step.drive`` uses one for the enumerable
context worlds, ``exactcheck.stats.chain_rule`` one for the large teacher-forced worlds.

Trials accept different numbers of drafts (ragged acceptance); each keeps its batch row until
few enough rows are live (``compact_at``); then the live trials are compacted, in order, so that
finished trials stop costing verify work. Which rows the subject sees, and so its random stream,
depends only on the seeds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from exactcheck.contracts.verifier import PADDING, Verifier, call_verifier

__all__ = ["Proposal", "Proposer", "run_speculative_loop"]


@dataclass(frozen=True)
class Proposal:
    """One verify call's inputs for ``r`` trials, and where each trial is along its drafts."""

    target_probs: torch.Tensor  # [r, k+1, V]
    draft_probs: torch.Tensor  # [r, k, V]
    draft_tokens: torch.Tensor  # [r, k] int64
    path: torch.Tensor  # [r, k+1]: the trial's state after 0, 1, ..., k drafts


class Proposer(Protocol):
    draft_length: int

    def start(self, batch: int, device: torch.device) -> torch.Tensor:
        """The state of ``batch`` fresh trials."""

    def propose(self, state: torch.Tensor, filled: torch.Tensor, generator: torch.Generator) -> Proposal:
        """Drafts and rows for trials in ``state`` with ``filled`` tokens so far."""

    def advance(self, path: torch.Tensor, accepted: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        """The state after ``accepted`` drafts of ``path`` and then ``token``."""


def run_speculative_loop(verifier: Verifier, proposer: Proposer, batch: int, length: int,
                         driver_gen: torch.Generator, subject_gen: torch.Generator, device: torch.device,
                         compact_at: float = 0.5, check_rows=None) -> tuple[torch.Tensor, int, int]:
    """``batch`` generations of ``length`` tokens: (sequences [batch, length] int64, verify calls,
    verify steps done for trials still short of ``length``). Live trials are compacted when at
    most ``compact_at`` of the rows handed to the verifier are live (1.0: whenever one finished,
    so every row handed over is live; 0.5: at most twice the useful work, fewer index copies).
    ``check_rows``: the fast output check ``call_verifier`` takes (the compiled driver's)."""
    k = proposer.draft_length
    offsets = torch.arange(k + 1, device=device)
    # each call writes the k + 1 entries from a trial's fill point on (tokens, then padding the
    # next call overwrites); a finished trial still handed over writes past ``length``, so the
    # row has room for ``length + 2k + 1`` entries and no write needs masking
    width = length + 2 * k + 1
    seq = torch.full((batch * width,), PADDING, dtype=torch.int64, device=device)
    trial = torch.arange(batch, device=device)
    state = proposer.start(batch, device)
    filled = torch.zeros(batch, dtype=torch.int64, device=device)
    calls = steps = 0
    while trial.numel():
        rows = trial.numel()
        proposal = proposer.propose(state, filled, driver_gen)
        live = filled < length
        steps += int(live.sum())
        out = call_verifier(verifier, proposal.target_probs, proposal.draft_probs, proposal.draft_tokens,
                            subject_gen, check_rows=check_rows)
        calls += 1
        path = proposal.path
        del proposal  # the rows' memory is free for the next call's before that call builds them
        emitted = (out != PADDING).sum(1)
        seq.scatter_(0, ((trial * width + filled)[:, None] + offsets).reshape(-1), out.reshape(-1))
        accepted = emitted - 1
        after = proposer.advance(path, accepted, out.gather(1, accepted[:, None])[:, 0])
        state = torch.where(live, after, state)
        filled = filled + emitted * live
        live = filled < length
        alive = int(live.sum())
        if alive < rows and alive <= compact_at * rows:
            trial, state, filled = trial[live], state[live], filled[live]
    return seq.view(batch, width)[:, :length], calls, steps
