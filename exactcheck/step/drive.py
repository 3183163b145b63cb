"""The driver: runs a verifier through a world, vectorised over many independent trials.

``drive_steps`` gives every trial of a ``StepWorld`` one verify call with the world's fixed rows
and draft tokens drawn from its draft rows. ``drive_sequences`` runs the full speculative loop of
a ``ContextWorld`` (``exactcheck.step.speculative_loop``, the loop every sequence driver shares):
draft k tokens from the draft LM, build the target rows along the drafted prefix, call the
verifier, commit what it emits, repeat until every trial has ``length`` tokens. Trials accept
different numbers of drafts (ragged acceptance) and keep their order in the batch, so a subject
that repeats its random numbers per row is seen repeating them.

All randomness the driver itself uses (draft tokens) comes from its own seeded generator; the
subject gets a separate seeded generator. Same seed, same samples.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Callable

import torch

from exactcheck.options import DEFAULT_CALL_ELEMENTS
from exactcheck.contracts.verifier import Verifier, call_verifier, rows_keep_contract
from exactcheck.step.speculative_loop import Proposal, run_speculative_loop
from exactcheck.contracts.sampling import AliasTable, CdfTable, inverse_cdf, state_sampler
from exactcheck.stats.chain_rule import ChainWorld
from exactcheck.step.samples import Samples, SequenceSamples, StepSamples
from toy_models import ContextWorld, StepWorld, ToyLM

__all__ = ["StepSamples", "SequenceSamples", "Samples", "drive_steps", "drive_sequences", "drive", "step_inputs",
           "draft_and_rows", "drive_chain"]




def _generators(seed: int, device: torch.device) -> tuple[torch.Generator, torch.Generator]:
    driver = torch.Generator(device=device).manual_seed(seed)
    subject = torch.Generator(device=device).manual_seed(seed ^ 0x5EC0_DE5E)
    return driver, subject


def _chunks(n: int, per_row: int, max_elements: int):
    size = max(1, max_elements // per_row)
    for start in range(0, n, size):
        yield min(size, n - start)


def step_inputs(world: StepWorld, batch: int, generator: torch.Generator,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target_probs, draft_probs, draft_tokens) for ``batch`` trials of a step world, the draft
    tokens drawn exactly from the world's draft law with ``generator``."""
    k, vocab = world.draft_length, world.vocab_size
    draft_cdf = torch.from_numpy(world.draft_law().cumsum(1)).to(device)
    u = torch.rand(k, batch, dtype=torch.float64, generator=generator, device=device)
    draft_tokens = torch.stack([inverse_cdf(draft_cdf[i], u[i]) for i in range(k)], 1)
    dtype = world.input_dtype
    target = world.target_rows.to(device, dtype).expand(batch, k + 1, vocab).contiguous()
    draft = world.draft_rows.to(device, dtype).expand(batch, k, vocab).contiguous()
    return target, draft, draft_tokens


def drive_steps(verifier: Verifier, world: StepWorld, n: int, seed: int,
                device: torch.device | str = "cpu",
                max_elements: int = DEFAULT_CALL_ELEMENTS) -> StepSamples:
    """``n`` trials of one verify call each with the world's rows."""
    device = torch.device(device)
    driver_gen, subject_gen = _generators(seed, device)
    outputs, drafts, calls = [], [], 0
    for batch in _chunks(n, (world.draft_length + 1) * world.vocab_size, max_elements):
        target, draft, draft_tokens = step_inputs(world, batch, driver_gen, device)
        out = call_verifier(verifier, target, draft, draft_tokens, subject_gen)
        calls += 1
        outputs.append(out.cpu())
        drafts.append(draft_tokens.cpu())
    return StepSamples(world, torch.cat(outputs), torch.cat(drafts), seed, calls)


@functools.lru_cache(maxsize=32)
def _alias_table(model: ToyLM) -> AliasTable | CdfTable:
    return state_sampler(torch.from_numpy(model.law()))


def drive_sequences(verifier: Verifier, world: ContextWorld, n: int, seed: int,
                    device: torch.device | str = "cpu",
                    max_elements: int = DEFAULT_CALL_ELEMENTS, compile: bool = False) -> SequenceSamples:
    """``n`` speculative generations of ``world.length`` tokens from the world's prompt state.

    ``compile=True`` runs the driver's drafting and row building (``draft_and_rows``) as one
    ``torch.compile``d kernel: the same tokens and rows as eager, bit for bit (the uniforms are
    drawn eagerly from the driver's generator either way), with the row tables read once instead
    of once per op; and checks each output first with ``rows_keep_contract`` compiled (one pass;
    an output it does not pass goes through ``validate_output``, which names the broken rule).
    The first call compiles (about 10 s on a 2-core CPU; Inductor needs a C++ compiler there,
    Triton on CUDA); each new world recompiles, so the option raises torch's process-wide
    ``torch._dynamo.config.recompile_limit`` to 64 (past the default 8, torch would run the rest
    eagerly without saying so in the results)."""
    device = torch.device(device)
    driver_gen, subject_gen = _generators(seed, device)
    k, vocab = world.draft_length, world.vocab_size
    alias = _alias_table(world.draft)
    if device.type != "cpu":
        alias = copy.copy(alias).to(device)
    proposer = _ContextProposer(world, world.target.table.to(device), world.draft.table.to(device), alias,
                                _compiled_draft_and_rows() if compile else draft_and_rows)
    sequences, calls, steps = [], 0, 0
    for batch in _chunks(n, (k + 1) * vocab, max_elements):
        seq, used, active = run_speculative_loop(verifier, proposer, batch, world.length, driver_gen,
                                                 subject_gen, device,
                                                 check_rows=_compiled_rows_keep_contract() if compile else None)
        sequences.append(seq.cpu())
        calls, steps = calls + used, steps + active
    return SequenceSamples(world, torch.cat(sequences), seed, calls, steps)


def draft_and_rows(state: torch.Tensor, u: torch.Tensor, world: ContextWorld, sampler: AliasTable | CdfTable,
                   target_table: torch.Tensor, draft_table: torch.Tensor) -> Proposal:
    """k drafts per trial from the draft LM's ``sampler`` with the driver's uniforms ``u`` [k, r],
    and the target and draft rows along the drafted path (pure: no generator, no Python loop over
    trials, so ``torch.compile`` can fuse it)."""
    k, rows = u.shape
    states, drafted, s = [state], [], state
    for i in range(k):
        x = sampler.sample(s, u[i])
        drafted.append(x)
        s = world.next_state(s, x)
        states.append(s)
    path = torch.stack(states, 1)
    target = target_table.index_select(0, path.reshape(-1)).view(rows, k + 1, -1)
    draft = draft_table.index_select(0, path[:, :k].reshape(-1)).view(rows, k, -1)
    return Proposal(target, draft, torch.stack(drafted, 1), path)


def _allow_recompiles():
    # each world (vocabulary, draft length, table) is a recompilation of the same function;
    # past torch's default limit of 8 it would silently run eager, so allow a sweep's worth
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, 64)


@functools.lru_cache(maxsize=1)
def _compiled_draft_and_rows():
    _allow_recompiles()
    return torch.compile(draft_and_rows)


@functools.lru_cache(maxsize=1)
def _compiled_rows_keep_contract():
    _allow_recompiles()
    return torch.compile(rows_keep_contract)


@dataclass(frozen=True)
class _ContextProposer:
    """Drafts from the draft LM's sampler, rows from the two LMs' tables along the drafted path;
    a trial's state is the context world's state."""

    world: ContextWorld
    target_table: torch.Tensor
    draft_table: torch.Tensor
    draft_sampler: AliasTable | CdfTable
    build: Callable[..., Proposal] = draft_and_rows  # ``draft_and_rows`` or its compiled form

    @property
    def draft_length(self) -> int:
        return self.world.draft_length

    def start(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch,), self.world.prompt_state, dtype=torch.int64, device=device)

    def propose(self, state, filled, generator) -> Proposal:
        u = torch.rand(self.world.draft_length, state.numel(), dtype=torch.float64, generator=generator,
                       device=state.device)
        return self.build(state, u, self.world, self.draft_sampler, self.target_table, self.draft_table)

    def advance(self, path, accepted, token) -> torch.Tensor:
        # the accepted drafts are a prefix of the drafted path, so the state after them is known;
        # one transition adds the correction or bonus token
        return self.world.next_state(path.gather(1, accepted[:, None])[:, 0], token)


def drive(verifier: Verifier, world: StepWorld | ContextWorld, n: int, seed: int,
          device: torch.device | str = "cpu", max_elements: int = DEFAULT_CALL_ELEMENTS) -> Samples:
    """Drive ``verifier`` through either kind of world."""
    if isinstance(world, StepWorld):
        return drive_steps(verifier, world, n, seed, device, max_elements)
    if isinstance(world, ContextWorld):
        return drive_sequences(verifier, world, n, seed, device, max_elements)
    raise TypeError(f"not a world: {type(world).__name__}")


def drive_chain(verifier: Verifier, world: ChainWorld, n: int, seed: int,
                device: torch.device | str = "cpu", batch: int = 128) -> SequenceSamples:
    """``n`` speculative generations through ``world``: draft k tokens from the draft
    conditionals, build the k + 1 target rows along the drafted path, verify, commit, repeat.
    Rows are handed to the subject in float32 and drafts are drawn exactly from the float32 draft
    row (so the reported q is the q sampled from); the checks use the float64 rows, from which
    float32 rounding moves a row by TV < 1e-7."""
    device = torch.device(device)
    driver = torch.Generator(device=device).manual_seed(seed)
    subject = torch.Generator(device=device).manual_seed(seed ^ 0x5EC0_DE5E)
    out, calls, steps = [], 0, 0
    for start in range(0, n, batch):
        size = min(batch, n - start)
        # every row handed to the subject is live (compacted whenever a trial finishes)
        seq, used, rows = run_speculative_loop(verifier, _ChainProposer(world), size, world.length, driver,
                                               subject, device, compact_at=1.0)
        out.append(seq.cpu())
        calls, steps = calls + used, steps + rows
    return SequenceSamples(world, torch.cat(out), seed, calls, steps)


@dataclass(frozen=True)
class _ChainProposer:
    """Drafts drawn exactly from the float32 draft rows, target rows along the drafted path; a
    trial's state is its last token (the world's conditionals depend on it and the position)."""

    world: ChainWorld

    @property
    def draft_length(self) -> int:
        return self.world.draft_length

    def start(self, batch: int, device: torch.device) -> torch.Tensor:
        return torch.full((batch,), self.world.bos, dtype=torch.int64, device=device)

    def propose(self, state, filled, generator) -> Proposal:
        previous, path, drafted, draft_rows, target_rows = state, [state], [], [], []
        for i in range(self.world.draft_length):
            q = self.world.draft_rows(previous, filled + i, torch.float32)
            u = torch.rand(state.numel(), dtype=torch.float64, generator=generator, device=state.device)
            cdf = torch.cumsum(q, -1, dtype=torch.float64)
            x = inverse_cdf(cdf, u * cdf[:, -1])
            target_rows.append(self.world.target_rows(previous, filled + i, torch.float32))
            draft_rows.append(q)
            drafted.append(x)
            path.append(x)
            previous = x
        target_rows.append(self.world.target_rows(previous, filled + self.world.draft_length, torch.float32))
        return Proposal(torch.stack(target_rows, 1), torch.stack(draft_rows, 1), torch.stack(drafted, 1),
                        torch.stack(path, 1))

    def advance(self, path, accepted, token) -> torch.Tensor:
        return token
