"""Tree worlds: the context toy LMs drafting a tree of candidates per verify call.

A ``TreeWorld`` is a ``ContextWorld`` (target and draft ``ToyLM`` sharing a state machine, so every
row depends on the whole prefix) and a tree **shape**: ``branching[d]`` children for every node at
depth d (the root, the context so far, is depth 0; the tree's depth D is ``len(branching)``). How
siblings are drawn from their parent's draft row is part of the world (``siblings``):

* ``iid``: independently, with replacement (SpecInfer: duplicates happen);
* ``without_replacement``: one after another, each from the row with the earlier ones removed
  (recursive speculative decoding; EAGLE-1 as shipped, ``torch.multinomial(replacement=False)``);
* ``top_k``: deterministically, the parent row's most likely tokens (ties by id: EAGLE-2/3 dynamic
  trees, SGLang, TensorRT-LLM).

A ``greedy`` world's target decodes greedily (one-hot rows at the argmax): its sequence law is a
point mass on the greedy path, so any other output is a deterministic finding (greedy tree
verifiers, e.g. SGLang's ``verify_tree_greedy``, run on these worlds only).

The shape is one width per depth (``branching``) unless the world gives one of two more, both for
``top_k`` siblings (the trees EAGLE-2/3 and Medusa verify), where a node is named by the ranks of
its path's tokens in their parents' draft rows:

* **ragged** (``choices``, Medusa's ``medusa_choices`` format): a fixed set of rank paths, e.g.
  ``((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))``: leaves at depths 1, 2 and 3; a
  verifier that pads shorter paths is exercised;
* **dynamic** (``expansion = (top, beam, depth, total)``, EAGLE-2's tree): every expanded node
  gets its ``top`` most likely children; at each depth the ``beam`` nodes with the highest path
  score (the product of the draft's probabilities along the path) are expanded; then every node
  drafted is reranked by path score and the ``total`` best kept. The shape depends on the draft's
  rows at the step's state: different for every state, chosen from the draft alone.

Per state, the tree of a ragged or dynamic world is fixed (``tree_at``), so the exact laws ask the
world for the width of the node a path reaches (``width(state, path)``) and nothing else changes.
Siblings drawn at random (iid, without replacement) keep one width per depth: which sibling slot
a subtree hangs from is not a function of the accepted tokens there, and the laws are written per
token.

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
    choices: tuple[tuple[int, ...], ...] | None = None  # ragged: rank paths (Medusa's format)
    expansion: tuple[int, int, int, int] | None = None  # dynamic: (top, beam, depth, total), EAGLE-2

    def __post_init__(self):
        if self.siblings not in SIBLING_MODES:
            raise ValueError(f"siblings must be one of {SIBLING_MODES}, got {self.siblings!r}")
        if self.siblings != "iid" and self.branching and max(self.branching) > self.vocab_size:
            raise ValueError(f"{self.name}: {max(self.branching)} distinct siblings need V >= that")
        if (self.choices is not None or self.expansion is not None) and self.siblings != "top_k":
            raise ValueError(f"{self.name}: ragged and dynamic shapes are for top_k siblings")
        if self.choices is not None:
            known = set(self.choices)
            for c in self.choices:
                if c[:-1] and c[:-1] not in known:
                    raise ValueError(f"{self.name}: choice {c} has no parent {c[:-1]}")
                if c[-1] > 0 and c[:-1] + (c[-1] - 1,) not in known:
                    raise ValueError(f"{self.name}: choice {c} skips rank {c[-1] - 1} (children are the top ranks)")

    @property
    def shaped_per_state(self) -> bool:
        """True for a ragged or dynamic world: its trees come from ``tree_at``."""
        return self.choices is not None or self.expansion is not None

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
        """The deepest a tree of this world can be."""
        if self.choices is not None:
            return max(len(c) for c in self.choices)
        if self.expansion is not None:
            return self.expansion[2]
        return len(self.branching)

    def width(self, state: int, path: tuple[int, ...]) -> int:
        """How many children the node reached by ``path`` (its tokens from the step's root at
        ``state``) has: the exact laws (``exactcheck.tree.laws``) ask the world, so the shape is
        the world's business alone."""
        if not self.shaped_per_state:
            return self.branching[len(path)] if len(path) < len(self.branching) else 0
        tokens, parents = self.tree_at(state)
        node = 0
        for x in path:
            node = next(i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == x)
        return sum(1 for i in range(1, len(tokens)) if parents[i] == node)

    @functools.cached_property
    def topology(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(parents, depths) of a world with one shape for every state (``branching`` or
        ``choices``); a dynamic world's shape is per state (``tree_at``)."""
        if self.expansion is not None:
            raise ValueError(f"{self.name}: a dynamic tree has no fixed topology; see tree_at(state)")
        if self.choices is not None:
            paths = _ordered_choices(self.choices)
            index = {c: i + 1 for i, c in enumerate(paths)}
            parents = (-1,) + tuple(index.get(c[:-1], 0) for c in paths)
            return parents, (0,) + tuple(len(c) for c in paths)
        return tree_topology(self.branching)

    @property
    def nodes(self) -> int:
        """N + 1: the root and its N candidates (the same for every state, dynamic worlds too)."""
        if self.expansion is not None:
            return self.expansion[3] + 1
        return len(self.topology[0])

    def tree_at(self, state: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(tokens, parents) of the top-k tree drafted at ``state`` (node 0 the root, token -1)."""
        return self._trees_per_state[state]

    @functools.cached_property
    def _trees_per_state(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        q = self.world.draft.law()
        return tuple(self._build_tree(s, q) for s in range(self.world.num_states))

    def _build_tree(self, state: int, q: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
        nxt = self.world.next_state
        if self.expansion is None:
            parents, _ = self.topology
            paths = [()] + (_ordered_choices(self.choices) if self.choices is not None
                            else _uniform_rank_paths(self.branching))
            states, tokens = {(): state}, [-1]
            for path in paths[1:]:
                order = np.argsort(-q[states[path[:-1]]], kind="stable")
                x = int(order[path[-1]])
                tokens.append(x)
                states[path] = int(nxt(states[path[:-1]], x))
            return tuple(tokens), tuple(parents)
        top, beam, depth, total = self.expansion
        # nodes: (score, depth, order drafted, token, parent node index in `drafted`, state)
        drafted = [(1.0, 0, 0, -1, -1, state)]
        frontier = [0]
        for d in range(1, depth + 1):
            level = []
            for parent in frontier:
                score, _, _, _, _, s = drafted[parent]
                for x in np.argsort(-q[s], kind="stable")[:top]:
                    drafted.append((score * float(q[s, x]), d, len(drafted), int(x), parent,
                                    int(nxt(s, int(x)))))
                    level.append(len(drafted) - 1)
            frontier = sorted(level, key=lambda i: (-drafted[i][0], drafted[i][2]))[:beam]
        # rerank every drafted node by path score; a child never outscores its parent and ties go to
        # the shallower, earlier-drafted node, so the kept set holds every kept node's ancestors
        kept = sorted(range(1, len(drafted)), key=lambda i: (-drafted[i][0], drafted[i][1], drafted[i][2]))[:total]
        order = [0] + sorted(kept, key=lambda i: (drafted[i][1], drafted[i][2]))  # breadth-first
        where = {old: new for new, old in enumerate(order)}
        return (tuple(drafted[i][3] for i in order),
                (-1,) + tuple(where[drafted[i][4]] for i in order[1:]))

    @property
    def description(self) -> str:
        if self.choices is not None:
            shape = f"ragged ({len(self.choices)} Medusa choices)"
        elif self.expansion is not None:
            top, beam, depth, total = self.expansion
            shape = f"dynamic (EAGLE-2: top {top}, beam {beam}, depth {depth}, {total} kept)"
        else:
            shape = " x ".join(str(b) for b in self.branching)
        return (f"tree {shape} ({self.nodes - 1} candidates, depth {self.depth}), siblings {self.siblings}"
                f"{', greedy target' if self.greedy else ''}; {self.world.description}")

    @property
    def shape_name(self) -> str:
        """The shape in a few characters (``exactcheck list``)."""
        if self.choices is not None:
            return f"ragged {len(self.choices)}"
        if self.expansion is not None:
            return "dynamic {}/{}/{}/{}".format(*self.expansion)
        return "branching " + "x".join(map(str, self.branching))

    def draw_tree(self, states: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Trees for trials in ``states`` [B]: (target_probs [B, N+1, V] float32, draft_probs
        [B, N+1, V] float32, tokens [B, N+1] int64 (root's -1), parents [B, N+1] int64, node states
        [B, N+1]). Node i's rows are the models' rows after the path to node i; its children are
        drawn from its draft row as ``siblings`` says."""
        b = states.shape[0]
        device = states.device
        target = (torch.tensor(self.target_law(), dtype=torch.float32) if self.greedy
                  else self.world.target.table).to(device)
        draft = self.world.draft.table.to(device)
        if self.shaped_per_state:  # top-k: the tree is a function of the state, looked up
            tokens, parents, node_states = (t.to(device)[states] for t in self._tree_tables)
            return target[node_states], draft[node_states], tokens, parents, node_states
        parents, depths = self.topology
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


    @functools.cached_property
    def _tree_tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[S, N+1] tokens, parents and node states of the tree at every state."""
        tokens, parents, node_states = [], [], []
        for s in range(self.world.num_states):
            t, par = self.tree_at(s)
            st = [s]
            for i in range(1, len(t)):
                st.append(int(self.world.next_state(st[par[i]], t[i])))
            tokens.append(t)
            parents.append(par)
            node_states.append(st)
        return tuple(torch.tensor(x, dtype=torch.int64) for x in (tokens, parents, node_states))


def _ordered_choices(choices) -> list[tuple[int, ...]]:
    """Rank paths breadth-first: by depth, then by path (parents before children)."""
    return sorted(set(map(tuple, choices)), key=lambda c: (len(c), c))


def _uniform_rank_paths(branching) -> list[tuple[int, ...]]:
    level, out = [()], []
    for width in branching:
        level = [c + (r,) for c in level for r in range(width)]
        out += level
    return out


def _tree_world(name, vocab, states, length, branching, siblings, agreement, seed, greedy=False,
                choices=None, expansion=None) -> TreeWorld:
    depth = len(branching) if branching else (max(map(len, choices)) if choices else expansion[2])
    world = make_context_world(name, vocab, states, length, depth, agreement, seed)
    return TreeWorld(name, world, tuple(branching), siblings, greedy, choices, expansion)


# a Medusa-style ragged tree: leaves at depths 1, 2 and 3 (the first choices of Medusa's mc_sim trees)
MEDUSA_CHOICES = ((0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0))


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
        _tree_world("tree_topk_ragged_v4_medusa7", 4, 17, 5, (), "top_k", 0.4, 54, choices=MEDUSA_CHOICES),
        _tree_world("tree_topk_dynamic_v5_eagle2", 5, 19, 5, (), "top_k", 0.6, 55, expansion=(3, 2, 4, 8)),
    )


