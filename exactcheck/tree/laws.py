"""Exact laws of one tree-verify step, enumerated in float64 from the world (never from a subject).

``step_law(world, state, rule)``: the law of the emitted tuple (accepted path tokens, then the
correction or bonus token) of one verify call from ``state``, marginalised over the tree's draws
as the world draws siblings, under a registered tree rule (``TREE_RULES``). The recursion follows
the rule's definition, not any implementation: at a node with state s and residual r, sibling j is
drawn (i.i.d. from q(s), from q(s) without the earlier siblings, or the j-th most likely token of
q(s)), accepted with the rule's probability (then the walk continues in the child's subtree), or
rejected (r updated); after the last sibling the correction is drawn from r.

Every exact rule emits a first token of law p(state) (``first_token_law``), and through the loop
the target's law of whole sequences: that is exactness, rule-free. The step law itself differs
between rules (how many tokens are accepted): that is conformance to a declared rule.
"""
from __future__ import annotations

import numpy as np

from toy_models.tree_worlds import TreeWorld

__all__ = ["TREE_RULES", "step_law", "first_token_law", "RULE_SIBLINGS"]

# rule -> the sibling mode it is exact for
RULE_SIBLINGS = {"multi_round": "iid", "without_replacement": "without_replacement", "deterministic": "top_k",
                 "target_only": "top_k"}
TREE_RULES = tuple(RULE_SIBLINGS)


def _norm(r: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    total = r.sum()
    return r / total if total > 0 else fallback


def step_law(world: TreeWorld, state: int, rule: str) -> dict[tuple[int, ...], float]:
    """The exact law of one step's emitted tuple from ``state`` under ``rule``."""
    if rule not in RULE_SIBLINGS:
        raise ValueError(f"unknown tree rule {rule!r}; known: {TREE_RULES}")
    if RULE_SIBLINGS[rule] != world.siblings:
        raise ValueError(f"rule {rule} is defined for {RULE_SIBLINGS[rule]} siblings; {world.name} draws "
                         f"{world.siblings}")
    p_rows, q_rows = world.target_law(), world.world.draft.law()
    depth = world.depth
    out: dict[tuple[int, ...], float] = {}

    def emit(prefix: tuple[int, ...], rows: np.ndarray, weight: float) -> None:
        for x in np.flatnonzero(rows > 0):
            out[prefix + (int(x),)] = out.get(prefix + (int(x),), 0.0) + weight * float(rows[x])

    def node(s: int, level: int, prefix: tuple[int, ...], weight: float) -> None:
        p, q = p_rows[s], q_rows[s]
        width = world.branching[level] if level < depth else 0
        if width == 0:
            emit(prefix, p, weight)
            return
        if rule == "target_only":
            order = np.argsort(-q, kind="stable")[:width]
            for x in order:
                if p[x] > 0:
                    node(int(world.world.next_state(s, int(x))), level + 1, prefix + (int(x),), weight * float(p[x]))
            rest = p.copy()
            rest[order] = 0.0
            if rest.sum() > 0:
                emit(prefix, rest / rest.sum(), weight * float(rest.sum()))
            return
        siblings(s, level, prefix, weight, p.copy(), q.copy(), 0, width)

    def siblings(s, level, prefix, weight, r, q, j, width) -> None:
        """Sibling j of ``width`` at the node with state s, residual r, draft law q (for
        without_replacement: the law sibling j is drawn from, earlier ones removed)."""
        if weight <= 0:
            return
        if j == width:
            emit(prefix, r, weight)
            return
        if rule == "deterministic":
            x = int(np.argsort(-q_rows[s], kind="stable")[j])
            accept = float(r[x])
            if accept > 0:
                node(int(world.world.next_state(s, x)), level + 1, prefix + (x,), weight * accept)
            if accept < 1:
                rest = r.copy()
                rest[x] = 0.0
                siblings(s, level, prefix, weight * (1 - accept), _norm(rest, r), q, j + 1, width)
            return
        for x in np.flatnonzero(q > 0):
            x = int(x)
            drawn = weight * float(q[x])
            accept = min(1.0, float(r[x]) / float(q[x]))
            if accept > 0:
                node(int(world.world.next_state(s, x)), level + 1, prefix + (x,), drawn * accept)
            if accept < 1:
                rejected = _norm(np.clip(r - q, 0, None), r)
                nxt = q
                if rule == "without_replacement":
                    nxt = q.copy()
                    nxt[x] = 0.0
                    nxt = _norm(nxt, nxt)
                siblings(s, level, prefix, drawn * (1 - accept), rejected, nxt, j + 1, width)

    node(state, 0, (), 1.0)
    return out


def first_token_law(world: TreeWorld, state: int) -> np.ndarray:
    """The law of any exact rule's first emitted token: the target's row at ``state``."""
    return world.target_law()[state]
