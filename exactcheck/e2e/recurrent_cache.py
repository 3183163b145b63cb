"""State invariants of a hybrid model's final cache, read through transformers' hybrid cache.

A hybrid model (gated delta net, Mamba-1/2 or short-convolution layers beside attention layers)
keeps, per linear-attention layer, a **conv state** (the last K inputs of its causal convolution)
and, except for short-convolution models, a **recurrent state** (the SSM / delta-rule state), in a
``transformers.cache_utils.LinearAttentionLayer``; attention layers keep **keys** and **values**.
Speculative decoding feeds draft tokens and then rolls the cache back over the rejected ones
(``Cache.crop``, with the states that ``activate_past_recording`` kept). An exact rollback leaves
the cache as a fresh forward over the committed tokens leaves it.

``final_state_breaches`` compares a generation's final cache with a fresh recompute over exactly
the final sequence F (``toy_models.hybrid_models.recompute_states``: one prefill, no past
recording): the cache may hold len(F) tokens or len(F) - 1 (the last token is not fed yet); the
length it reports says which, and every layer must agree on it. Then, per layer and part:

- ``conv``: the last K columns (K = the recompute's kernel width; a crop of a sequence shorter
  than K leaves fewer columns, which stand for the zeros a causal convolution pads with);
- ``recurrent``: the whole state;
- ``keys`` / ``values``: the whole tensors (their length must match too); a sliding-window layer
  keeps only its last window (and more while it records its past), so there the positions both
  hold are compared and its length is not held to the cache's.

A part breaches when max |cache - recompute| > ``tolerance`` * max |recompute| (relative to the
part's own scale: a recurrent state can be 1e-4 in size, so no absolute floor of 1).
``RECOMPUTE_NOISE`` bounds the largest relative difference measured between two correct
recomputes (one prefill against token by token, float32, CPU, 35-token sequences; 2.3e-5 at most,
on zamba2, over 17 architectures: ``benchmarks/hybrid_transformers.py`` re-measures it per
architecture and reports it); ``TOLERANCE`` is 100 times that bound, and the rollback errors found
move a part by 0.018 to 1.4 relative (780x the noise at least). (A recompute fed in several chunks is no reference
for jamba and zamba: their multi-token scan ignores the cached state, modeling_jamba.py:555.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["StateBreach", "RECOMPUTE_NOISE", "TOLERANCE", "compare_states", "final_state_breaches",
           "held_length", "recompute_noise", "is_hybrid_cache"]

# measured: max relative difference, token by token against one prefill, 17 architectures x 3
# sequences of 35 tokens: 2.3e-5 (float32, CPU; reports/hybrid-transformers.json), rounded up
RECOMPUTE_NOISE = 5e-5
TOLERANCE = 5e-3


@dataclass(frozen=True)
class StateBreach:
    """One part of one layer of a final cache that differs from the recompute."""

    layer: int
    part: str  # "conv", "recurrent", "keys", "values", "length", "shape"
    difference: float  # max |cache - recompute| (for "length": tokens)
    scale: float  # max |recompute|
    detail: str = ""
    invariant: str = "final state"
    call: int = -1  # the final cache (the shape of exactcheck.generation.cache_invariants.Breach)
    role: str = "target"

    @property
    def relative(self) -> float:
        return self.difference / self.scale if self.scale > 0 else float("inf")

    def describe(self) -> str:
        if self.part in ("length", "shape"):
            return f"final cache, layer {self.layer}: {self.part} {self.detail}"
        return (f"final cache, layer {self.layer} {self.part} state differs from a fresh recompute by "
                f"{self.difference:.3g} (relative {self.relative:.3g}, scale {self.scale:.3g})"
                + (f"; {self.detail}" if self.detail else ""))


def is_hybrid_cache(cache) -> bool:
    """Whether ``cache`` has a linear-attention layer (conv / recurrent states)."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:  # a transformers without the hybrid cache (4.57)
        return False
    return any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in getattr(cache, "layers", ()))


def _layer_lengths(cache) -> list[tuple[int, int]]:
    """(layer index, tokens it holds) for every layer that knows its length."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    out = []
    for index, layer in enumerate(cache.layers):
        keys = getattr(layer, "keys", None)
        if getattr(layer, "is_sliding", False):  # keeps only its window: no length to hold to
            continue
        if isinstance(keys, torch.Tensor) and keys.numel():
            out.append((index, int(keys.shape[-2])))
        elif isinstance(layer, LinearAttentionCacheLayerMixin):
            out.append((index, int(layer.cumulative_length_linear)))
    return out


def held_length(cache) -> int:
    """The number of tokens ``cache`` says it holds (``Cache.get_seq_length()``)."""
    return int(cache.get_seq_length())


def _conv_window(tensor: torch.Tensor, width: int) -> torch.Tensor:
    """The last ``width`` columns, left-padded with zeros when there are fewer."""
    if tensor.shape[-1] >= width:
        return tensor[..., -width:]
    return torch.nn.functional.pad(tensor, (width - tensor.shape[-1], 0))


def compare_states(mine, reference, tolerance: float = TOLERANCE) -> list[StateBreach]:
    """Every breach between two lists of ``LayerState`` (a cache's and a recompute's)."""
    breaches = []
    for a, b in zip(mine, reference):
        parts_a, parts_b = a.parts(), b.parts()
        for part in ("conv", "recurrent", "keys", "values"):
            if part not in parts_b:
                continue
            if part not in parts_a:
                breaches.append(StateBreach(a.index, "shape", 0.0, 0.0, f"{part} missing from the cache"))
                continue
            x, y = parts_a[part].double(), parts_b[part].double()
            if part == "conv":
                x, y = _conv_window(x, y.shape[-1]), y
            elif "Sliding" in b.kind and x.dim() == y.dim() and x.shape[-2] != y.shape[-2]:
                # a sliding-window layer keeps its last window (more while it records its past):
                # the positions both hold are the last min(len) ones
                both = min(x.shape[-2], y.shape[-2])
                x, y = x[..., -both:, :], y[..., -both:, :]
            if x.shape != y.shape:
                breaches.append(StateBreach(a.index, "shape", 0.0, 0.0, (
                    f"{part} {tuple(x.shape)} vs recompute {tuple(y.shape)}")))
                continue
            diff = float((x - y).abs().max()) if x.numel() else 0.0
            scale = float(y.abs().max()) if y.numel() else 0.0
            if diff > tolerance * max(scale, 1e-12):
                detail = ""
                if part in ("keys", "values"):
                    per_position = (x - y).abs().amax(dim=tuple(d for d in range(x.dim()) if d != x.dim() - 2))
                    detail = f"first worst at position {int(per_position.argmax())}"
                breaches.append(StateBreach(a.index, part, diff, scale, detail))
    return breaches


def final_state_breaches(model, cache, final: torch.Tensor, tolerance: float = TOLERANCE, slack: int = 1,
                         role: str = "target") -> list[StateBreach]:
    """Compare ``cache`` (a generation's final cache of ``model``) with a fresh recompute over
    the final sequence ``final`` ([1, T] or [T] ids): the tokens it holds (T - ``slack`` .. T, the
    same in every layer), then each layer's conv, recurrent, key and value states."""
    from toy_models.hybrid_models import cache_states, recompute_states
    if cache is None:
        return []
    final = final if final.dim() == 2 else final[None]
    length, held = final.shape[-1], held_length(cache)
    if not (length - slack <= held <= length):
        return [StateBreach(-1, "length", float(held - length), float(length),
                            f"the cache holds {held} tokens for a {length}-token sequence", role=role)]
    odd = [(i, n) for i, n in _layer_lengths(cache) if n != held]
    if odd:
        i, n = odd[0]
        return [StateBreach(i, "length", float(n - held), float(held),
                            f"holds {n} tokens, the cache says {held}", role=role)]
    reference = recompute_states(model, final[:, :held])
    return [StateBreach(b.layer, b.part, b.difference, b.scale, b.detail, role=role)
            for b in compare_states(cache_states(cache), reference, tolerance)]


def recompute_noise(model, ids: torch.Tensor, chunkings=(3, None)) -> dict[str, float]:
    """The largest relative difference, per part, between one prefill over ``ids`` ([1, T]) and
    recomputes fed in other chunks (``None``: token by token): the float32 noise floor of
    ``final_state_breaches``."""
    from toy_models.hybrid_models import recompute_states
    reference = recompute_states(model, ids)
    out: dict[str, float] = {}
    for chunks in chunkings:
        other = recompute_states(model, ids, chunks or ids.shape[-1])
        for a, b in zip(other, reference):
            pa, pb = a.parts(), b.parts()
            for part, y in pb.items():
                x = pa[part].double()
                y = y.double()
                if part == "conv":
                    x = _conv_window(x, y.shape[-1])
                scale = float(y.abs().max()) if y.numel() else 0.0
                rel = float((x - y).abs().max()) / scale if scale > 0 else 0.0
                out[part] = max(out.get(part, 0.0), rel)
    return out
