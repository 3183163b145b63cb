"""The tree verification rules, one registry (``TREE_RULES``), as ``exactcheck.rules`` is for chains.

A tree rule is how a verifier decides at one node of a drafted tree: its children are tried in
index order against a residual that starts as the node's target row; the first accepted child is
emitted and the walk descends into it; when every child is rejected (or the node is a leaf) one
token is drawn and the step ends. Everything exactcheck knows of a rule follows from its entry:

- ``sibling_mode``: how the siblings it is exact for are drawn (``toy_models.tree_worlds``:
  "iid", "without_replacement", "top_k");
- ``node_law(p, q, width)``: at a node with target row p and draft row q (float64) whose
  ``width`` children are drawn as ``sibling_mode`` says, P(the child accepted has token x) [V] and
  P(every child rejected, the correction is y) [V]; ``leaf_law(p)``: the law of the token drawn at
  a leaf (the bonus; p itself for every exact rule). ``exactcheck.tree.laws`` composes them into
  one verify step's exact law, with no knowledge of any rule;
- ``node_decision(p, q, kid_tokens, u)``: the rule's decision at one node with every acceptance
  coin forced to u (the child accepted, and the thresholds u was compared with, accepted iff
  u < threshold); ``oracle(p, q, tokens, parents, u)`` walks a whole tree with it (a
  ``TreeDecision``: the accepted path and every comparison read), and
  ``exactcheck.tree.properties``' ``tree_rule_decisions`` judges a subject's path against it;
- ``title``, ``source`` (the paper or engine file it follows), ``exact``, ``formula``.

A rule whose decision at a node depends on the subtrees below it (typical acceptance keeps the
deepest fully accepted path of the whole tree, as Medusa does) overrides ``step_law(view)``
instead: the law of one step's emitted tuple, read from a ``TreeView`` (the step's root state,
the rows at every state, the width of every node, the state after a token). The default composes
``node_law``/``leaf_law`` over the tree. Such a rule gives ``oracle`` whole as well (typical
acceptance draws no coin for acceptance: its path is the same at every u, and the comparisons it
reports are of p(x) with its threshold).

A new rule is one entry here (its ``TreeRule`` subclass and its row in ``TREE_RULES``) and its
proofs: a reference walk in ``exactcheck.contracts.tree_reference`` (Monte Carlo against the law in
``property_tests/tree/test_tree.py``), docs. Numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from exactcheck.rules import typical_threshold as chain_typical_threshold

__all__ = ["TreeRule", "TreeView", "TREE_RULES", "RULE_SIBLINGS", "tree_rule", "top_k_order",
           "typical_threshold", "Comparison", "TreeDecision", "children_of"]


def _norm(r: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    total = r.sum()
    return r / total if total > 0 else fallback


def top_k_order(q: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` most likely tokens of ``q``, ties by id (the top-k worlds' siblings)."""
    return np.argsort(-q, kind="stable")[:width]


class TreeView(Protocol):
    """What a rule may read of one step's tree (``exactcheck.tree.laws`` builds it from a world)."""

    root: int  # the state at the step's root (the context so far)

    def p(self, state: int) -> np.ndarray: ...  # the target's row at a state, float64

    def q(self, state: int) -> np.ndarray: ...  # the draft's row at a state, float64

    def width(self, path: tuple[int, ...]) -> int: ...  # children of the node reached by ``path``

    def after(self, state: int, token: int) -> int: ...  # the state after ``token``


def _add(out: dict, key: tuple[int, ...], mass: float) -> None:
    out[key] = out.get(key, 0.0) + mass


@dataclass(frozen=True)
class Comparison:
    """One test a walk read while trying child ``child`` (a node id) of node ``node``: the coin u
    against ``threshold``, the child accepted iff u < threshold; or, where ``against`` is given (a
    rule that draws no coin for acceptance), ``against`` > ``threshold``."""

    node: int
    child: int
    threshold: float
    against: float | None = None


@dataclass(frozen=True)
class TreeDecision:
    """A rule's decision on one tree at a forced coin: the accepted path (node ids and their
    tokens, from the root's child down) and every comparison it read, in order."""

    nodes: tuple[int, ...]
    tokens: tuple[int, ...]
    comparisons: tuple[Comparison, ...]


def children_of(parents) -> dict[int, list[int]]:
    """Node id -> its children's ids in index order (nodes without children absent)."""
    out: dict[int, list[int]] = {}
    for i in range(1, len(parents)):
        out.setdefault(int(parents[i]), []).append(i)
    return out


@dataclass(frozen=True)
class TreeRule:
    """One tree verification rule. Subclasses give ``node_law`` and ``node_decision`` (or
    ``step_law`` and ``oracle``)."""

    name: str
    title: str
    source: str
    sibling_mode: str
    exact: bool = True
    takes_draft_probs: bool = True
    formula: str = ""

    def node_law(self, p: np.ndarray, q: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def leaf_law(self, p: np.ndarray) -> np.ndarray:
        return p

    def step_law(self, view: TreeView) -> dict[tuple[int, ...], float]:
        """The law of one step's emitted tuple (accepted path, then the correction or bonus):
        ``node_law`` at every node with children, ``leaf_law`` at a leaf."""
        out: dict[tuple[int, ...], float] = {}

        def emit(prefix, rows, weight):
            for x in np.flatnonzero(rows > 0):
                _add(out, prefix + (int(x),), weight * float(rows[x]))

        def node(s, prefix, weight):
            width = view.width(prefix)
            if width == 0:
                emit(prefix, self.leaf_law(view.p(s)), weight)
                return
            accept, correct = self.node_law(view.p(s), view.q(s), width)
            for x in np.flatnonzero(accept > 0):
                node(view.after(s, int(x)), prefix + (int(x),), weight * float(accept[x]))
            emit(prefix, correct, weight)

        node(view.root, (), 1.0)
        return out

    def node_decision(self, p: np.ndarray, q: np.ndarray | None, kid_tokens: list[int],
                      u: float) -> tuple[int | None, list[tuple[int, float]]]:
        """At one node (target row p, draft row q: None for a rule that takes none), its children's
        tokens in index order, every acceptance coin equal to u: (the slot of the child accepted,
        None when every one is rejected; the (slot, threshold) pairs compared, in order: accepted
        iff u < threshold). Computed in the rows' dtype."""
        raise NotImplementedError

    def oracle(self, p: np.ndarray, q: np.ndarray | None, tokens, parents, u: float) -> TreeDecision:
        """The path this rule accepts on one tree (rows p, q [N+1, V], tokens and parents [N+1],
        the tree contract's) when every acceptance coin is u: ``node_decision`` from the root down,
        the walk descending into each accepted child."""
        children = children_of(parents)
        node, nodes, read = 0, [], []
        while children.get(node):
            kids = children[node]
            slot, compared = self.node_decision(p[node], None if q is None else q[node],
                                                [int(tokens[k]) for k in kids], u)
            read += [Comparison(node, kids[j], float(t)) for j, t in compared]
            if slot is None:
                break
            node = kids[slot]
            nodes.append(node)
        return TreeDecision(tuple(nodes), tuple(int(tokens[n]) for n in nodes), tuple(read))



class MultiRound(TreeRule):
    """Siblings i.i.d. from q: child x accepted with min(1, r(x)/q(x)); on a rejection
    r <- norm(max(r - q, 0))."""

    def _next_draft(self, q: np.ndarray, x: int) -> np.ndarray:
        return q

    def node_law(self, p, q, width):
        accept, correct = np.zeros_like(p), np.zeros_like(p)

        def sibling(r, qj, j, weight):
            if weight <= 0:
                return
            if j == width:
                correct[:] += weight * r
                return
            for x in np.flatnonzero(qj > 0):
                drawn = weight * float(qj[x])
                a = min(1.0, float(r[x]) / float(qj[x]))
                accept[x] += drawn * a
                if a < 1:
                    sibling(_norm(np.clip(r - qj, 0, None), r), self._next_draft(qj, int(x)), j + 1, drawn * (1 - a))

        sibling(p.copy(), q.copy(), 0, 1.0)
        return accept, correct

    def node_decision(self, p, q, kid_tokens, u):
        """One coin per sibling tried: x accepted iff u < r(x)/q_j(x) (r(x) > 0 where q_j(x) = 0:
        accepted, as ``u * q < r`` does); on a rejection r <- norm(max(r - q_j, 0))."""
        r, qj, read = p.copy(), q.copy(), []
        for j, x in enumerate(kid_tokens):
            rx, qx = r[x], qj[x]
            threshold = rx / qx if qx > 0 else (np.inf if rx > 0 else 0.0)
            read.append((j, threshold))
            if u < threshold:
                return j, read
            r = _norm(np.clip(r - qj, 0, None), r)
            qj = self._next_draft(qj, x)
        return None, read



class WithoutReplacement(MultiRound):
    """Siblings drawn one after another from q with the earlier ones removed: sibling j from q_j,
    accepted with min(1, r(x)/q_j(x)); on a rejection r <- norm(max(r - q_j, 0))."""

    def _next_draft(self, q, x):
        nxt = q.copy()
        nxt[x] = 0.0
        return _norm(nxt, nxt)


class Deterministic(TreeRule):
    """Point-mass siblings (top-k): child x accepted with r(x); on a rejection x is zeroed in r."""

    def node_law(self, p, q, width):
        accept, correct = np.zeros_like(p), np.zeros_like(p)
        r, weight = p.copy(), 1.0
        for x in top_k_order(q, width):
            a = float(r[x])
            accept[x] += weight * a
            weight *= 1 - a
            if weight <= 0:
                return accept, correct
            rest = r.copy()
            rest[x] = 0.0
            r = _norm(rest, r)
        correct += weight * r
        return accept, correct

    def node_decision(self, p, q, kid_tokens, u):
        """One coin per sibling tried: x accepted iff u < r(x); on a rejection x zeroed in r."""
        r, read = p.copy(), []
        for j, x in enumerate(kid_tokens):
            read.append((j, r[x]))
            if u < r[x]:
                return j, read
            rest = r.copy()
            rest[x] = 0.0
            r = _norm(rest, r)
        return None, read



class TargetOnly(TreeRule):
    """One coin u per node: the first sibling whose cumulative target mass (each distinct token
    once) exceeds u is accepted; if none, the correction from p with the siblings' tokens zeroed."""

    def node_law(self, p, q, width):
        order = top_k_order(q, width)
        accept, rest = np.zeros_like(p), p.copy()
        accept[order] = p[order]
        rest[order] = 0.0
        return accept, rest

    def node_decision(self, p, q, kid_tokens, u):
        """One coin per node: the first sibling whose cumulative target mass (each distinct token
        counted once; a repeated token is not tried) exceeds u."""
        cumulative, seen, read = p.dtype.type(0), set(), []
        for j, x in enumerate(kid_tokens):
            if x in seen:
                continue
            seen.add(x)
            cumulative = cumulative + p[x]
            read.append((j, cumulative))
            if u < cumulative:
                return j, read
        return None, read



def typical_threshold(p: np.ndarray, posterior_threshold: float, posterior_alpha: float) -> float:
    """Medusa's typical-acceptance threshold min(epsilon, delta exp(-H(p))), H = -sum p log(p + 1e-5)
    in nats: the chain rule's (``exactcheck.rules.typical_threshold``) on one row."""
    values = {"posterior_threshold": posterior_threshold, "posterior_alpha": posterior_alpha}
    return float(chain_typical_threshold(np.asarray(p, dtype=np.float64)[None], values)[0])


@dataclass(frozen=True)
class Typical(TreeRule):
    """Typical acceptance on a top-k tree, as Medusa verifies (``evaluate_posterior``): a node is
    accepted when its token's target probability at its parent exceeds min(epsilon, delta
    exp(-H)); the path kept is the deepest whose every node is accepted (ties: the larger sum of
    log p along it); then one token at the node reached: its target argmax (``argmax_bonus``:
    Medusa, whose next root token is argmax), or, as vLLM V0's chain rule, argmax only where a
    child was rejected and a draw from p at a leaf. Deterministic but for that draw; lossy."""

    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    argmax_bonus: bool = False

    def step_law(self, view: TreeView) -> dict[tuple[int, ...], float]:
        best = ((), view.root, 0.0)  # (path, state, sum of log p)
        stack = [((), view.root, 0.0)]
        while stack:
            path, s, loglik = stack.pop()
            p = view.p(s)
            width = view.width(path)
            if not width:
                continue
            threshold = typical_threshold(p, self.posterior_threshold, self.posterior_alpha)
            for x in top_k_order(view.q(s), width):
                if p[x] > threshold:
                    child = (path + (int(x),), view.after(s, int(x)), loglik + float(np.log(p[x])))
                    if (len(child[0]), child[2]) > (len(best[0]), best[2]):
                        best = child
                    stack.append(child)
        path, s, _ = best
        p = view.p(s)
        leaf = view.width(path) == 0
        if self.argmax_bonus or not leaf:
            return {path + (int(np.argmax(p)),): 1.0}
        out: dict[tuple[int, ...], float] = {}
        for x in np.flatnonzero(p > 0):
            _add(out, path + (int(x),), float(p[x]))
        return out

    def oracle(self, p, q, tokens, parents, u):
        """No coin: every node's test p_parent(x) > threshold (reported as a comparison with
        ``against`` = p_parent(x)), then the deepest fully accepted node, ties by the larger sum of
        log p (the first such node in index order), as the reference walk ranks them."""
        m = len(parents)
        thresholds = [typical_threshold(row.astype(np.float64), self.posterior_threshold, self.posterior_alpha)
                      for row in p]
        ok, depth, loglik, read = [True] * m, [0] * m, [0.0] * m, []
        for i in range(1, m):
            par, x = int(parents[i]), int(tokens[i])
            prob = float(p[par][x])
            read.append(Comparison(par, i, thresholds[par], against=prob))
            ok[i] = ok[par] and prob > thresholds[par]
            depth[i] = depth[par] + 1
            loglik[i] = loglik[par] + (float(np.log(prob)) if prob > 0 else -np.inf)
        best = 0
        for i in range(1, m):
            if ok[i] and (depth[i], loglik[i]) > (depth[best], loglik[best]):
                best = i
        nodes = []
        while best > 0:
            nodes.append(best)
            best = int(parents[best])
        nodes.reverse()
        return TreeDecision(tuple(nodes), tuple(int(tokens[n]) for n in nodes), tuple(read))


@dataclass(frozen=True)
class Greedy(TreeRule):
    """Greedy tree verification (SGLang's ``verify_tree_greedy``, Medusa at temperature 0): at a
    node, the child whose token is the target's argmax (lowest id on a tie) is accepted; if no
    child has it, the argmax is the correction; at a leaf, the argmax is the bonus. No coin."""

    def node_law(self, p, q, width):
        accept, correct = np.zeros_like(p), np.zeros_like(p)
        best = int(np.argmax(p))
        (accept if best in top_k_order(q, width) else correct)[best] = 1.0
        return accept, correct

    def leaf_law(self, p):
        out = np.zeros_like(p)
        out[int(np.argmax(p))] = 1.0
        return out

    def oracle(self, p, q, tokens, parents, u):
        """No coin: child x is accepted iff p(x) exceeds every other token's p at its parent
        (``against`` = p(x), ``threshold`` = the largest other p; equal is a tie, not judged)."""
        children = children_of(parents)
        node, nodes, read = 0, [], []
        while children.get(node):
            row = np.asarray(p[node], dtype=np.float64)
            chosen = None
            for kid in children[node]:
                x = int(tokens[kid])
                read.append(Comparison(node, kid, float(np.delete(row, x).max()), against=float(row[x])))
                if row[x] > np.delete(row, x).max():
                    chosen = kid
                    break
            if chosen is None:
                break
            node = chosen
            nodes.append(node)
        return TreeDecision(tuple(nodes), tuple(int(tokens[n]) for n in nodes), tuple(read))


TREE_RULES: dict[str, TreeRule] = {rule.name: rule for rule in (
    MultiRound("multi_round", "multi-round speculative sampling (SpecInfer)",
               "Miao et al. 2024 (SpecInfer, arXiv 2305.09781) algorithm 2", "iid",
               formula="siblings i.i.d. from q; accept x with min(1, r(x)/q(x)); on a rejection "
                       "r <- norm(max(r - q, 0)); after the last sibling draw from r"),
    WithoutReplacement("without_replacement", "recursive rejection sampling without replacement",
                       "Jeon et al. 2024 (recursive speculative decoding, arXiv 2402.14160); EAGLE-1 as shipped "
                       "(eagle-llm 1.2.1 eagle/model/utils.py evaluate_posterior, siblings by cnets.Model.sample: "
                       "torch.multinomial without replacement)",
                       "without_replacement",
                       formula="sibling j drawn from q_j (q without siblings 1..j-1); accept with "
                               "min(1, r(x)/q_j(x)); on a rejection r <- norm(max(r - q_j, 0))"),
    Deterministic("deterministic", "deterministic (top-k) siblings, tried tokens zeroed",
                  "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/speculativeDecoding/dynamicTreeKernels.cu "
                  "after PR #15098", "top_k",
                  formula="siblings the top-k of q; accept x with r(x); on a rejection zero x in r and "
                          "renormalise; after the last sibling draw from r"),
    TargetOnly("target_only", "target-only tree verification (SGLang's kernel at thresholds 1)",
               "SGLang 0.5.23 sgl_kernel/speculative/sampling.cuh (TreeSpeculativeSamplingTargetOnly)", "top_k",
               takes_draft_probs=False,
               formula="one coin u per node; the first sibling whose cumulative target mass (distinct "
                       "tokens) exceeds u is accepted; if none, draw from p with the siblings zeroed"),
    Typical("typical", "typical acceptance on a tree, the bonus drawn from p (vLLM V0's chain rule on a tree)",
            "Cai et al. 2024 (Medusa, arXiv 2401.10774) section 2.3.1; vLLM 0.6.6 "
            "typical_acceptance_sampler.py", "top_k", exact=False, takes_draft_probs=False,
            formula="accept node x iff p_parent(x) > min(0.09, 0.3 exp(-H(p_parent))); keep the deepest fully "
                    "accepted path (ties: larger sum log p); argmax p where a child was rejected, a draw from "
                    "p at a leaf"),
    Typical("typical_medusa", "typical acceptance as Medusa ships it (argmax bonus)",
            "FasterDecoding/Medusa medusa/model/utils.py evaluate_posterior and generate_candidates "
            "(medusa-llm 0.1 on PyPI)", "top_k", exact=False, takes_draft_probs=False, argmax_bonus=True,
            formula="accept node x iff p_parent(x) > min(0.09, 0.3 exp(-H(p_parent))); keep the deepest fully "
                    "accepted path (ties: larger sum log p); then argmax p at the node reached"),
    Greedy("greedy", "greedy tree verification (exact for a greedy target, lossy for a sampled one)",
           "SGLang 0.5.23 spec_tree.py verify_tree_greedy; FasterDecoding/Medusa evaluate_posterior at "
           "temperature 0", "top_k", exact=False, takes_draft_probs=False,
           formula="accept the child whose token is argmax p (lowest id on a tie); if none, the correction is "
                   "argmax p; at a leaf the bonus is argmax p"),
)}

# rule -> the sibling mode it is exact for
RULE_SIBLINGS = {name: rule.sibling_mode for name, rule in TREE_RULES.items()}


def tree_rule(name: str) -> TreeRule:
    """The registered rule ``name``; ValueError naming the known ones."""
    if isinstance(name, TreeRule):
        return name
    if name not in TREE_RULES:
        raise ValueError(f"unknown tree rule {name!r}; known: {', '.join(TREE_RULES)}")
    return TREE_RULES[name]

