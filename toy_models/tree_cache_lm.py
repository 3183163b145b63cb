"""A cached toy LM that understands trees: what a tree engine's KV cache and attention mask see.

``TreeCacheLM`` plays one of a ``TreeWorld``'s two toy LMs (``toy_models.tree_worlds``) the way a
tree engine drives a transformer. Its cache holds, per entry, the token id and the position id
it was written with (the toy's "keys"). A forward takes

* ``input_ids`` [1, n] int64: the new entries,
* ``position_ids`` [1, n] int64: their position ids,
* ``tree_mask`` [n, cache_len + n] bool: True where input i may attend to an entry (the cache's
  entries first, then the n inputs in order),

appends the n inputs to its cache (every forward writes its entries, as a KV cache does) and
returns logits [1, n, V] float64. Input i's row is the ``ToyLM``'s row at the rolling-hash
state of the tokens it can see, **taken in order of their position ids** (ties in cache-then-
input order), starting from the model's ``initial_state``. Nothing else enters the row. So a
stale cache entry that stays visible, a position id that puts a token in the wrong place, or a
mask that lets a node see a sibling gives a wrong row, exactly as a real transformer with a
stale KV cache, wrong RoPE positions or a wrong tree mask would; a correct engine gets the
world's rows, and its output law is the world's (``TreeWorld.sequence_law``).

Rows: the target's float64 law (``TreeWorld.target_law``: the table renormalised in float64,
one-hot at its argmax for a greedy world), the draft's ``world.draft.law()``; logits are their
logarithms (-inf where a row is 0), so ``softmax`` gives the row back.

Cache operations a tree engine uses: ``keep(indices)`` (compaction after an accept: keep those
entries, in that order, with the position ids they were written with), ``crop(length)``,
``reset()``. Every forward is recorded (``record()``; ``TreeForwardCall``: the cache before the
call, the inputs, their positions and the mask) so the cache invariants
(``exactcheck.tree.cache_checks``) can be checked after the run.

``tree_prompt`` picks a prompt and the models' initial state so that the prompt leads to the
world's ``prompt_state``: the law of the first ``length`` generated tokens is then
``TreeWorld.sequence_law()``, enumerated from the world alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from toy_models.tree_worlds import TreeWorld

__all__ = ["TreeCacheLM", "TreeForwardCall", "tree_prompt", "tree_model_pair"]


@dataclass(frozen=True)
class TreeForwardCall:
    """One forward as the model saw it: what its cache held before the call (tokens and
    position ids), the inputs, their position ids, and the mask (one tuple of booleans per input,
    ``cache_len + n`` long); ``logits``: what it returned ([n, V] float64 numpy array, not
    compared), so a check can redo what the generator did with them (a dynamic tree's selection)."""

    role: str
    cached_tokens: tuple[int, ...]
    cached_positions: tuple[int, ...]
    input_tokens: tuple[int, ...]
    input_positions: tuple[int, ...]
    mask: tuple[tuple[bool, ...], ...]
    logits: np.ndarray | None = field(default=None, compare=False, repr=False)

    def visible(self, i: int) -> list[int]:
        """Indices (cache entries first, then inputs) that input ``i`` attends to."""
        return [j for j, seen in enumerate(self.mask[i]) if seen]


class TreeCacheLM:
    """A toy LM with a (token, position) cache and tree attention masks (module docstring)."""

    def __init__(self, rows: np.ndarray, num_states: int, initial_state: int, role: str = "model"):
        rows = np.asarray(rows, dtype=np.float64)
        self.vocab_size = rows.shape[1]
        self.num_states = num_states
        self.initial_state = int(initial_state)
        self.role = role
        with np.errstate(divide="ignore"):
            self._log_rows = np.log(rows)
        self._tokens: list[int] = []
        self._positions: list[int] = []
        self.calls: list[TreeForwardCall] | None = None

    # -- the cache ------------------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        return len(self._tokens)

    @property
    def cached_tokens(self) -> tuple[int, ...]:
        return tuple(self._tokens)

    @property
    def cached_positions(self) -> tuple[int, ...]:
        return tuple(self._positions)

    def reset(self) -> None:
        """Empty the cache (a new generation)."""
        self._tokens, self._positions = [], []

    def record(self, log: list | None = None) -> list:
        """Record every forward into ``log`` (a fresh list if None; pass one list to both models
        for one ordered log) and return it; ``calls = None`` stops recording."""
        self.calls = [] if log is None else log
        return self.calls

    def keep(self, indices) -> None:
        """Keep only the cache entries at ``indices``, in that order (compaction after a tree
        verify); each keeps the position id it was written with."""
        indices = [int(i) for i in indices]
        if any(i < 0 or i >= self.cache_length for i in indices):
            raise IndexError(f"keep: indices {indices} outside a cache of {self.cache_length} entries")
        self._tokens = [self._tokens[i] for i in indices]
        self._positions = [self._positions[i] for i in indices]

    def crop(self, length: int) -> None:
        """Keep the first ``length`` entries."""
        if length < 0:
            raise ValueError(f"crop length ({length}) must be >= 0")
        del self._tokens[length:], self._positions[length:]

    # -- the forward ----------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
        """Logits [1, n, V] float64 of the n inputs (module docstring); the inputs join the cache."""
        tokens, positions, mask = self._inputs(input_ids, position_ids, tree_mask)
        cached_tokens, cached_positions = self.cached_tokens, self.cached_positions
        all_tokens, all_positions = self._tokens + tokens, self._positions + positions
        logits = self._log_rows[[self._state(all_tokens, all_positions, row) for row in mask]]
        if self.calls is not None:
            self.calls.append(TreeForwardCall(self.role, cached_tokens, cached_positions, tuple(tokens),
                                              tuple(positions), tuple(map(tuple, mask)), logits.copy()))
        self._tokens += tokens
        self._positions += positions
        return torch.from_numpy(logits)[None]

    __call__ = forward

    def _state(self, tokens: list[int], positions: list[int], seen: list[bool]) -> int:
        """The rolling-hash state of the ``seen`` entries' tokens in order of their positions."""
        order = sorted((j for j, visible in enumerate(seen) if visible), key=positions.__getitem__)  # stable
        s, vocab, states = self.initial_state, self.vocab_size, self.num_states
        for j in order:
            s = (s * vocab + tokens[j] + 1) % states
        return s

    def _inputs(self, input_ids, position_ids, tree_mask) -> tuple[list[int], list[int], list[list[bool]]]:
        input_ids, position_ids, tree_mask = (torch.as_tensor(input_ids), torch.as_tensor(position_ids),
                                              torch.as_tensor(tree_mask))
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(f"input_ids must be [1, n], got {tuple(input_ids.shape)}")
        n = input_ids.shape[1]
        if tuple(position_ids.shape) != (1, n):
            raise ValueError(f"position_ids must be [1, {n}] like input_ids, got {tuple(position_ids.shape)}")
        if tuple(tree_mask.shape) != (n, self.cache_length + n) or tree_mask.dtype != torch.bool:
            raise ValueError(f"tree_mask must be bool [{n}, {self.cache_length + n}] (inputs x cache + inputs), "
                             f"got {tree_mask.dtype} {tuple(tree_mask.shape)}")
        tokens = input_ids[0].tolist()
        if any(x < 0 or x >= self.vocab_size for x in tokens):
            raise ValueError(f"input_ids {tokens} outside [0, {self.vocab_size})")
        return tokens, position_ids[0].tolist(), tree_mask.tolist()


def tree_prompt(tree: TreeWorld, length: int = 3, seed: int = 0) -> tuple[tuple[int, ...], int]:
    """(prompt, initial state): a random prompt of ``length`` tokens and the smallest initial state
    from which it leads to the world's ``prompt_state``."""
    world = tree.world
    g = torch.Generator().manual_seed(seed)
    for _ in range(100):
        prompt = tuple(torch.randint(world.vocab_size, (length,), generator=g).tolist())
        for start in range(world.num_states):
            s = start
            for x in prompt:
                s = int(world.next_state(s, x))
            if s == world.prompt_state:
                return prompt, start
    raise ValueError(f"{tree.name}: no prompt of {length} tokens reaches state {world.prompt_state}")


def tree_model_pair(tree: TreeWorld, initial_state: int) -> tuple[TreeCacheLM, TreeCacheLM]:
    """(target, draft) cached toy models of ``tree``'s two LMs, starting at ``initial_state``."""
    states = tree.world.num_states
    return (TreeCacheLM(tree.target_law(), states, initial_state, "target"),
            TreeCacheLM(tree.world.draft.law(), states, initial_state, "draft"))
