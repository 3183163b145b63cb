"""Tree worlds: the context toy LMs drafting a tree of candidates per verify call.

A ``TreeWorld`` is a ``ContextWorld`` (target and draft ``ToyLM`` sharing a state machine, so every
row depends on the whole prefix) and a tree **shape**: ``branching[d]`` children for every node at
depth d (the root, the context so far, is depth 0; the tree's depth D is ``len(branching)``). How
siblings are drawn from their parent's draft row is part of the world (``siblings``):

* ``iid``: independently, with replacement (SpecInfer, EAGLE-1: duplicates happen);
* ``without_replacement``: one after another, each from the row with the earlier ones removed
  (recursive speculative decoding);
* ``top_k``: deterministically, the parent row's most likely tokens (ties by id: EAGLE-2/3 dynamic
  trees, SGLang, TensorRT-LLM).

A ``greedy`` world's target decodes greedily (one-hot rows at the argmax): its sequence law is a
point mass on the greedy path, so any other output is a deterministic finding (greedy tree
verifiers, e.g. SGLang's ``verify_tree_greedy``, run on these worlds only).

Nodes are numbered breadth-first, so ``parents[i] < i``. Through the speculative loop
(``exactcheck.tree.drive``) an exact tree verifier emits the target's law of the first ``length``
tokens whatever its rule: ``ContextWorld.sequence_law`` is the expected law, enumerated in
float64. ``exactcheck.tree.laws`` enumerates one verify step's emitted law per rule.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from toy_models.context_lm import ContextWorld, make_context_world

__all__ = ["TreeWorld", "SIBLING_MODES", "tree_worlds", "tree_topology"]

SIBLING_MODES = ("iid", "without_replacement", "top_k")


def tree_topology(branching: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(parents, depths) of the breadth-first tree with ``branching[d]`` children per node at
    depth d: node 0 is the root (parent -1)."""
    parents, depths = [-1], [0]
    level = [0]
    for d, width in enumerate(branching):
        nxt = []
        for node in level:
            for _ in range(width):
                parents.append(node)
                depths.append(d + 1)
                nxt.append(len(parents) - 1)
        level = nxt
    return tuple(parents), tuple(depths)


@dataclass(frozen=True)
class TreeWorld:
    """A context world drafting a tree of shape ``branching`` with ``siblings`` drawn as named."""

    name: str
    world: ContextWorld
    branching: tuple[int, ...]
    siblings: str = "iid"
    greedy: bool = False  # the target decodes greedily: its rows are one-hot at the table's argmax

    def __post_init__(self):
        if self.siblings not in SIBLING_MODES:
            raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {self.siblings!r}")
        if self.siblings != "iid" and max(self.branching) > self.vocab_size:
            raise ValueError(f"{self.name}: {max(self.branching)} distinct siblings need V >= that")

    @property
    def vocab_size(self) -> int:
        return self.world.vocab_size

    def target_law(self) -> np.ndarray:
        """The float64 law of the target's row at every state: the table's, or one-hot at its argmax
        (lowest id on a tie) for a greedy world."""
        rows = self.world.target.law()
        if not self.greedy:
            return rows
        return np.eye(rows.shape[1])[rows.argmax(1)]

    def sequence_law(self) -> np.ndarray:
        """The exact law of the first ``length`` tokens through the loop: the target's (a point mass
        on the greedy path for a greedy world)."""
        return self.world.sequence_law(self.target_law())

    @property
    def length(self) -> int:
        return self.world.length

    @property
    def depth(self) -> int:
        return len(self.branching)

    def width(self, path: tuple[int, ...]) -> int:
        """How many children the node reached by ``path`` (its tokens from the root) has: the
        exact laws (``exactcheck.tree.laws``) ask the world, so a shape that is not one width per
        depth is the world's business alone."""
        return self.branching[len(path)] if len(path) < self.depth else 0

    @functools.cached_property
    def topology(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tree_topology(self.branching)

    @property
    def nodes(self) -> int:
        """N + 1: the root and its N candidates."""
        return len(self.topology[0])

    @property
    def description(self) -> str:
        shape = " x ".join(str(b) for b in self.branching)
        return (f"tree {shape} ({self.nodes - 1} candidates, depth {self.depth}), siblings {self.siblings}"
                f"{', greedy target' if self.greedy else ''}; {self.world.description}")

    def draw_tree(self, states: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Trees for trials in ``states`` [B]: (target_probs [B, N+1, V] float32, draft_probs
        [B, N+1, V] float32, tokens [B, N+1] int64 (root's -1), parents [B, N+1] int64, node states
        [B, N+1]). Node i's rows are the models' rows after the path to node i; its children are
        drawn from its draft row as ``siblings`` says."""
        parents, depths = self.topology
        b = states.shape[0]
        device = states.device
        target = (torch.tensor(self.target_law(), dtype=torch.float32) if self.greedy
                  else self.world.target.table).to(device)
        draft = self.world.draft.table.to(device)
        node_states = torch.empty((b, self.nodes), dtype=torch.int64, device=device)
        tokens = torch.full((b, self.nodes), -1, dtype=torch.int64, device=device)
        node_states[:, 0] = states
        i = 1
        for node in range(self.nodes):
            width = self.branching[depths[node]] if depths[node] < self.depth else 0
            if not width:
                continue
            q = draft[node_states[:, node]].double()
            if self.siblings == "iid":
                kids = torch.multinomial(q, width, replacement=True, generator=generator)
            elif self.siblings == "without_replacement":
                kids = torch.multinomial(q, width, replacement=False, generator=generator)
            else:  # top_k: most likely first, ties by id
                order = torch.sort(q, dim=1, descending=True, stable=True).indices
                kids = order[:, :width]
            tokens[:, i:i + width] = kids
            node_states[:, i:i + width] = self.world.next_state(node_states[:, node:node + 1], kids)
            i += width
        parent_ids = torch.tensor(parents, dtype=torch.int64, device=device).expand(b, -1).clone()
        return target[node_states], draft[node_states], tokens, parent_ids, node_states


def _tree_world(name, vocab, states, length, branching, siblings, agreement, seed, greedy=False) -> TreeWorld:
    world = make_context_world(name, vocab, states, length, len(branching), agreement, seed)
    return TreeWorld(name, world, tuple(branching), siblings, greedy)


@functools.lru_cache(maxsize=1)
def tree_worlds() -> tuple[TreeWorld, ...]:
    """The built-in tree worlds: per sibling mode a branching tree, duplicates (iid on V = 2), a
    K = 1 tree (a chain), a deep narrow tree and a wide one (36 siblings, more than 32)."""
    return (
        _tree_world("tree_iid_v3_3x1", 3, 13, 4, (3, 1), "iid", 0.5, 41),
        _tree_world("tree_iid_dup_v2_3x2", 2, 7, 5, (3, 2), "iid", 0.4, 42),
        _tree_world("tree_iid_k1_v3_1x1x1", 3, 13, 5, (1, 1, 1), "iid", 0.6, 43),
        _tree_world("tree_iid_deep_v3_2x1x1x1", 3, 13, 6, (2, 1, 1, 1), "iid", 0.7, 44),
        _tree_world("tree_wor_v4_3x1", 4, 17, 4, (3, 1), "without_replacement", 0.5, 45),
        _tree_world("tree_wor_v3_2x2", 3, 13, 4, (2, 2), "without_replacement", 0.3, 46),
        _tree_world("tree_topk_v4_3x1", 4, 17, 4, (3, 1), "top_k", 0.5, 47),
        _tree_world("tree_topk_v3_2x2", 3, 13, 4, (2, 2), "top_k", 0.3, 48),
        _tree_world("tree_topk_k1_v3_1x1x1", 3, 13, 5, (1, 1, 1), "top_k", 0.6, 49),
        _tree_world("tree_topk_wide_v40_36", 40, 41, 2, (36,), "top_k", 0.0, 50),
        _tree_world("tree_topk_greedy_v4_3x1", 4, 17, 6, (3, 1), "top_k", 0.5, 51, greedy=True),
        _tree_world("tree_topk_greedy_v8_4x2x1", 8, 67, 6, (4, 2, 1), "top_k", 0.3, 52, greedy=True),
        _tree_world("tree_iid_greedy_v4_3x1", 4, 17, 6, (3, 1), "iid", 0.5, 53, greedy=True),
    )


