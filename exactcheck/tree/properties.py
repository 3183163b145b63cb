"""Boundary coins for tree verifiers: every draw forced to 0 and to 1 - ulp.

A tree verifier's law cannot show a 2^-24 event: a walk that accepts a sibling the target forbids
only when its coin is exactly 0 (a non-strict ``coin <= prob_acc`` on float32 coins, as read in
TensorRT-LLM's tree walk) passes every law at every level. Here every controlled draw of one call
(``exactcheck.step.randomness.controlled_randomness``: ``torch.rand``, ``uniform_``,
``multinomial``, ...) is forced to a boundary value, on an edge corpus of trees and on trees drawn
from the tree worlds of the subject's sibling mode, and the output is judged:

- ``tree_no_forbidden_token``: every emitted token has target probability > 0 at the node it is
  emitted from (an accepted sibling at its parent, the correction or bonus at the node reached).
  Every exact tree rule, and every lossy one, keeps it; a crash under forcing is a finding too.

The edge corpus: a sibling of target probability 0 with the most draft mass, siblings whose
residual empties (p = q), duplicate siblings (i.i.d. siblings only), 34 siblings (past a 32-slot
mask), a zero-probability sibling one level down. Siblings are distinct and drawn as the subject
declares: the most likely first for ``top_k``, any order with q > 0 otherwise.

A finding is shrunk to the fewest forced draws: each draw element alone is forced (the others come
from the subject's generator, seeded), and the first that still breaks the call is the trigger,
with its per-draw probability (``exactcheck.reachability.forced_draws``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.errors import ContractViolation, SubjectError
from exactcheck.options import CheckKind
from exactcheck.reachability import Reachability, forced_draws, wrong_uniforms
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.step.properties import wrong_interval
from exactcheck.step.randomness import controlled_randomness
from exactcheck.tree.contract import call_tree_verifier, sibling_sampling
from toy_models.tree_worlds import tree_worlds

__all__ = ["TreeCase", "edge_trees", "generated_trees", "forbidden_emission", "tree_boundary_verdict",
           "TREE_PROPERTY", "FORCED_VALUES"]

TREE_PROPERTY = "tree_no_forbidden_token"
FORCED_VALUES = ("zero", "one_minus_ulp")
GENERATED_PER_WORLD = 4


@dataclass(frozen=True)
class TreeCase:
    """One tree of one row: the contract's four tensors ([1, N+1, V], [1, N+1, V], [1, N+1],
    [1, N+1]) and what it exercises."""

    name: str
    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    tokens: torch.Tensor
    parents: torch.Tensor


def _row(vocab: int, mass: dict[int, float]) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=torch.float64)
    for token, m in mass.items():
        row[token] = m
    return row / row.sum()


def _case(name: str, vocab: int, nodes: list[tuple[int, int, dict, dict]]) -> TreeCase:
    """``nodes``: (token, parent, target row mass, draft row mass) for nodes 0..N (node 0's token -1)."""
    p = torch.stack([_row(vocab, pm) for _, _, pm, _ in nodes])[None].float()
    q = torch.stack([_row(vocab, qm) for _, _, _, qm in nodes])[None].float()
    tokens = torch.tensor([[t for t, _, _, _ in nodes]], dtype=torch.int64)
    parents = torch.tensor([[par for _, par, _, _ in nodes]], dtype=torch.int64)
    return TreeCase(name, p, q, tokens, parents)


def _siblings_first(siblings: list[int], vocab: int) -> dict:
    """A draft row whose most likely tokens are ``siblings`` in order (ties broken by id never
    arise), the rest small: siblings valid in every mode."""
    mass = {t: 1.0 for t in range(vocab)}
    for rank, t in enumerate(siblings):
        mass[t] = 100.0 * (len(siblings) - rank) + 10.0
    return mass


def edge_trees(mode: str) -> list[TreeCase]:
    """The edge corpus for siblings drawn as ``mode`` ("iid", "without_replacement", "top_k")."""
    v = 6
    uniform = {t: 1.0 for t in range(v)}
    cases = [
        # sibling 0 is forbidden by the target (p = 0) and the draft's favourite
        _case("a forbidden sibling first", v, [
            (-1, -1, {1: 0.5, 2: 0.3, 3: 0.2}, _siblings_first([0, 1], v)),
            (0, 0, uniform, uniform), (1, 0, uniform, uniform)]),
        # p = q at the root: min(1, p/q) = 1, and the residual after a rejection is empty
        _case("p equals q (an empty residual)", v, [
            (-1, -1, _siblings_first([2, 4], v), _siblings_first([2, 4], v)),
            (2, 0, uniform, uniform), (4, 0, uniform, uniform)]),
        # a forbidden sibling one level down, under an accepted-for-sure first level
        _case("a forbidden sibling at depth 2", v, [
            (-1, -1, {3: 1.0}, _siblings_first([3], v)),
            (3, 0, {0: 0.6, 1: 0.4}, _siblings_first([5, 0], v)),
            (5, 1, uniform, uniform), (0, 1, uniform, uniform)]),
    ]
    wide = 40  # 34 siblings, past a 32-slot tried-token mask; every third forbidden
    siblings = list(range(34))
    target = {t: 1.0 for t in range(wide) if t % 3}
    nodes = [(-1, -1, target, _siblings_first(siblings, wide))]
    nodes += [(t, 0, {t: 1.0}, {t: 1.0}) for t in siblings]
    cases.append(_case("34 siblings, every third forbidden", wide, nodes))
    if mode == "iid":  # i.i.d. siblings repeat
        cases.append(_case("duplicate siblings, the first forbidden", v, [
            (-1, -1, {1: 0.7, 2: 0.3}, {0: 0.6, 1: 0.4}),
            (0, 0, uniform, uniform), (0, 0, uniform, uniform), (1, 0, uniform, uniform)]))
    return cases


def generated_trees(mode: str, seed: int) -> list[TreeCase]:
    """Trees drawn from the tree worlds of ``mode`` at random states (``GENERATED_PER_WORLD`` each)."""
    out = []
    driver = torch.Generator().manual_seed(seed)
    for world in tree_worlds():
        if world.siblings != mode:
            continue
        states = torch.randint(world.world.target.num_states, (GENERATED_PER_WORLD,), generator=driver)
        p, q, tokens, parents, _ = world.draw_tree(states, driver)
        out += [TreeCase(f"{world.name}, state {int(s)}", p[i:i + 1], q[i:i + 1], tokens[i:i + 1],
                         parents[i:i + 1]) for i, s in enumerate(states)]
    return out


def forbidden_emission(case: TreeCase, out: torch.Tensor) -> str | None:
    """What of the emitted row ``out`` [D+1] the target forbids (None: nothing): a token of
    probability 0 at the node it is emitted from. The path is followed by token; duplicate
    siblings share their parent's row, so any of them will do."""
    p, tokens, parents = case.target_probs[0], case.tokens[0].tolist(), case.parents[0].tolist()
    emitted = [int(x) for x in out.tolist() if x >= 0]
    node = 0
    for j, x in enumerate(emitted):
        if float(p[node, x]) <= 0.0:
            what = "the correction or bonus token" if j == len(emitted) - 1 else f"accepted sibling {x}"
            return (f"emitted {emitted}: {what} at position {j} has target probability 0 at node {node} "
                    f"(its row: {[round(float(v), 4) for v in p[node]]})")
        if j < len(emitted) - 1:
            node = next(i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == x)
    return None


def _run(subject, case: TreeCase, device, seed: int, value, only=None):
    """One forced call: (its DrawLog, the finding or None, the exception if the subject crashed or
    broke the contract: a finding too)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    args = [t.to(device) for t in (case.target_probs, case.draft_probs, case.tokens, case.parents)]
    with controlled_randomness(value, only=only, generators=(generator,)) as log:
        try:
            out = call_tree_verifier(subject, *args, generator)
        except SubjectError as exc:
            return log, f"under forced draws: {exc}", exc
    return log, forbidden_emission(case, out[0].cpu()), None


def _trigger(subject, case: TreeCase, device, seed: int, value: str, log) -> Reachability:
    """The fewest forced draws that break the call: one element alone if one does, with the set
    of values of that draw that break it (bisection from the forced value, as for chains:
    ``exactcheck.step.properties.wrong_interval``); else every draw of the call (a lower bound)."""
    elements = []
    for draw in log.draws:
        elements += [draw] * draw.numel
    for i, draw in enumerate(elements):
        if _run(subject, case, device, seed, value, only={i})[1] is None:
            continue
        low, high = wrong_interval(lambda c: _run(subject, case, device, seed, c, only={i})[1] is not None,
                                   draw.value)
        name = str(draw.dtype).replace("torch.", "")
        if high > low:
            return wrong_uniforms(low, high, draw.value, name, draw_function=draw.entry)
        return forced_draws([draw.element_probability], [name], [draw.entry], draw.value)
    return forced_draws([d.element_probability for d in elements], [str(d.dtype).replace("torch.", "") for d in elements],
                        [d.entry for d in elements], elements[0].value if elements else 0.0, minimal=False)


def tree_boundary_verdict(subject, device, seed: int, reproduce: str) -> Verdict:
    """``properties/tree_no_forbidden_token`` for ``subject``: the first case and forced value that
    emits a token the target forbids (or crashes), with its trigger; exact when none does."""
    mode = sibling_sampling(subject)
    cases = edge_trees(mode) + generated_trees(mode, seed)
    common = dict(check=f"properties/{TREE_PROPERTY}", law=TREE_PROPERTY, world="properties", seed=seed,
                  reproduce=reproduce, kind=CheckKind.PROPERTY,
                  condition=(f"{len(cases)} trees ({len(edge_trees(mode))} edge cases, {mode} siblings) x every draw "
                             f"forced to {' and '.join(FORCED_VALUES)}"))
    calls = 0
    for case in cases:
        for value in FORCED_VALUES:
            log, finding, error = _run(subject, case, device, seed, value)
            calls += 1
            if finding is None:
                continue
            reach = _trigger(subject, case, device, seed, value, log)
            outcome = (Outcome.CONTRACT_VIOLATION if isinstance(error, ContractViolation) else Outcome.CRASHED
                       if error is not None else Outcome.DEFECT if reach.reachable else Outcome.UNREACHABLE)
            return Verdict(outcome=outcome, samples=calls, summary=f"{case.name}, every draw forced to {value}: {finding}",
                           evidence=FindingEvidence(pvalue=0.0, reachability=reach), **common)
    return Verdict(outcome=Outcome.EXACT, samples=calls, evidence=FindingEvidence(pvalue=1.0),
                   summary=f"no forbidden token in {calls} forced calls", **common)
