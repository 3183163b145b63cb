"""Exact end-to-end generators written differently from ``exactcheck.e2e.loop``.

* ``CacheFreeLoop``: keeps no KV cache at all; every forward call recomputes the whole prefix
  (as many reference implementations do). Verifies with ``mirrored_uniform_product``.
* ``DraftRecomputeLoop``: the target keeps a cache and crops it after each round; the draft
  keeps none and recomputes its prefix every round. Verifies with ``exponential_race``.
* ``transformers-assisted`` (``exactcheck.adapters.hf_generate.AssistedGeneration``): other
  people's code, transformers' own assisted generation.

Cache-rollback invariants judge the caches that exist; for ``CacheFreeLoop`` there is none, the
check is not applicable, and the laws decide. ``CORRECT_GENERATORS`` names them all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.adapters.transformers_compat import forward, new_cache
from exactcheck.corpus.verifiers import exponential_race, mirrored_uniform_product
from exactcheck.e2e.generator import DecodingPolicy, Generation

__all__ = ["CacheFreeLoop", "DraftRecomputeLoop", "CORRECT_GENERATORS", "correct_generators"]


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


def correct_generators() -> dict:
    """Name -> exact generator (the transformers one needs transformers installed)."""
    from exactcheck.adapters.hf_generate import AssistedGeneration
    return {"cache_free_loop": CacheFreeLoop(), "draft_recompute_loop": DraftRecomputeLoop(),
            "transformers_assisted": AssistedGeneration()}


CORRECT_GENERATORS = ("cache_free_loop", "draft_recompute_loop", "transformers_assisted")
