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
- ``title``, ``source`` (the paper or engine file it follows), ``exact``, ``formula``.

A rule whose decision at a node depends on the subtrees below it (typical acceptance keeps the
deepest fully accepted path of the whole tree, as Medusa does) overrides ``step_law(view)``
instead: the law of one step's emitted tuple, read from a ``TreeView`` (the step's root state,
the rows at every state, the width of every node, the state after a token). The default composes
``node_law``/``leaf_law`` over the tree.

A new rule is one entry here (its ``TreeRule`` subclass and its row in ``TREE_RULES``) and its
proofs: a reference walk in ``exactcheck.tree.reference`` (Monte Carlo against the law in
``property_tests/test_tree.py``), docs. Numpy only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

__all__ = ["TreeRule", "TreeView", "TREE_RULES", "RULE_SIBLINGS", "tree_rule", "top_k_order",
           "typical_threshold"]


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
class TreeRule:
    """One tree verification rule. Subclasses give ``node_law`` (or ``step_law``)."""

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



class TargetOnly(TreeRule):
    """One coin u per node: the first sibling whose cumulative target mass (each distinct token
    once) exceeds u is accepted; if none, the correction from p with the siblings' tokens zeroed."""

    def node_law(self, p, q, width):
        order = top_k_order(q, width)
        accept, rest = np.zeros_like(p), p.copy()
        accept[order] = p[order]
        rest[order] = 0.0
        return accept, rest



def typical_threshold(p: np.ndarray, posterior_threshold: float, posterior_alpha: float) -> float:
    """Medusa's typical-acceptance threshold min(epsilon, delta exp(-H(p))), H = -sum p log(p + 1e-5)
    in nats (the chain rule's ``exactcheck.rules.typical_threshold``, one row)."""
    entropy = -float((p * np.log(p + 1e-5)).sum())
    return min(posterior_threshold, posterior_alpha * float(np.exp(-entropy)))


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


TREE_RULES: dict[str, TreeRule] = {rule.name: rule for rule in (
    MultiRound("multi_round", "multi-round speculative sampling (SpecInfer, EAGLE)",
               "Miao et al. 2024 (SpecInfer, arXiv 2305.09781) algorithm 2; EAGLE (Li et al. 2024) "
               "eagle/model/utils.py evaluate_posterior", "iid",
               formula="siblings i.i.d. from q; accept x with min(1, r(x)/q(x)); on a rejection "
                       "r <- norm(max(r - q, 0)); after the last sibling draw from r"),
    WithoutReplacement("without_replacement", "recursive rejection sampling without replacement",
                       "Jeon et al. 2024 (recursive speculative decoding, arXiv 2402.14160)",
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

