"""Exact laws of one tree-verify step, enumerated in float64 from the world (never from a subject).

``step_law(world, state, rule)``: the law of the emitted tuple (accepted path tokens, then the
correction or bonus token) of one verify call from ``state``, marginalised over the tree's draws
as the world draws siblings, under a registered tree rule (``exactcheck.tree.rules.TREE_RULES``).
The recursion knows no rule: at a node with state s and ``width`` children, the rule's
``node_law`` gives the law of the child accepted (the walk continues in its subtree) and of the
correction when every child is rejected; at a leaf its ``leaf_law`` gives the bonus.

Every exact rule emits a first token of law p(state) (``first_token_law``), and through the loop
the target's law of whole sequences: that is exactness, rule-free. The step law itself differs
between rules (how many tokens are accepted): that is conformance to a declared rule.
"""
from __future__ import annotations

import numpy as np

from exactcheck.tree.rules import RULE_SIBLINGS, TREE_RULES, TreeRule, tree_rule
from toy_models.tree_worlds import TreeWorld

__all__ = ["TREE_RULES", "step_law", "first_token_law", "RULE_SIBLINGS"]


def step_law(world: TreeWorld, state: int, rule: "str | TreeRule") -> dict[tuple[int, ...], float]:
    """The exact law of one step's emitted tuple from ``state`` under ``rule``."""
    rule = tree_rule(rule)
    if rule.sibling_mode != world.siblings:
        raise ValueError(f"rule {rule.name} is defined for {rule.sibling_mode} siblings; {world.name} draws "
                         f"{world.siblings}")
    p_rows, q_rows = world.target_law(), world.world.draft.law()
    out: dict[tuple[int, ...], float] = {}

    def emit(prefix: tuple[int, ...], rows: np.ndarray, weight: float) -> None:
        for x in np.flatnonzero(rows > 0):
            out[prefix + (int(x),)] = out.get(prefix + (int(x),), 0.0) + weight * float(rows[x])

    def node(s: int, prefix: tuple[int, ...], weight: float) -> None:
        p, q = p_rows[s], q_rows[s]
        width = world.width(prefix)
        if width == 0:
            emit(prefix, rule.leaf_law(p), weight)
            return
        accept, correct = rule.node_law(p, q, width)
        for x in np.flatnonzero(accept > 0):
            node(int(world.world.next_state(s, int(x))), prefix + (int(x),), weight * float(accept[x]))
        emit(prefix, correct, weight)

    node(state, (), 1.0)
    return out


def first_token_law(world: TreeWorld, state: int) -> np.ndarray:
    """The law of any exact rule's first emitted token: the target's row at ``state``."""
    return world.target_law()[state]
