"""exactcheck's reference speculative loop through the batched generator contract.

``BatchedReferenceLoop.generate_batch`` runs many requests at once, as a serving engine does: one
draft forward per drafted position and one target forward per round for every live request, and
one verify call for the batch with each request's own generator (``row_generators``). It keeps
no KV cache (each forward recomputes the right-padded prefixes), an exact loop written another
way than ``ReferenceSpeculativeLoop``. Request ``i``'s random numbers come from a generator
seeded with ``seeds[i]`` and are drawn in the batch-1 loop's order (drafts by
``torch.multinomial``, then the verifier's uniforms), so on models whose rows do not depend on
caching (the toy worlds) each request's output equals the batch-1 loop's for the same seed; the
audit's verdicts are then the same, and the batch costs a fraction of the calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.generator import DecodingPolicy
from exactcheck.e2e.loop import stop_at
from exactcheck.contracts.reference_verifier import ReferenceVerifier

__all__ = ["BatchedReferenceLoop"]


def _padded(sequences: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] and the attention mask [B, T]."""
    width = max(s.numel() for s in sequences)
    ids = torch.zeros((len(sequences), width), dtype=torch.int64, device=sequences[0].device)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(sequences):
        ids[r, :s.numel()] = s
        mask[r, :s.numel()] = 1
    return ids, mask


def _logits(model, sequences: list[torch.Tensor], positions: int) -> torch.Tensor:
    """The logits [B, positions, V] at the last ``positions`` tokens of each sequence (no cache)."""
    ids, mask = _padded(sequences)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    ends = torch.tensor([s.numel() for s in sequences], device=ids.device)
    index = ends[:, None] - positions + torch.arange(positions, device=ids.device)
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


@dataclass(frozen=True)
class BatchedReferenceLoop:
    """An exact speculative generator for many requests per call (see the module docstring)."""

    draft_length: int = 4
    max_batch: int = 256
    name: str = "exactcheck batched reference speculative loop (no cache)"

    def generate_batch(self, target, draft, prompts: list[torch.Tensor], policy: DecodingPolicy,
                       max_new_tokens: int, seeds: list[int]) -> list[torch.Tensor]:
        device = target.device
        k = self.draft_length
        generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        spare = torch.Generator(device=device).manual_seed(0)  # every row has its own; nothing draws from it
        verifier = ReferenceVerifier()
        sequences = [p.to(device).reshape(-1) for p in prompts]
        starts = [s.numel() for s in sequences]
        stopped = [False] * len(sequences)
        with torch.no_grad():
            while True:
                live = [i for i, s in enumerate(sequences)
                        if not stopped[i] and s.numel() - starts[i] < max_new_tokens]
                if not live:
                    break
                generated = [tuple(sequences[i][starts[i]:].tolist()) for i in live]
                drafted = [[] for _ in live]
                rows = []
                for _ in range(k):
                    current = [torch.cat([sequences[i], torch.tensor(d, dtype=torch.int64, device=device)])
                               for i, d in zip(live, drafted)]
                    logits = _logits(draft, current, 1)[:, 0]
                    q = policy.probabilities(logits, [g + tuple(d) for g, d in zip(generated, drafted)])
                    for r, i in enumerate(live):
                        drafted[r].append(int(torch.multinomial(q[r], 1, generator=generators[i])))
                    rows.append(q)
                drafts = torch.tensor(drafted, dtype=torch.int64, device=device)
                current = [torch.cat([sequences[i], drafts[r]]) for r, i in enumerate(live)]
                logits = _logits(target, current, k + 1)
                prefixes = [g + tuple(d[:j]) for g, d in zip(generated, drafted) for j in range(k + 1)]
                p = policy.probabilities(logits.reshape(-1, logits.shape[-1]), prefixes).view(len(live), k + 1, -1)
                q = torch.stack(rows, 1)
                out = verifier(p.float(), q.float(), drafts, spare, row_generators=[generators[i] for i in live])
                for r, i in enumerate(live):
                    emitted = out[r][out[r] >= 0][: max_new_tokens - (sequences[i].numel() - starts[i])]
                    keep, stopped[i] = stop_at(emitted, policy)
                    sequences[i] = torch.cat([sequences[i], emitted[:keep]])
        return [s[start:] for s, start in zip(sequences, starts)]

    def __call__(self, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy, max_new_tokens: int,
                 seed: int) -> torch.Tensor:
        return self.generate_batch(target, draft, [input_ids[0]], policy, max_new_tokens, [seed])[0]

