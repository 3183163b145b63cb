"""exactcheck's reference tree loop over cached models, and its tree-cache mutants.

``ReferenceTreeLoop`` is a tree generator (``exactcheck.contracts.tree_generator``). With F the committed
sequence (prompt + tokens generated so far, T = len(F)), each round:

1. **draft** (``draft_tree``): the draft is fed the committed tokens its cache lacks (F[known:],
   positions known .. T-1; its last row is the root's draft row q_0), then one forward per depth
   d = 1 .. D-1 feeding the nodes of that depth; each node's children are drawn from its draft
   row as ``tree.siblings`` says (``iid``: with replacement; ``without_replacement``; ``top_k``:
   the most likely, ties by id), like ``TreeWorld.draw_tree``. Leaves are not fed (their draft
   rows are never used; they are set to uniform). A **dynamic** world (``tree.expansion = (top,
   beam, depth, total)``, EAGLE-2) is drafted from the draft's own rows instead
   (``draft_dynamic``): the root's ``top`` most likely children are depth 1; for d = 1 .. depth-1
   the ``beam`` nodes of depth d with the highest path score (the product of the draft
   probabilities along the path; ties to the earlier drafted) are fed in one forward, best first,
   and each gets its ``top`` most likely children (drafted in that order); then every drafted node is reranked
   by path score (ties to the shallower, then earlier drafted) and the ``total`` best kept, numbered
   breadth-first (by depth, then order drafted), so parents precede children. The tree, a
   ``DraftedTree``, is the world's ``tree_at(state)`` when the rows are the world's;
2. **score** (``score_tree``): ONE target forward whose inputs are F[known:] then the N candidates
   in breadth-first order (the round's tree: ``tree.topology``, or the dynamic tree drafted): node
   0, the root, is F's last token;
3. **verify** (``verify``): the reference verifier of the sibling mode (``multi_round``,
   ``without_replacement``, ``deterministic`` from ``exactcheck.contracts.tree_reference``) on
   target_probs [1, N+1, V] (row i: the target's row after the path to node i; row 0 after F),
   draft_probs likewise, tokens (root -1) and parents; it emits the accepted path's tokens and
   one correction or bonus token;
4. **commit** (``commit``): F grows by the emitted tokens; each cache is compacted (``keep``) to
   F's new value minus its last token: the committed entries, then the accepted path's entries
   (which were written at the right positions), every other node's entry dropped (in the draft
   cache of a dynamic world that includes the fed beam nodes that were not kept or not accepted).

Conventions (what ``exactcheck.tree.cache_checks`` checks):

* between rounds the target's cache holds F[:T-1] at positions 0 .. T-2 (``known`` = T-1
  entries); the draft's the same, or one entry less after a round that accepted a leaf (a leaf
  is never fed to the draft, so its entry is fed with the next round's committed tokens; in a
  dynamic world, any accepted node that was not a beam node);
* positions: the committed inputs get known, known+1, ..., T-1 (the root is at T-1); node i
  at depth d gets T - 1 + d (in the draft's forwards of a dynamic world, node ids are the order
  drafted; in the target's, the kept tree's breadth-first ids);
* masks: a committed input sees the cache and the inputs up to itself; a node sees every
  committed entry (cache and inputs), its ancestors and itself, and no other node.

The loop stops once ``max_new_tokens`` tokens are generated and returns exactly that many (the
last round's extra tokens cut). One method per step, so each mutant overrides exactly one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from exactcheck.contracts.tree_reference import deterministic, multi_round, without_replacement
from toy_models.tree_worlds import TreeWorld

__all__ = ["DraftedTree", "ReferenceTreeLoop", "RejectedBranchKept", "AcceptedPositionsOffByDepth", "SiblingVisible",
           "TREE_CACHE_MUTANTS", "TREE_LOOP_MUTANTS", "VERIFIER_FOR_SIBLINGS", "attention_mask", "path_nodes",
           "tree_attention_mask"]

# ReferenceTreeLoop.visibility's cache: (class, parents) -> which node sees which
_VISIBILITY: dict[tuple, np.ndarray] = {}

# the reference verifier that is exact for each way siblings are drawn
VERIFIER_FOR_SIBLINGS = {"iid": multi_round, "without_replacement": without_replacement, "top_k": deterministic}


def attention_mask(cache_labels: list, input_labels: list, sees) -> torch.Tensor:
    """The bool mask [n, cache + n] for a forward. A label is None for a committed entry or the
    id of the tree node the entry holds. A committed entry is seen by every input after it (and
    by itself); a node entry is seen by node input a when ``sees(a, node)``, never by a
    committed input."""
    size = 1 + max((x for x in list(cache_labels) + list(input_labels) if x is not None), default=-1)
    visible = np.array([[bool(sees(a, b)) for b in range(size)] for a in range(size)], dtype=bool).reshape(size, size)
    return tree_attention_mask(cache_labels, input_labels, visible)


def tree_attention_mask(cache_labels: list, input_labels: list, visible: np.ndarray) -> torch.Tensor:
    """``attention_mask`` with ``sees`` given as a table: ``visible[a, b]`` for nodes a, b."""
    labels = list(cache_labels) + list(input_labels)
    mask = np.tri(len(input_labels), len(labels), len(cache_labels), dtype=bool)  # entry b <= start + a
    nodes = [b for b, theirs in enumerate(labels) if theirs is not None]
    if nodes:
        mask[:, nodes] = False
        fed = [a for a, mine in enumerate(input_labels) if mine is not None]
        mask[np.array(fed, dtype=np.int64)[:, None], nodes] = visible[
            np.array([input_labels[a] for a in fed], dtype=np.int64)[:, None], [labels[b] for b in nodes]]
    return torch.from_numpy(mask)


def path_nodes(emitted: list[int], tokens: list[int], parents: tuple[int, ...]) -> list[int]:
    """The node ids of the accepted path (the emitted tokens but the last), from the root's child
    down. With duplicate siblings several paths carry the same tokens; the first in index order
    that continues the whole path is taken (their cache entries are the same tokens at the same
    positions)."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        if parent >= 0:
            children.setdefault(parent, []).append(node)
    path = emitted[:-1]

    def walk(node: int, j: int):
        if j == len(path):
            return []
        for child in children.get(node, ()):
            if tokens[child] == path[j]:
                rest = walk(child, j + 1)
                if rest is not None:
                    return [child] + rest
        return None

    found = walk(0, 0)
    if found is None:
        raise ValueError(f"emitted {emitted} is not a path of the tree {tokens} (parents {parents})")
    return found


@dataclass(frozen=True)
class DraftedTree:
    """One round's tree: ``tokens`` [N+1] (the root's -1), ``parents`` and ``depths`` (breadth-first,
    parents[i] < i), the draft rows ``q`` [N+1, V] (uniform for a node never fed to the draft) and
    ``draft_index``: node -> its entry in the draft's cache (the nodes fed to the draft)."""

    tokens: list[int]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    q: torch.Tensor
    draft_index: dict[int, int]

    @property
    def nodes(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class ReferenceTreeLoop:
    """An exact tree generator with explicit cache compaction (module docstring)."""

    name: str = "exactcheck reference tree loop"
    root_score: float = 1.0  # a path's score starts here and ``extend_score`` grows it

    def extend_score(self, parent_score: float, probability: float) -> float:
        """A child's path score (EAGLE-2's: the product of the draft's probabilities, float64)."""
        return parent_score * probability

    def round_generator(self, generator: torch.Generator, generation: dict) -> torch.Generator:
        """The generator one round drafts and verifies with (``generation``: state kept over one
        generation's rounds): the caller's, so every round draws fresh random numbers."""
        return generator

    def __call__(self, target, draft, prompt_ids: list[int], max_new_tokens: int, tree: TreeWorld,
                 generator: torch.Generator) -> list[int]:
        sequence = [int(x) for x in prompt_ids]
        prompt = len(sequence)
        known = {"target": 0, "draft": 0}  # committed entries the loop believes each cache holds
        generation: dict = {}
        with torch.no_grad():
            while len(sequence) - prompt < max_new_tokens:
                rng = self.round_generator(generator, generation)
                drafted = self.draft_tree(draft, sequence, known["draft"], tree, rng)
                p = self.score_tree(target, sequence, known["target"], drafted)
                emitted = self.verify(p, drafted, tree, rng)
                path = path_nodes(emitted, drafted.tokens, drafted.parents)
                committed = len(sequence)  # entries F's tokens take in each cache after this round's feeds
                sequence += emitted
                self.commit(target, draft, committed, path, drafted)
                # F minus its last token; the draft lacks an accepted node it never fed (a leaf);
                # the fed nodes of a path are a prefix of it (only fed nodes get children)
                known = {"target": committed + len(path),
                         "draft": committed + sum(i in drafted.draft_index for i in path)}
        return sequence[prompt:prompt + max_new_tokens]

    # -- steps -------------------------------------------------------------------------------
    def sees(self, node: int, other: int, parents: tuple[int, ...]) -> bool:
        """Whether tree node ``node`` attends to node ``other``: its ancestors and itself. A
        function of its arguments alone: ``visibility`` asks it once per class and tree."""
        while node >= 0:
            if node == other:
                return True
            node = parents[node]
        return False

    def visibility(self, parents) -> np.ndarray:
        """[N+1, N+1] bool: ``sees(a, b, parents)`` for every two nodes of the tree, cached per class
        and tree (a dynamic round's drafted tree grows, so its parents are a key at each size)."""
        key = (type(self), tuple(parents))
        if key not in _VISIBILITY:
            if len(_VISIBILITY) >= 4096:
                _VISIBILITY.clear()
            nodes = range(len(parents))
            _VISIBILITY[key] = np.array([[bool(self.sees(a, b, key[1])) for b in nodes] for a in nodes],
                                        dtype=bool).reshape(len(parents), len(parents))
        return _VISIBILITY[key]

    def node_position(self, root_position: int, node: int, depths: tuple[int, ...]) -> int:
        """The position id of tree node ``node``: the root's plus its depth."""
        return root_position + depths[node]

    def rows(self, model, tokens: list[int], positions: list[int], cache_labels: list, input_labels: list,
             parents: tuple[int, ...]) -> torch.Tensor:
        """One forward; the float64 rows [n, V] (softmax of the logits)."""
        mask = tree_attention_mask(cache_labels, input_labels, self.visibility(parents))
        logits = model.forward(torch.tensor([tokens], dtype=torch.int64), torch.tensor([positions], dtype=torch.int64),
                               mask)
        return torch.softmax(logits[0].double(), -1)

    def draft_children(self, q: torch.Tensor, width: int, siblings: str, generator) -> list[int]:
        if siblings == "top_k":
            return torch.sort(q, descending=True, stable=True).indices[:width].tolist()
        return torch.multinomial(q, width, replacement=siblings == "iid", generator=generator).tolist()

    def _draft_root(self, draft, sequence: list[int], known: int, parents) -> tuple[torch.Tensor, list]:
        """Feed the draft the committed tokens its cache lacks: (the root's draft row, the draft
        cache's labels: None for a committed entry, 0 for the root)."""
        feed = sequence[known:]
        labels = [None] * draft.cache_length
        fed = [None] * (len(feed) - 1) + [0]
        q0 = self.rows(draft, feed, list(range(known, len(sequence))), labels, fed, parents)[-1]
        return q0, labels + fed

    def draft_tree(self, draft, sequence: list[int], known: int, tree: TreeWorld, generator) -> DraftedTree:
        """The round's tree: of ``tree``'s fixed shape, or EAGLE-2's (``draft_dynamic``)."""
        if tree.expansion is not None:
            return self.draft_dynamic(draft, sequence, known, tree, generator)
        parents, depths = tree.topology
        root_position = len(sequence) - 1
        q0, labels = self._draft_root(draft, sequence, known, parents)
        tokens = [-1] * tree.nodes
        q = torch.full((tree.nodes, tree.vocab_size), 1.0 / tree.vocab_size, dtype=torch.float64)
        q[0] = q0
        index = {0: len(labels) - 1}
        children = [[] for _ in parents]
        for i in range(1, tree.nodes):
            children[parents[i]].append(i)
        level = [0]
        for d in range(tree.depth):
            nxt = []
            for node in level:  # children of this level's nodes, breadth-first like tree.topology
                kids = children[node]
                for kid, token in zip(kids, self.draft_children(q[node], len(kids), tree.siblings, generator)):
                    tokens[kid] = int(token)
                nxt += kids
            level = nxt
            if d + 1 == tree.depth or not level:
                break  # leaves are not fed
            positions = [self.node_position(root_position, i, depths) for i in level]
            rows = self.rows(draft, [tokens[i] for i in level], positions, labels, level, parents)
            for i, row in zip(level, rows):
                q[i] = row
                index[i] = len(labels)
                labels.append(i)
        return DraftedTree(tokens, parents, depths, q, index)

    def draft_dynamic(self, draft, sequence: list[int], known: int, tree: TreeWorld, generator) -> DraftedTree:
        """EAGLE-2's tree from the draft's own rows (module docstring, step 1). Drafted nodes are
        numbered in the order drafted (the root 0) until the kept ones are renumbered breadth-first."""
        top, beam, depth, total = tree.expansion
        root_position = len(sequence) - 1
        tokens, parents, depths, scores = [-1], [-1], [0], [self.root_score]
        q0, labels = self._draft_root(draft, sequence, known, parents)
        rows, index = {0: q0}, {0: len(labels) - 1}
        frontier = [0]
        for d in range(1, depth + 1):
            level = []
            for parent in frontier:
                for x in self.draft_children(rows[parent], top, "top_k", generator):
                    tokens.append(int(x))
                    parents.append(parent)
                    depths.append(d)
                    scores.append(self.extend_score(scores[parent], float(rows[parent][int(x)])))
                    level.append(len(tokens) - 1)
            if d == depth:
                break  # the last depth's nodes are not fed
            fed = sorted(level, key=lambda i: (-scores[i], i))[:beam]  # the beam, best first
            positions = [self.node_position(root_position, i, depths) for i in fed]
            out = self.rows(draft, [tokens[i] for i in fed], positions, labels, fed, parents)
            for i, row in zip(fed, out):
                rows[i] = row
                index[i] = len(labels)
                labels.append(i)
            frontier = fed
        kept = sorted(range(1, len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:total]
        order = [0] + sorted(kept, key=lambda i: (depths[i], i))  # a child never outscores its parent
        new = {old: j for j, old in enumerate(order)}
        q = torch.full((len(order), tree.vocab_size), 1.0 / tree.vocab_size, dtype=torch.float64)
        for old, j in new.items():
            if old in rows:
                q[j] = rows[old]
        return DraftedTree([tokens[i] for i in order], (-1,) + tuple(new[parents[i]] for i in order[1:]),
                           tuple(depths[i] for i in order), q, {new[i]: index[i] for i in order if i in index})

    def score_tree(self, target, sequence: list[int], known: int, drafted: DraftedTree) -> torch.Tensor:
        """The target's rows [N+1, V] from one forward over the pending committed tokens and the tree."""
        feed = sequence[known:]
        root_position = len(sequence) - 1
        labels = [None] * (len(feed) - 1) + list(range(drafted.nodes))
        positions = list(range(known, len(sequence))) + [self.node_position(root_position, i, drafted.depths)
                                                         for i in range(1, drafted.nodes)]
        rows = self.rows(target, feed + drafted.tokens[1:], positions, [None] * target.cache_length, labels,
                         drafted.parents)
        return rows[len(feed) - 1:]

    def verify(self, p: torch.Tensor, drafted: DraftedTree, tree: TreeWorld, generator) -> list[int]:
        """The emitted tokens: the accepted path, then one correction or bonus token."""
        verifier = VERIFIER_FOR_SIBLINGS[tree.siblings]
        out = verifier(p[None], drafted.q[None], torch.tensor([drafted.tokens]), torch.tensor([drafted.parents]),
                       generator)[0]
        return out[out >= 0].tolist()

    def kept(self, committed: int, path: list[int], index: dict[int, int], drafted: DraftedTree,
             role: str) -> list[int]:
        """The cache indices a model keeps after the round: the ``committed`` entries, then the
        accepted path's entries (``index``: node -> cache index; a leaf the draft never fed has none)."""
        return list(range(committed)) + [index[i] for i in path if i in index]

    def commit(self, target, draft, committed: int, path: list[int], drafted: DraftedTree):
        """Compact both caches to the committed sequence minus its last token."""
        target_index = {i: committed - 1 + i for i in range(drafted.nodes)}  # node i's entry in the target cache
        target.keep(self.kept(committed, path, target_index, drafted, "target"))
        draft.keep(self.kept(committed, path, drafted.draft_index, drafted, "draft"))


# -- tree-cache mutants (the TensorRT-LLM #10343 class: after a tree verify the KV cache keeps
#    a rejected branch, the accepted path's positions are off, a sibling is visible) ---------

@dataclass(frozen=True)
class RejectedBranchKept(ReferenceTreeLoop):
    """After a verify the target cache also keeps a rejected branch: the first node off the
    accepted path whose parent is on it (root included), with its descendants, stays in the cache
    and is seen by every later call."""

    name: str = "mutant: rejected_branch_kept"

    def kept(self, committed, path, index, drafted, role):
        keep = super().kept(committed, path, index, drafted, role)
        if role != "target":
            return keep
        parents = drafted.parents
        on_path = {0, *path}
        rejected = next((i for i in range(1, drafted.nodes) if parents[i] in on_path and i not in on_path), None)
        if rejected is None:
            return keep
        branch = {rejected}
        for i in range(rejected + 1, drafted.nodes):
            if parents[i] in branch:
                branch.add(i)
        return sorted(set(keep) | {index[i] for i in branch})


@dataclass(frozen=True)
class AcceptedPositionsOffByDepth(ReferenceTreeLoop):
    """Node positions computed from the node's breadth-first index instead of its depth (root
    position + index), so the accepted path is written, and kept, at positions off by
    index - depth; later calls see the committed tokens out of order."""

    name: str = "mutant: accepted_positions_off_by_depth"

    def node_position(self, root_position, node, depths):
        return root_position + node


@dataclass(frozen=True)
class SiblingVisible(ReferenceTreeLoop):
    """The tree mask is causal by node index instead of by ancestry: a node sees every earlier
    node, its earlier siblings and cousins included."""

    name: str = "mutant: sibling_visible"

    def sees(self, node, other, parents):
        return other <= node


TREE_CACHE_MUTANTS = {"rejected_branch_kept": RejectedBranchKept(),
                      "accepted_positions_off_by_depth": AcceptedPositionsOffByDepth(),
                      "sibling_visible": SiblingVisible()}


# -- a randomness mutant of the loop (its cache is exact: the law finds it) ---------------------

@dataclass(frozen=True)
class CoinsReusedAcrossRounds(ReferenceTreeLoop):
    """The random numbers are drawn once per generation and every round draws the same ones again,
    the draft's sibling draws and the verify's coins alike. The class read in Sequoia's
    ``SpecTree`` (Infini-AI-Lab/Sequoia ``Tree/SpecTree.py``, read, not run: it needs CUDA graphs
    and its own engines): ``self.rand`` (the Gumbel noise of its sibling draws, indexed by tree
    row) and ``self.r`` (the acceptance uniforms, indexed by absolute position) are drawn in
    ``__init__``, once per prompt, and never redrawn in ``prepare_for_next_iter``, so each round
    drafts with the same noise and reuses the uniforms earlier rounds drew at its positions. Here
    both repeat each round, the simplest form of the class. The first round is exact; later
    rounds' draws depend on what they decided before."""

    name: str = "mutant: coins_reused_across_rounds"

    def round_generator(self, generator, generation):
        if "seed" not in generation:
            generation["seed"] = int(torch.randint(0, 2 ** 62, (), generator=generator))
        return torch.Generator().manual_seed(generation["seed"])


TREE_LOOP_MUTANTS = {**TREE_CACHE_MUTANTS, "coins_reused_across_rounds": CoinsReusedAcrossRounds()}
