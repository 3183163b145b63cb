"""Exact end-to-end generators written differently from ``exactcheck.e2e.loop``.

* ``CacheFreeLoop``: keeps no KV cache at all; every forward call recomputes the whole prefix
  (as many reference implementations do). Verifies with ``mirrored_uniform_product``.
* ``DraftRecomputeLoop``: the target keeps a cache and crops it after each round; the draft
  keeps none and recomputes its prefix every round. Verifies with ``exponential_race``.
* ``SlotCacheLoop``: both models keep a hand-rolled KV cache (``SlotCache``: preallocated slots
  and a length pointer, as serving engines keep theirs; rollback moves the pointer back and leaves
  the rejected entries in place, to be overwritten), drafts by inverse CDF on float64
  ``torch.rand`` uniforms, verifies with ``float64_nonstrict_guarded`` and reports every draft's
  q. Its cache is not transformers', so cache invariants are exercised outside transformers.
* ``transformers-assisted`` (``exactcheck.adapters.hf_generate.AssistedGeneration``): other
  people's code, transformers' own assisted generation. Exact in law, with one boundary finding
  of its own: ``_speculative_sampling`` accepts when ``r <= p/q``, so a float32 uniform of exactly
  0 (probability 2^-24 per draw) accepts a draft the target gives probability 0 (the step audit's
  finding in reports/transformers-speculative-sampling.md, found end to end by
  ``forced_no_forbidden_token``).

Cache-rollback invariants judge the caches that exist; for ``CacheFreeLoop`` there is none, the
check is not applicable, and the laws decide. ``CORRECT_GENERATORS`` names them all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.transformers_compat import forward, new_cache
from exactcheck.corpus.verifiers import exponential_race, float64_nonstrict_guarded, mirrored_uniform_product
from exactcheck.contracts.generator import Capabilities, DecodingPolicy, DraftRecord, Generation

__all__ = ["CacheFreeLoop", "DraftRecomputeLoop", "SlotCache", "SlotCacheLoop", "CORRECT_GENERATORS",
           "correct_generators", "KNOWN_FINDINGS"]


def _rows(model, tokens: torch.Tensor, policy: DecodingPolicy, prefixes, last: int, cache=None,
          start: int = 0) -> torch.Tensor:
    """The policy's law (float64) at the last ``last`` positions of ``tokens`` (a 1-D tensor);
    with a ``cache`` only ``tokens[start:]`` is fed, at positions from ``start``."""
    feed = tokens[start:]
    positions = torch.arange(start, start + feed.numel(), device=tokens.device)
    out = forward(model, feed[None], cache, position_ids=positions[None], use_cache=cache is not None)
    return policy.probabilities(out.logits[0, -last:], prefixes)


def _stop(emitted: list[int], policy: DecodingPolicy) -> tuple[list[int], bool]:
    for i, token in enumerate(emitted):
        if token in policy.stop_tokens:
            return emitted[:i + 1], True
    return emitted, False


@dataclass(frozen=True)
class CacheFreeLoop:
    """Speculative sampling that recomputes every prefix from scratch: no cache anywhere."""

    draft_length: int = 3
    name: str = "corpus: cache-free loop"

    def verify(self, p, q, drafts, generator):
        return mirrored_uniform_product(p, q, drafts, generator)

    def draft_rows(self, draft, sequence, prompt, policy, generator):
        tokens, rows = [], []
        for _ in range(self.draft_length):
            context = torch.cat([sequence, torch.tensor(tokens, dtype=torch.int64, device=sequence.device)])
            generated = tuple(context[prompt:].tolist())
            row = _rows(draft, context, policy, [generated], 1)[0]
            tokens.append(int(torch.multinomial(row, 1, generator=generator)))
            rows.append(row)
        return torch.tensor(tokens, device=sequence.device), torch.stack(rows)

    def target_rows(self, target, sequence, drafts, prompt, policy, cache, known):
        generated = tuple(sequence[prompt:].tolist())
        prefixes = [generated + tuple(drafts[:j].tolist()) for j in range(drafts.numel() + 1)]
        return _rows(target, torch.cat([sequence, drafts]), policy, prefixes, drafts.numel() + 1)

    def __call__(self, target, draft, input_ids, policy: DecodingPolicy, max_new_tokens: int, seed: int):
        generator = torch.Generator(device=target.device).manual_seed(seed)
        sequence = input_ids[0].to(target.device)
        prompt = sequence.numel()
        cache = self.new_cache()
        with torch.no_grad():
            while sequence.numel() - prompt < max_new_tokens:
                drafts, q = self.draft_rows(draft, sequence, prompt, policy, generator)
                p = self.target_rows(target, sequence, drafts, prompt, policy, cache, sequence.numel() - 1)
                out = self.verify(p[None].float(), q[None].float(), drafts[None], generator)[0]
                emitted = out[out >= 0].tolist()[: max_new_tokens - (sequence.numel() - prompt)]
                emitted, stop = _stop(emitted, policy)
                sequence = torch.cat([sequence, torch.tensor(emitted, device=sequence.device)])
                self.crop(cache, sequence.numel() - 1)
                if stop:
                    break
        return Generation(sequence[None], target_cache=cache)

    def new_cache(self):
        return None

    def crop(self, cache, keep: int) -> None:
        pass


@dataclass(frozen=True)
class DraftRecomputeLoop(CacheFreeLoop):
    """The target keeps a DynamicCache, fed only what it lacks and cropped to the committed
    sequence after each round; the draft recomputes its whole prefix every time."""

    name: str = "corpus: draft recomputes, target caches"

    def verify(self, p, q, drafts, generator):
        return exponential_race(p, q, drafts, generator)

    def new_cache(self):
        return new_cache()

    def target_rows(self, target, sequence, drafts, prompt, policy, cache, known):
        generated = tuple(sequence[prompt:].tolist())
        prefixes = [generated + tuple(drafts[:j].tolist()) for j in range(drafts.numel() + 1)]
        start = min(cache.get_seq_length(), known)
        return _rows(target, torch.cat([sequence, drafts]), policy, prefixes, drafts.numel() + 1,
                     cache=cache, start=start)

    def crop(self, cache, keep: int) -> None:
        extra = cache.get_seq_length() - keep
        if extra > 0:
            cache.crop(-extra)


class _SlotLayer:
    """One layer of a ``SlotCache``: the filled part of its key and value buffers."""

    def __init__(self, cache: "SlotCache", index: int):
        self.cache, self.index = cache, index

    @property
    def keys(self) -> torch.Tensor:
        return self.cache.key_slots[self.index][:, :, :self.cache.length]

    @property
    def values(self) -> torch.Tensor:
        return self.cache.value_slots[self.index][:, :, :self.cache.length]


class SlotCache:
    """A KV cache written the way serving engines write theirs, not transformers': per layer one
    preallocated ``[B, H, capacity, D]`` buffer for keys and one for values, and one length
    pointer. ``update`` writes at the pointer (doubling the buffers when full) and advances it;
    ``rewind(n)`` moves the pointer back to ``n`` and leaves the old entries where they are, to be
    overwritten. It has what a transformers-style model reads of a cache (``get_seq_length``,
    ``layers[i].keys`` / ``.values``, ``update``), so the toy models run on it unchanged."""

    def __init__(self, capacity: int = 16):
        self.capacity, self.length = capacity, 0
        self.key_slots: list[torch.Tensor] = []
        self.value_slots: list[torch.Tensor] = []

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    @property
    def layers(self) -> list[_SlotLayer]:
        return [_SlotLayer(self, i) for i in range(len(self.key_slots))]

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, cache_kwargs=None):
        n = keys.shape[2]
        if layer_idx == len(self.key_slots):
            shape = (*keys.shape[:2], max(self.capacity, n), keys.shape[3])
            self.key_slots.append(keys.new_zeros(shape))
            self.value_slots.append(values.new_zeros(shape))
        start = self.length
        while start + n > self.key_slots[layer_idx].shape[2]:
            for slots in (self.key_slots, self.value_slots):
                old = slots[layer_idx]
                slots[layer_idx] = torch.cat([old, torch.zeros_like(old)], 2)
        self.key_slots[layer_idx][:, :, start:start + n] = keys
        self.value_slots[layer_idx][:, :, start:start + n] = values
        if layer_idx == len(self.key_slots) - 1:
            self.length = start + n  # the last layer written moves the pointer
        return (self.key_slots[layer_idx][:, :, :start + n], self.value_slots[layer_idx][:, :, :start + n])

    def rewind(self, length: int) -> None:
        self.length = min(self.length, length)


@dataclass(frozen=True)
class SlotCacheLoop:
    """Speculative sampling over two ``SlotCache``s: each model is fed only the committed tokens
    its pointer lacks; after verification both pointers go back to the committed sequence minus
    its last token. Drafts by inverse CDF on float64 uniforms; reports every draft's q."""

    draft_length: int = 3
    name: str = "corpus: hand-rolled slot cache loop"
    capabilities = Capabilities(cache=True, reports_draft_q=True)

    def __call__(self, target, draft, input_ids, policy: DecodingPolicy, max_new_tokens: int, seed: int):
        generator = torch.Generator(device=target.device).manual_seed(seed)
        sequence = input_ids[0].to(target.device)
        prompt = sequence.numel()
        caches = {"target": SlotCache(), "draft": SlotCache()}
        records: list[DraftRecord] = []
        with torch.no_grad():
            while sequence.numel() - prompt < max_new_tokens:
                generated = tuple(sequence[prompt:].tolist())
                tokens, rows = [], []
                for _ in range(self.draft_length):
                    context = torch.cat([sequence, torch.tensor(tokens, dtype=torch.int64, device=sequence.device)])
                    row = _rows(draft, context, policy, [generated + tuple(tokens)], 1, cache=caches["draft"],
                                start=caches["draft"].length)[0]  # fed what its pointer lacks
                    u = torch.rand((), dtype=torch.float64, generator=generator, device=row.device)
                    cdf = row.cumsum(0)
                    last = int((cdf < cdf[-1]).sum())
                    token = min(int((cdf <= u * cdf[-1]).sum()), last)
                    tokens.append(token)
                    rows.append(row)
                    records.append(DraftRecord(token, row.cpu()))
                drafts = torch.tensor(tokens, dtype=torch.int64, device=sequence.device)
                start = self.target_start(caches["target"], sequence)
                prefixes = [generated + tuple(tokens[:j]) for j in range(len(tokens) + 1)]
                p = _rows(target, torch.cat([sequence, drafts]), policy, prefixes, len(tokens) + 1,
                          cache=caches["target"], start=start)
                out = float64_nonstrict_guarded(p[None], torch.stack(rows)[None], drafts[None], generator)[0]
                emitted = out[out >= 0].tolist()[: max_new_tokens - (sequence.numel() - prompt)]
                emitted, stop = _stop(emitted, policy)
                sequence = torch.cat([sequence, torch.tensor(emitted, dtype=torch.int64, device=sequence.device)])
                self.rewind(caches, sequence.numel() - 1)
                if stop:
                    break
        return Generation(sequence[None], target_cache=caches["target"], draft_cache=caches["draft"],
                          drafts=tuple(records))

    def target_start(self, cache: SlotCache, sequence: torch.Tensor) -> int:
        """Where the target's feed starts: its pointer (what it lacks)."""
        return cache.length

    def rewind(self, caches: dict, keep: int) -> None:
        """Both pointers back to the committed sequence minus its last token."""
        for cache in caches.values():
            cache.rewind(keep)


def correct_generators() -> dict:
    """Name -> exact generator (the transformers one needs transformers installed)."""
    from exactcheck.adapters.hf_generate import AssistedGeneration
    return {"cache_free_loop": CacheFreeLoop(), "draft_recompute_loop": DraftRecomputeLoop(),
            "slot_cache_loop": SlotCacheLoop(), "transformers_assisted": AssistedGeneration()}


CORRECT_GENERATORS = ("cache_free_loop", "draft_recompute_loop", "slot_cache_loop", "transformers_assisted")
# correct-in-law members with a true boundary finding of their own (reachability stated), which
# the corpus run expects rather than counts as a false finding
KNOWN_FINDINGS = {"transformers_assisted": ("forced_no_forbidden_token",)}
