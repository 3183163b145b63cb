"""Driving an end-to-end generator through a model world.

``drive_generator`` calls the generator ``n`` times on the world's prompt (batch size 1: that is
what transformers' assisted generation supports; a generator with the batched contract gets many
requests per call), each generation with its own seed derived from the run's seed, and keeps the new tokens of each (``length`` of them, or fewer up to a stop token). With ``probe=True`` the world's models
record every forward call, and the cache-rollback invariants (``exactcheck.generation.cache_invariants``)
are checked after each generation, as is any final cache the generator hands back.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from exactcheck.generation.cache_invariants import Breach, check_calls, final_cache
from exactcheck.contracts.generator import DecodingPolicy, Generation, call_generator, call_generator_batch, is_batched
from exactcheck.errors import SubjectError
from exactcheck.executors import split
from exactcheck.options import derive_seed
from toy_models.hf_toy_lm import ModelWorld

__all__ = ["GeneratorSamples", "DraftStatistics", "drive_generator", "drive_generator_sharded", "merge_samples"]


@dataclass(frozen=True)
class GeneratorSamples:
    """What ``n`` generations produced: each output's new tokens (shorter than the world's
    length when it ends with a stop token), and every broken cache invariant with the
    generation it happened in."""

    world: ModelWorld
    policy: DecodingPolicy
    outputs: tuple[tuple[int, ...], ...]
    seed: int
    forward_calls: int
    breaches: tuple[tuple[int, Breach], ...] = field(default_factory=tuple)
    final_caches_checked: int = 0
    cached_calls: int = 0  # forward calls that found a non-empty cache
    batched: bool = False  # driven through the batched contract: a forward call serves many generations
    # the drafts the generator reported with their q (``Generation.drafts``): see ``DraftStatistics``
    drafts: "DraftStatistics | None" = None

    @property
    def keeps_cache(self) -> bool:
        """Whether the generator kept any cache (a call found one filled, or it handed one back)."""
        return self.cached_calls > 0 or self.final_caches_checked > 0

    @property
    def size(self) -> int:
        return len(self.outputs)


@dataclass(frozen=True)
class DraftStatistics:
    """What the drafts a generator reported (token and q) say about whether the tokens follow q:
    each draft's randomised PIT in descending-q order (ties by id; i.i.d. uniform when every draft
    was drawn from its q given the past, Rosenblatt 1952), how many were q's argmax against the
    expected count, and drafts whose own q gives them probability 0."""

    pits: tuple[float, ...] = ()
    argmax: int = 0
    argmax_expected: float = 0.0
    impossible: int = 0
    generations: int = 0  # generations that reported drafts

    @property
    def count(self) -> int:
        return len(self.pits)

    def add(self, records, seed: int) -> "DraftStatistics":
        """These statistics with one generation's ``DraftRecord``s added (randomised with ``seed``)."""
        if not records:
            return self
        from exactcheck.stats.chain_rule import row_statistics
        q = torch.stack([torch.as_tensor(r.q, dtype=torch.float64).reshape(-1).cpu() for r in records])
        q = q / q.sum(1, keepdim=True)
        tokens = torch.tensor([int(r.token) for r in records], dtype=torch.int64)
        t = row_statistics(q, q, tokens)
        v = torch.rand(tokens.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        pits = (t["below_p"] + v * t["p"]).clamp(0, 1)
        return DraftStatistics(self.pits + tuple(pits.tolist()), self.argmax + int(t["agree"].sum()),
                               self.argmax_expected + float(t["agree_mean"].sum()),
                               self.impossible + int((t["p"] <= 0).sum()), self.generations + 1)

    def merged(self, other: "DraftStatistics | None") -> "DraftStatistics":
        if other is None:
            return self
        return DraftStatistics(self.pits + other.pits, self.argmax + other.argmax,
                               self.argmax_expected + other.argmax_expected, self.impossible + other.impossible,
                               self.generations + other.generations)


def _with_drafts(drafts: "DraftStatistics | None", generation: Generation, seed: int, i: int):
    records = generation.drafts
    if records is None:
        return drafts
    return (drafts or DraftStatistics()).add(list(records), derive_seed(seed, f"draft_pit/{i}"))


def generation_seed(seed: int, i: int) -> int:
    """The seed of generation ``i`` of a run seeded ``seed`` (stable, 63 bits)."""
    return derive_seed(seed, f"generation/{i}")


def drive_generator(generator, world: ModelWorld, n: int, seed: int, policy: DecodingPolicy,
                    probe: bool = True, progress=None, device: torch.device | str = "cpu",
                    batch: int | None = None, first: int = 0) -> GeneratorSamples:
    """``n`` generations of ``world.length`` tokens; raises ``SubjectError`` (crash, contract
    violation) at the first generation that fails, as the step driver does. The models and the
    prompt are placed on ``device``; outputs come back to the CPU. ``progress(k)``, if given, is
    called every 25 generations (and at the end) with the number finished since its last call.

    A batched generator (``exactcheck.contracts.generator.is_batched``) is called with ``batch``
    requests at a time (default: its ``max_batch``, else 256), generation ``i`` with the same
    seed as in a batch-1 run. Its forward calls serve many generations at once, so the
    per-generation cache invariants are not checked (``GeneratorSamples.batched``); final caches
    it hands back still are.

    ``first``: the index of the first generation (a shard of a run drives generations ``first``
    to ``first + n - 1``, with the seeds they have in the whole run)."""
    if is_batched(generator):
        return _drive_batched(generator, world, n, seed, policy, probe, progress, device,
                              batch or getattr(generator, "max_batch", None) or 256, first)
    target, draft = (m.to(device) for m in world.models())
    keywords = world.generator_keywords()
    prompt = world.prompt_ids().to(device)
    outputs = []
    breaches: list[tuple[int, Breach]] = []
    calls = checked = cached = 0
    drafts = None
    for i in range(first, first + n):
        log = [] if probe else None
        _record(target, draft, world, log)
        try:
            new, generation = call_generator(generator, target, draft, prompt, policy, world.new_tokens,
                                             generation_seed(seed, i), world.vocab_size, keywords=keywords)
        finally:
            target.calls = draft.calls = None
        outputs.append(tuple(new.tolist()))
        drafts = _with_drafts(drafts, generation, seed, i)
        if probe:
            calls += len(log)
            cached += sum(1 for call in log if call.cached_tokens)
            final = torch.cat([prompt[0].cpu(), new])
            found = check_calls(log, final.tolist())
            found += _final_caches(target, draft, generation, final, world.shared_vocabulary)
            checked += sum(c is not None for c in (generation.target_cache, generation.draft_cache))
            breaches.extend((i, b) for b in found)
        done = i + 1 - first
        if progress is not None and (done % 25 == 0 or done == n):
            progress(done % 25 or 25)  # generations finished since the last report
    return GeneratorSamples(world, policy, tuple(outputs), seed, calls, tuple(breaches), checked, cached,
                            drafts=drafts)


def _record(target, draft, world: ModelWorld, log: list | None) -> None:
    """Record the forward calls into ``log``: both models' where they share the target's
    vocabulary; the target's alone where the draft has its own (its cache holds draft ids, which
    the committed-prefix invariants, stated in target ids, cannot judge)."""
    target.calls = log
    draft.calls = log if world.shared_vocabulary else None


def _final_caches(target, draft, generation: Generation, final: torch.Tensor,
                  shared_vocabulary: bool = True) -> list[Breach]:
    found = []
    roles = ((target, generation.target_cache, "target", 1),) + (
        ((draft, generation.draft_cache, "draft", 2),) if shared_vocabulary else ())
    for model, cache, role, slack in roles:
        if cache is not None:
            found += final_cache(model, cache, final[None], role, slack=slack)
    return found


def _drive_batched(generator, world: ModelWorld, n: int, seed: int, policy: DecodingPolicy, probe: bool,
                   progress, device, batch: int, first: int = 0) -> GeneratorSamples:
    target, draft = (m.to(device) for m in world.models())
    keywords = world.generator_keywords()
    prompt = world.prompt_ids().to(device)[0]
    outputs = []
    breaches: list[tuple[int, Breach]] = []
    calls = checked = cached = 0
    drafts = None
    for start in range(first, first + n, batch):
        size = min(batch, first + n - start)
        log = [] if probe else None
        _record(target, draft, world, log)
        try:
            answers = call_generator_batch(generator, target, draft, [prompt] * size, policy, world.new_tokens,
                                           [generation_seed(seed, start + j) for j in range(size)],
                                           world.vocab_size, keywords=keywords)
        finally:
            target.calls = draft.calls = None
        for j, (new, generation) in enumerate(answers):
            outputs.append(tuple(new.tolist()))
            drafts = _with_drafts(drafts, generation, seed, start + j)
            if probe:
                found = _final_caches(target, draft, generation, torch.cat([prompt.cpu(), new]),
                                      world.shared_vocabulary)
                checked += sum(c is not None for c in (generation.target_cache, generation.draft_cache))
                breaches.extend((start + j, b) for b in found)
        if probe:
            calls += len(log)
            cached += sum(1 for call in log if call.cached_tokens)
        if progress is not None:
            progress(size)
    return GeneratorSamples(world, policy, tuple(outputs), seed, calls, tuple(breaches), checked, cached,
                            batched=True, drafts=drafts)


def drive_shard(generator, world: ModelWorld, n: int, seed: int, policy: DecodingPolicy, device: str,
                first: int):
    """One shard of a run (what a Ray task runs; the world's models are built where it runs):
    the shard's ``GeneratorSamples``, or the subject's failure as a value."""
    try:
        return drive_generator(generator, world, n, seed, policy, device=device, first=first)
    except SubjectError as exc:
        return exc


def drive_generator_sharded(generator, world: ModelWorld, n: int, seed: int, policy: DecodingPolicy,
                            executor, shards: int, device: str = "cpu", progress=None) -> GeneratorSamples:
    """``drive_generator`` split into ``shards`` ranges of generations run on ``executor``; every
    generation keeps its seed, so the merged samples are the unsharded run's. Raises the first
    failing shard's ``SubjectError``."""
    parts, calls, first = split(n, shards), [], 0
    for size in parts:
        calls.append((generator, world, size, seed, policy, str(device), first))
        first += size
    results = []
    for size, result in zip(parts, executor.submit(drive_shard, calls)):
        value = result()
        if isinstance(value, SubjectError):
            raise value
        results.append(value)
        if progress is not None:
            progress(size)
    return merge_samples(results)


def merge_samples(parts: list[GeneratorSamples]) -> GeneratorSamples:
    """The samples of consecutive shards of one run, as one run's."""
    first = parts[0]
    return GeneratorSamples(first.world, first.policy, tuple(o for p in parts for o in p.outputs), first.seed,
                            sum(p.forward_calls for p in parts), tuple(b for p in parts for b in p.breaches),
                            sum(p.final_caches_checked for p in parts), sum(p.cached_calls for p in parts),
                            any(p.batched for p in parts), _merged_drafts(parts))


def _merged_drafts(parts: list[GeneratorSamples]) -> DraftStatistics | None:
    reported = [p.drafts for p in parts if p.drafts is not None]
    if not reported:
        return None
    out = reported[0]
    for more in reported[1:]:
        out = out.merged(more)
    return out
