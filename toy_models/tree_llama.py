"""A tiny random ``LlamaForCausalLM`` as a cached tree model, and the check that its tree logits
are a fresh forward's on each node's path.

``tiny_llama`` builds a 2-layer Llama (vocabulary 8 by default) from a ``LlamaConfig`` with random
weights from a fixed seed (under ``torch.random.fork_rng``: the global stream is left as it was);
nothing is downloaded. ``HFTreeModel`` wraps any transformers causal LM into the tree-model
interface of ``exactcheck.contracts.tree_generator`` (``forward(input_ids, position_ids, tree_mask)``,
``cache_length``, ``keep``, ``crop``): a ``DynamicCache``, the boolean tree mask turned into a 4D
float mask [1, 1, n, cache + n] (0 where attending, the dtype's minimum elsewhere; transformers
5.x passes a 4D mask through unchanged, ``masking_utils._preprocess_mask_arguments``), and
``keep(indices)`` gathering every layer's keys and values along the sequence axis. It records
its forwards like ``toy_models.tree_cache_lm.TreeCacheLM`` (``TreeForwardCall``) and keeps its own
(call, logits) pairs (``forwards``).

``path_mismatches`` re-runs each tree node of every recorded verify forward without a cache, on
its true path (the committed tokens and the node's ancestors, at positions 0, 1, ...), and
returns the nodes whose cached logits differ by more than ``atol``: none for an exact loop; a
mask that lets a sibling be seen, a kept rejected entry or a wrong position shows there.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.transformers_compat import forward as hf_forward, new_cache
from toy_models.tree_cache_lm import TreeForwardCall

__all__ = ["tiny_llama", "HFTreeModel", "path_mismatches"]


def tiny_llama(vocab: int = 8, seed: int = 0, layers: int = 2):
    """A random ``LlamaForCausalLM`` (eager attention, float32), built locally."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


class HFTreeModel:
    """A transformers causal LM behind the tree-model interface (module docstring)."""

    def __init__(self, model, role: str = "model"):
        self.model = model
        self.role = role
        self.calls: list[TreeForwardCall] | None = None
        self.forwards: list[tuple[TreeForwardCall, torch.Tensor]] = []  # this model's calls and logits
        self.reset()

    def reset(self) -> None:
        self.cache = new_cache()
        self._tokens: list[int] = []
        self._positions: list[int] = []

    def record(self, log: list | None = None) -> list:
        self.calls = [] if log is None else log
        self.forwards = []
        return self.calls

    @property
    def cache_length(self) -> int:
        return len(self._tokens)

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    @property
    def cached_positions(self) -> tuple[int, ...]:
        return tuple(self._positions)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        if tuple(tree_mask.shape) != (n, self.cache_length + n) or tree_mask.dtype != torch.bool:
            raise ValueError(f"tree_mask must be bool [{n}, {self.cache_length + n}], got {tuple(tree_mask.shape)}")
        dtype = self.model.dtype
        mask = torch.zeros(tree_mask.shape, dtype=dtype).masked_fill(~tree_mask, torch.finfo(dtype).min)[None, None]
        with torch.no_grad():
            out = hf_forward(self.model, input_ids, self.cache, position_ids=position_ids, attention_mask=mask,
                             use_cache=True)
        logits = out.logits.double()
        if self.calls is not None:
            call = TreeForwardCall(self.role, self.cached_tokens, self.cached_positions, tuple(input_ids[0].tolist()),
                                   tuple(position_ids[0].tolist()), tuple(map(tuple, tree_mask.tolist())),
                                   logits[0].numpy().copy())
            self.calls.append(call)
            self.forwards.append((call, logits[0]))
        self._tokens += input_ids[0].tolist()
        self._positions += position_ids[0].tolist()
        return logits

    __call__ = forward

    def keep(self, indices) -> None:
        index = torch.tensor([int(i) for i in indices], dtype=torch.int64)
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)
        self._tokens = [self._tokens[i] for i in index.tolist()]
        self._positions = [self._positions[i] for i in index.tolist()]

    def crop(self, length: int) -> None:
        self.cache.crop(length)
        del self._tokens[length:], self._positions[length:]


def path_mismatches(target: HFTreeModel, parents: tuple[int, ...], atol: float = 1e-5) -> list[tuple[int, int, float]]:
    """(verify call, node, largest |difference|) for every node of every recorded target forward
    whose logits differ from a cache-free forward on its true path by more than ``atol``."""
    out = []
    nodes = len(parents)
    for k, (call, logits) in enumerate(target.forwards):
        c = len(call.input_tokens) - (nodes - 1)
        committed = list(call.cached_tokens) + list(call.input_tokens[:c])
        for node in range(nodes):
            chain, j = [], node
            while j > 0:
                chain.append(call.input_tokens[c - 1 + j])
                j = parents[j]
            path = committed + chain[::-1]
            with torch.no_grad():
                fresh = target.model(input_ids=torch.tensor([path]), use_cache=False).logits[0, -1].double()
            gap = float((fresh - logits[c - 1 + node]).abs().max())
            if gap > atol:
                out.append((k, node, gap))
    return out
