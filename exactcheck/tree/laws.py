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

from dataclasses import dataclass

import numpy as np

from exactcheck.tree.rules import RULE_SIBLINGS, TREE_RULES, TreeRule, tree_rule
from toy_models.tree_worlds import TreeWorld

__all__ = ["TREE_RULES", "step_law", "first_token_law", "RULE_SIBLINGS", "loop_sequence_law", "lossy_tv"]


@dataclass(frozen=True)
class _WorldView:
    """A world's tree at one step's root state, as rules read it (``exactcheck.tree.rules.TreeView``)."""

    world: TreeWorld
    root: int
    p_rows: np.ndarray
    q_rows: np.ndarray

    def p(self, state: int) -> np.ndarray:
        return self.p_rows[state]

    def q(self, state: int) -> np.ndarray:
        return self.q_rows[state]

    def width(self, path: tuple[int, ...]) -> int:
        return self.world.width(self.root, path)

    def after(self, state: int, token: int) -> int:
        return int(self.world.world.next_state(state, token))


def step_law(world: TreeWorld, state: int, rule: "str | TreeRule") -> dict[tuple[int, ...], float]:
    """The exact law of one step's emitted tuple from ``state`` under ``rule``."""
    rule = tree_rule(rule)
    if rule.sibling_mode != world.siblings:
        raise ValueError(f"rule {rule.name} is defined for {rule.sibling_mode} siblings; {world.name} draws "
                         f"{world.siblings}")
    return rule.step_law(_WorldView(world, int(state), world.target_law(), world.world.draft.law()))


def loop_sequence_law(world: TreeWorld, rule: "str | TreeRule") -> np.ndarray:
    """The exact law of the first ``world.length`` tokens through the speculative loop when every
    verify follows ``rule`` (indexed as ``ContextWorld.sequence_law``). For an exact rule it is the
    target's own law (``TreeWorld.sequence_law``; the tests check it on every world); for a lossy
    rule, what the user receives, and its TV from the target's is the price."""
    rule = tree_rule(rule)
    vocab, length = world.vocab_size, world.length
    steps: dict[int, dict] = {}
    law = np.zeros(vocab ** length)
    pending = [((), int(world.world.prompt_state), 1.0)]
    while pending:
        prefix, state, weight = pending.pop()
        if len(prefix) >= length:
            code = 0
            for x in prefix[:length]:
                code = code * vocab + x
            law[code] += weight
            continue
        if state not in steps:
            steps[state] = step_law(world, state, rule)
        for emitted, mass in steps[state].items():
            s = state
            for x in emitted:
                s = int(world.world.next_state(s, x))
            pending.append((prefix + emitted, s, weight * mass))
    return law


def lossy_tv(world: TreeWorld, rule: "str | TreeRule") -> float:
    """The exact TV between what ``rule`` makes the user receive on ``world`` and the target's law."""
    return 0.5 * float(np.abs(loop_sequence_law(world, rule) - world.sequence_law()).sum())


def first_token_law(world: TreeWorld, state: int) -> np.ndarray:
    """The law of any exact rule's first emitted token: the target's row at ``state``."""
    return world.target_law()[state]
