"""Cache-rollback invariants, checked on the forward calls a probe model recorded.

The probe (``toy_models.hf_toy_lm.ToyLMForCausalLM`` with ``record(log)``) logs every forward
call of the target and the draft in one shared, ordered list: the tokens and position ids its
cache held before the call, the new input ids and the position ids they were given. With F the
final sequence (prompt + generated tokens), an exact generator keeps, at every call:

1. ``stored positions``: the cache holds positions 0, 1, ..., m-1 (none skipped or repeated);
2. ``input positions``: the call's position ids continue from the cache, m, m+1, ...;
3. ``committed prefix``: at a target call, and at the first draft call after a target call, the
   cache holds a prefix of F (no rejected token left behind), and the first input token is the
   committed token that follows it;
4. ``draft growth``: at any later draft call of the same round, the cache holds exactly what the
   previous draft call's cache held plus that call's inputs (drafts are fed back one by one).

A call that starts from an empty cache (the model recomputes its prefix: a generator that keeps
no cache) holds nothing stale, so the growth invariant does not apply to it; a generator whose
every call starts empty keeps no cache at all, and its rollback is not applicable.

``final_cache`` compares a cache the generator hands back with a fresh recompute on F: the same
number of entries (at least len(F) - 1, at most len(F)) and the same keys and values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Breach", "check_calls", "final_cache"]


@dataclass(frozen=True)
class Breach:
    """One broken invariant at one forward call."""

    invariant: str
    call: int  # index in the recorded call list (-1: the final cache)
    role: str
    detail: str

    def describe(self) -> str:
        where = "final cache" if self.call < 0 else f"forward call {self.call} ({self.role})"
        return f"{self.invariant} broken at {where}: {self.detail}"


def _prefix_of(tokens: tuple[int, ...], final: tuple[int, ...]) -> bool:
    return len(tokens) <= len(final) and tokens == final[:len(tokens)]


def check_calls(calls, final: list[int] | tuple[int, ...]) -> list[Breach]:
    """Every broken invariant over the recorded ``calls`` of one generation ending in ``final``."""
    final = tuple(int(x) for x in final)
    breaches: list[Breach] = []
    previous_draft = None  # (cached + input) of the last draft call in this round
    for i, call in enumerate(calls):
        m = len(call.cached_tokens)
        if call.cached_positions != tuple(range(m)):
            breaches.append(Breach("stored positions", i, call.role,
                                   f"cache holds positions {list(call.cached_positions)}"))
        expected = tuple(range(m, m + len(call.input_tokens)))
        if call.input_positions is not None and call.input_positions != expected:
            breaches.append(Breach("input positions", i, call.role,
                                   f"inputs given positions {list(call.input_positions)}, cache length {m}"))
        if call.role == "draft" and previous_draft is not None and m > 0:
            if call.cached_tokens != previous_draft:
                breaches.append(Breach("draft growth", i, call.role,
                                       f"cache holds {list(call.cached_tokens)}, expected {list(previous_draft)}"))
        else:
            if not _prefix_of(call.cached_tokens, final):
                bad = next(j for j, x in enumerate(call.cached_tokens) if j >= len(final) or final[j] != x)
                breaches.append(Breach("committed prefix", i, call.role, (
                    f"cache entry {bad} holds token {call.cached_tokens[bad]}, the sequence has "
                    f"{final[bad] if bad < len(final) else 'nothing'} there (a rejected token left behind)")))
            elif call.input_tokens and m < len(final) and call.input_tokens[0] != final[m]:
                breaches.append(Breach("committed prefix", i, call.role, (
                    f"cache holds {m} tokens but the first input is {call.input_tokens[0]}, "
                    f"not the committed token {final[m]} (a committed token skipped)")))
        if call.role == "draft":
            previous_draft = call.cached_tokens + call.input_tokens
        else:
            previous_draft = None
    return breaches


def final_cache(model, cache, final: torch.Tensor, role: str = "target", atol: float = 1e-4,
                slack: int = 1) -> list[Breach]:
    """Compare a generator's final ``cache`` of ``model`` with a fresh forward on ``final``
    ([1, T] ids): it must hold between T - ``slack`` and T entries (the target's last token need
    not be fed yet, slack 1; a draft may also lack its last accepted draft, slack 2) and match
    the recompute on those tokens within ``atol`` (relative to the largest entry)."""
    if cache is None:
        return []
    from exactcheck.contracts.transformers_compat import forward, new_cache
    held = cache.get_seq_length()
    length = final.shape[-1]
    if not (length - slack <= held <= length):
        return [Breach("final length", -1, role, f"cache holds {held} entries for a {length}-token sequence")]
    fresh = new_cache()
    calls = getattr(model, "calls", None)
    if calls is not None:
        model.calls = None  # the recompute is not part of the generation
    try:
        with torch.no_grad():
            forward(model, final[:, :held].to(model.device), fresh, use_cache=True)
    finally:
        if calls is not None:
            model.calls = calls
    for index, (mine, theirs) in enumerate(zip(cache.layers, fresh.layers)):
        for name in ("keys", "values"):
            a, b = getattr(mine, name).float(), getattr(theirs, name).float()
            if a.shape != b.shape:
                return [Breach("final contents", -1, role, f"layer {index} {name}: shape {tuple(a.shape)} "
                                                           f"vs recompute {tuple(b.shape)}")]
            scale = max(1.0, float(b.abs().max()))
            if torch.equal(a, b):  # the usual case: nothing to measure
                continue
            diff = (a - b).abs()
            if float(diff.max()) > atol * scale:
                position = int(diff.amax(dim=tuple(d for d in range(diff.dim()) if d != diff.dim() - 2)).argmax())
                return [Breach("final contents", -1, role, (
                    f"layer {index} {name} differ from a fresh recompute by {float(diff.max()):.3g} "
                    f"(first worst at position {position})"))]
    return []
