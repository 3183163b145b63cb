"""Driving a generator through a recurrent-state world: the generations, the KV invariants, and the
state invariants of every forward call and of every final cache handed back.

``drive_recurrent`` calls the generator ``n`` times (batch-1, or through the batched contract in
batches), each generation with the seed it has in the whole run (``exactcheck.generation.drive
.generation_seed``), records every forward call of both models (``RecurrentForwardCall``: the KV
record and, per row, the state each mixer read) and checks, per generation, the KV invariants of
``exactcheck.generation.cache_invariants`` (batch-1 only: a batched call serves many generations) and
the state invariants of ``exactcheck.recurrent.invariants`` (every call: they are local to it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.generation.cache_invariants import check_calls
from exactcheck.generation.drive import GeneratorSamples, generation_seed
from exactcheck.contracts.generator import DecodingPolicy, call_generator, call_generator_batch, is_batched
from exactcheck.errors import SubjectError
from exactcheck.recurrent.invariants import StateBreach, check_state_calls, final_states

__all__ = ["RecurrentSamples", "drive_recurrent", "drive_shard"]


@dataclass(frozen=True)
class RecurrentSamples:
    """The generations (``samples``, as the generator audit's laws read them) and every state
    breach with the generation it happened in (-1: a batched call, several generations)."""

    samples: GeneratorSamples
    state_breaches: tuple[tuple[int, StateBreach], ...] = ()
    state_calls: int = 0  # forward calls whose states were checked
    final_states_checked: int = 0

    @property
    def size(self) -> int:
        return self.samples.size


def drive_recurrent(generator, world, n: int, seed: int, policy: DecodingPolicy, *, device="cpu", first: int = 0,
                    progress=None, batch: int = 64) -> RecurrentSamples:
    """``n`` generations of ``world`` (a ``toy_models.recurrent_lm.RecurrentModelWorld``); raises the
    first ``SubjectError``."""
    target, draft = (m.to(device) for m in world.models())
    prompt = world.prompt_ids().to(device)
    outputs, breaches, state_breaches = [], [], []
    calls = cached = checked = finals = 0
    batched = is_batched(generator)
    step = batch if batched else 1
    for start in range(first, first + n, step):
        size = min(step, first + n - start)
        log: list = []
        target.calls = draft.calls = log
        try:
            if batched:
                answers = call_generator_batch(generator, target, draft, [prompt[0]] * size, policy, world.new_tokens,
                                               [generation_seed(seed, start + j) for j in range(size)],
                                               world.vocab_size)
            else:
                answers = [call_generator(generator, target, draft, prompt, policy, world.new_tokens,
                                          generation_seed(seed, start), world.vocab_size)]
        finally:
            target.calls = draft.calls = None
        calls += len(log)
        cached += sum(1 for call in log if call.cached_tokens)
        found = check_state_calls(log, world.mixers)
        state_breaches += [(start if not batched else -1, b) for b in found]
        for j, (new, generation) in enumerate(answers):
            i = start + j
            outputs.append(tuple(new.tolist()))
            final = torch.cat([prompt[0].cpu(), new])
            if not batched:
                breaches += [(i, b) for b in check_calls(log, final.tolist())]
            for model, cache, role in ((target, generation.target_cache, "target"),
                                       (draft, generation.draft_cache, "draft")):
                if cache is not None:
                    finals += 1
                    state_breaches += [(i, b) for b in final_states(model, cache, final, role)]
            checked += sum(c is not None for c in (generation.target_cache, generation.draft_cache))
        if progress is not None:
            progress(size)
    samples = GeneratorSamples(world, policy, tuple(outputs), seed, calls, tuple(breaches), 0, cached,
                               batched=batched)
    return RecurrentSamples(samples, tuple(state_breaches), calls, finals)


def drive_shard(generator, world, n: int, seed: int, policy: DecodingPolicy, device: str, first: int):
    """One range of a run's generations (in a ``--jobs`` worker): the samples, or the subject's error."""
    try:
        return drive_recurrent(generator, world, n, seed, policy, device=device, first=first)
    except SubjectError as exc:
        return exc
