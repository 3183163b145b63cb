"""Driving a tree verifier through a tree world's speculative loop.

Each of ``n`` trials starts at the world's prompt state; every verify call draws one tree per live
trial (``TreeWorld.draw_tree``, from the driver's generator), hands the batch to the subject
(``call_tree_verifier``, with the subject's own generator) and commits what it emits; a trial
stops at ``length`` tokens. Kept: the first ``length`` tokens of every trial (the sequence law:
exactness) and the first call's emitted tuple per trial (one step's law: conformance to a declared
rule). Batched over trials; every trial's trees depend only on the seeds.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.tree_verifier import call_tree_verifier
from toy_models.tree_worlds import TreeWorld

__all__ = ["TreeSamples", "drive_tree"]


@dataclass(frozen=True)
class TreeSamples:
    world: TreeWorld
    sequences: torch.Tensor  # [n, length] int64
    first_steps: tuple[tuple[int, ...], ...]  # each trial's first emitted tuple
    calls: int
    accepted: int  # path tokens accepted over all calls (what the tree buys)

    @property
    def size(self) -> int:
        return self.sequences.shape[0]


def drive_tree(subject, world: TreeWorld, n: int, seed: int, device="cpu", batch: int = 4096) -> TreeSamples:
    """``n`` trials of ``world.length`` tokens through the loop; raises ``SubjectError`` at the
    first call that crashes or breaks the contract."""
    driver = torch.Generator().manual_seed(seed)
    subject_gen = torch.Generator(device=device).manual_seed(seed + 1)
    length = world.length
    sequences, firsts = [], []
    calls = accepted = 0
    for start in range(0, n, batch):
        size = min(batch, n - start)
        seq = torch.full((size, length + world.depth + 1), -1, dtype=torch.int64)  # room for one overshoot
        filled = torch.zeros(size, dtype=torch.int64)
        state = torch.full((size,), world.world.prompt_state, dtype=torch.int64)
        first_call = True
        while True:
            live = (filled < length).nonzero()[:, 0]
            if live.numel() == 0:
                break
            p, q, tokens, parents, _ = world.draw_tree(state[live], driver)
            out = call_tree_verifier(subject, p.to(device), q.to(device), tokens.to(device), parents.to(device),
                                     subject_gen).cpu()
            calls += 1
            emitted = (out >= 0).sum(1)
            accepted += int((emitted - 1).sum())
            if first_call:  # every trial is live at the first call: its emitted tuple is one step's law
                firsts += [tuple(row[:k].tolist()) for row, k in zip(out, emitted.tolist())]
                first_call = False
            columns = filled[live, None] + torch.arange(out.shape[1])[None]
            seq[live[:, None].expand_as(out), columns] = out
            s_live = state[live]
            for j in range(out.shape[1]):
                s_live = torch.where(j < emitted, world.world.next_state(s_live, out[:, j].clamp(min=0)), s_live)
            state[live] = s_live
            filled[live] += emitted
        sequences.append(seq[:, :length])
    return TreeSamples(world, torch.cat(sequences), tuple(firsts), calls, accepted)
