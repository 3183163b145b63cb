"""Forced-value properties of tree verifiers: boundary coins, the rule's decisions, row independence.

A tree verifier's law cannot show a 2^-24 event: a walk that accepts a sibling the target forbids
only when its coin is exactly 0 (a non-strict ``coin <= prob_acc`` on float32 coins, as read in
TensorRT-LLM's tree walk) passes every law at every level. Here every controlled draw of one call
(``exactcheck.forcing.randomness.controlled_randomness``: ``torch.rand``, ``uniform_``,
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

- ``tree_rule_decisions`` (a conformance check, planned where a tree rule is judged: the subject's
  ``tree_rule`` or ``--rule``): on the same trees, every threshold the rule's walk compares a coin
  with (``TreeRule.oracle``: r(x)/q_j(x) per sibling tried for multi-round and without
  replacement, r(x) for deterministic siblings, the cumulative target mass for target-only), found
  from the root's siblings down every path the walk can take (``decision_probes``), is probed with
  every draw forced to 2^-14 (relative) below and above it and to 1 minus those (the chain's
  ``ratio_minus``/``ratio_plus`` and their mirrors: a ratio computed in float16 or bfloat16 is
  off by more); the path the subject accepts (its output less the last token) must be the one the
  rule accepts with u = the delivered value, or with u = 1 - it (one convention for the whole
  call; strict or not is a tie). A convention under which a comparison the walk reads is a tie (u
  within the margin of a threshold, computed in float64 and in the rows' precision, or the two
  walks disagree) is not judged. A finding is shrunk by removing the last child of a node while
  the call stays wrong, and its reachability is the fraction of uniforms between the exact
  threshold and the subject's (``wrong_interval``, under the subject's convention);
- ``tree_row_independence``: with every draw forced (0, 1/2, 1 - ulp), each row's output alone is
  its output in the batch (the trees of one world stacked; each edge tree with a twin whose target
  rows are mixed with the draft's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from exactcheck.errors import ContractViolation, SubjectError
from exactcheck.options import Category, CheckKind
from exactcheck.reachability import Reachability, forced_draws, structural, wrong_uniforms
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.forcing.boundaries import CONVENTION_GRID, RATIO_STEP, TIE_MARGIN, UNIFORM_FLOOR, wrong_interval
from exactcheck.forcing.randomness import controlled_randomness
from exactcheck.contracts.tree_verifier import call_tree_verifier, sibling_sampling
from exactcheck.tree.rules import TreeDecision, TreeRule, tree_rule
from toy_models.tree_worlds import tree_worlds

__all__ = ["TreeCase", "edge_trees", "generated_trees", "forbidden_emission", "tree_boundary_verdict",
           "TREE_PROPERTY", "FORCED_VALUES", "DECISIONS_PROPERTY", "ROW_PROPERTY", "TREE_PROPERTIES",
           "RULE_TREE_PROPERTIES", "DecisionProbe", "decision_probes", "wrong_path", "tree_decisions_verdict",
           "tree_row_verdict", "row_batches", "PROBE_VALUES"]

TREE_PROPERTY = "tree_no_forbidden_token"
DECISIONS_PROPERTY = "tree_rule_decisions"
ROW_PROPERTY = "tree_row_independence"
FORCED_VALUES = ("zero", "one_minus_ulp")
# the values probed at each threshold t: t (1 - 2^-14), t (1 + 2^-14), and 1 minus each (a subject
# comparing 1 - rand sees u = t (1 -/+ 2^-14)); "half" (one call a tree) judges a rule without coins
PROBE_VALUES = ("ratio_minus", "ratio_plus", "mirrored_ratio_minus", "mirrored_ratio_plus")
PROBES_PER_TREE = 12  # thresholds probed on one tree at most
ROW_VALUES = ("zero", 0.5, "one_minus_ulp")
SHRINK_CALLS = 160  # subject calls spent shrinking one tree at most
GENERATED_PER_WORLD = 4


@dataclass(frozen=True)
class TreeCase:
    """Trees of one shape, one a row (one row but in ``tree_row_independence``'s batches): the
    contract's four tensors ([B, N+1, V], [B, N+1, V], [B, N+1], [B, N+1]) and what they exercise."""

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


def _call(subject, case: TreeCase, device, seed: int, value, only=None):
    """One forced call: (the output on the CPU or None, its DrawLog, the exception if the subject
    crashed or broke the contract)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    args = [t.to(device) for t in (case.target_probs, case.draft_probs, case.tokens, case.parents)]
    with controlled_randomness(value, only=only, generators=(generator,)) as log:
        try:
            out = call_tree_verifier(subject, *args, generator)
        except SubjectError as exc:
            return None, log, exc
    return out.cpu(), log, None


def _run(subject, case: TreeCase, device, seed: int, value, only=None):
    """One forced call: (its DrawLog, the finding or None, the exception if the subject crashed or
    broke the contract: a finding too)."""
    out, log, error = _call(subject, case, device, seed, value, only)
    if error is not None:
        return log, f"under forced draws: {error}", error
    return log, forbidden_emission(case, out[0]), None


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


def tree_boundary_verdict(subject, device, seed: int, reproduce: str, rule: str | None = None) -> Verdict:
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


# ---- tree_rule_decisions: the judged rule's decisions at forced coins --------------------------

@dataclass(frozen=True)
class DecisionProbe:
    """One threshold in (0, 1) the rule's walk compares a coin with on a tree (when child ``child``
    of node ``node`` is tried) and the forced values placed around it (name, uniform)."""

    node: int
    child: int
    threshold: float
    values: tuple[tuple[str, float], ...]


def _rows(case: TreeCase, dtype=np.float64):
    """Row 0 of a case as a rule's oracle reads it: (p, q, tokens, parents), rows in ``dtype``."""
    return (case.target_probs[0].double().numpy().astype(dtype), case.draft_probs[0].double().numpy().astype(dtype),
            case.tokens[0].tolist(), case.parents[0].tolist())


def _coin_thresholds(decision: TreeDecision) -> dict[tuple[int, int], float]:
    return {(c.node, c.child): c.threshold for c in decision.comparisons if c.against is None}


def decision_probes(rule: TreeRule, case: TreeCase, limit: int = PROBES_PER_TREE) -> list[DecisionProbe]:
    """The thresholds in (0, 1) the rule's walk compares a coin with on ``case``, from the root's
    siblings (the walk at u just below 1 tries them until one is sure) down every path: each one
    found is probed 2^-14 below it (the walk accepts that child and reads its children's thresholds
    next) and above it (the walk tries the next sibling). A threshold is kept where the walk reads
    it at both probes (an earlier sibling accepted instead would leave it untested)."""
    rows = _rows(case)
    frontier, seen, out = [1.0 - 2.0 ** -53, 0.0], set(), []
    while frontier and len(out) < limit:
        u = frontier.pop(0)
        for key, t in _coin_thresholds(rule.oracle(*rows, u)).items():
            if key in seen or not 0.0 < t < 1.0:
                continue
            seen.add(key)
            low, high = t * (1 - RATIO_STEP), min(t * (1 + RATIO_STEP), 1.0 - 2.0 ** -53)
            if not all(key in _coin_thresholds(rule.oracle(*rows, v)) for v in (low, high)):
                continue
            out.append(DecisionProbe(key[0], key[1], t, tuple(zip(PROBE_VALUES, (low, high, 1.0 - low, 1.0 - high)))))
            frontier += [low, high]
            if len(out) >= limit:
                break
    return out


def _margin(threshold: float, eps: float) -> float:
    """Relative margin around a threshold within which a decision is a numerical tie: at least
    ``TIE_MARGIN``, wider for thresholds far from 1 (a ratio of small probabilities)."""
    spread = abs(math.log(threshold)) if 0.0 < threshold < math.inf else 0.0
    return max(TIE_MARGIN, 8 * eps * (4 + 2 * spread))


def _ambiguous(exact: TreeDecision, rough: TreeDecision, u_low: float, u_high: float, eps: float) -> bool:
    """Whether a comparison the walk read is a tie for some u in [u_low, u_high]: its thresholds
    computed in float64 (``exact``) and in the rows' precision (``rough``) span a band, widened by
    ``_margin``; two walks that part are a tie too. A threshold >= 1 passes every u < 1."""
    if exact.tokens != rough.tokens or len(exact.comparisons) != len(rough.comparisons):
        return True
    for a, b in zip(exact.comparisons, rough.comparisons):
        low, high = sorted((a.threshold, b.threshold))
        m = _margin(high, eps)
        if a.against is not None:  # a rule without coins: p(x) against its threshold
            if any(low * (1 - m) <= v <= high * (1 + m) for v in (a.against, b.against)):
                return True
            continue
        if low >= 1.0:
            if u_high >= 1.0:
                return True
            continue
        if u_high >= low * (1 - m) and u_low <= high * (1 + m):
            return True
    return False


def wrong_path(rule: TreeRule, case: TreeCase, out_row: torch.Tensor, values, conventions=(False, True)):
    """What the rule accepts on ``case`` where the subject's path (``out_row`` [D+1] less its last
    token) is not it: {(delivered value d, mirrored): the rule's ``TreeDecision`` with u = d, or
    u = 1 - d where mirrored}; None when one delivered value and one of ``conventions`` explains the
    path, or leaves it not judged (a comparison the walk reads is a tie there)."""
    emitted = [int(x) for x in out_row.tolist() if x >= 0]
    path = tuple(emitted[:-1])
    exact_rows = _rows(case)
    low_precision = case.target_probs.dtype != torch.float64
    rough_rows = _rows(case, np.float16 if case.target_probs.dtype == torch.float16 else np.float32) \
        if low_precision else None
    eps = torch.finfo(case.target_probs.dtype).eps / 2 if case.target_probs.dtype.is_floating_point else 2.0 ** -53
    expected = {}
    for d in values:
        raised = max(d, UNIFORM_FLOOR)  # an exact subject may raise a tiny coin to a floor first
        for mirrored in conventions:
            u, (u_low, u_high) = (1.0 - d, (1.0 - raised, 1.0 - d)) if mirrored else (d, (d, raised))
            exact = rule.oracle(*exact_rows, u)
            rough = rule.oracle(*rough_rows, u) if rough_rows is not None else exact
            if exact.tokens == path or _ambiguous(exact, rough, u_low, u_high, eps):
                return None
            expected[(d, mirrored)] = exact
    return expected


def _decisions_call(subject, rule: TreeRule, case: TreeCase, device, seed: int, value: float, conventions=(False, True)):
    """One forced call judged: (what the rule expects where the subject's path is wrong, else None;
    the output, None if it crashed or broke the contract; its DrawLog). Not judged (None) where a
    draw escaped the forcing or the call failed: those are the other properties' findings."""
    out, log, error = _call(subject, case, device, seed, value)
    if error is not None or not log.complete:
        return None, None, log
    return wrong_path(rule, case, out[0], sorted(log.values()) or [value], conventions), out, log


def _without_node(case: TreeCase, i: int) -> TreeCase:
    """The tree without node ``i`` (a leaf), later nodes renumbered."""
    keep = [j for j in range(case.tokens.shape[1]) if j != i]
    parents = case.parents[:, keep]
    parents = torch.where(parents > i, parents - 1, parents)
    return TreeCase(case.name, case.target_probs[:, keep], case.draft_probs[:, keep], case.tokens[:, keep], parents)


def _shrink_tree(subject, rule: TreeRule, case: TreeCase, device, seed: int, value: float) -> TreeCase:
    """The tree with leaves removed while the call at ``value`` stays wrong: only a node's last
    child goes, so top-k siblings stay the top ones of their draft row."""
    calls, changed = 0, True
    while changed and calls < SHRINK_CALLS:
        changed = False
        parents = case.parents[0].tolist()
        last = sorted({max(i for i in range(1, len(parents)) if parents[i] == node) for node in set(parents[1:])},
                      reverse=True)
        for i in (j for j in last if j not in parents):
            if calls >= SHRINK_CALLS:
                break
            smaller = _without_node(case, i)
            calls += 1
            if _decisions_call(subject, rule, smaller, device, seed, value)[0] is not None:
                case, changed = smaller, True
                break
    return case


def _decisions_reach(subject, rule: TreeRule, case: TreeCase, device, seed: int, value: float, log) -> Reachability:
    """The uniforms around ``value`` at which the call is wrong (every draw forced to each), grown
    by bisection (``wrong_interval``) under the subject's convention: the one, u or 1 - u, under
    which fewer of ``CONVENTION_GRID`` spread uniforms give a wrong call (the smaller set on a tie).
    Between the exact threshold and the subject's effective one: that fraction of coins is wrong."""
    found = []
    for mirrored in (False, True):
        def fails(c, mirrored=mirrored):
            return _decisions_call(subject, rule, case, device, seed, c, (mirrored,))[0] is not None
        on_grid = sum(fails((i + 0.5) / CONVENTION_GRID) for i in range(CONVENTION_GRID))
        low, high = wrong_interval(fails, value)
        found.append((on_grid, high - low, low, high))
    _, measure, low, high = min(found)
    dtype = ", ".join(sorted({str(d.dtype).replace("torch.", "") for d in log.draws if d.forced}))
    if measure > 0:
        return wrong_uniforms(low, high, value, dtype)
    draw = log.draws[0]
    return forced_draws([draw.element_probability], [dtype], [draw.entry], draw.value)


def _describe_decision(rule: TreeRule, case: TreeCase, label: str, value: float, probe, out_row, expected) -> str:
    emitted = [int(x) for x in out_row.tolist() if x >= 0]
    at = ""
    if probe is not None:
        side = "below" if label.endswith("minus") else "above"
        mirror = "1 minus a value " if label.startswith("mirrored_") else ""
        at = (f" ({mirror}2^-14 {side} the threshold {probe.threshold:.9g} of node {probe.node}'s child "
              f"{probe.child} in the tree as drawn)")
    tree = f"tokens {case.tokens[0].tolist()}, parents {case.parents[0].tolist()}"
    conventions = "; ".join(f"{list(decision.tokens)} with u = {'1 - ' if mirrored else ''}{d!r}"
                            for (d, mirrored), decision in expected.items())
    return (f"{case.name} ({tree}), every draw forced to {label} = {value!r}{at}: the subject accepted the path "
            f"{emitted[:-1]} (emitted {emitted}); rule {rule.name} accepts {conventions} (strict or not alike)")


def tree_decisions_verdict(subject, device, seed: int, reproduce: str, rule: str | None = None) -> Verdict:
    """``properties/tree_rule_decisions``: the first tree and forced value at which the path the
    subject accepts is not the judged rule's under either convention (shrunk, with the fraction of
    uniforms that give it); exact when none is."""
    name = rule or getattr(subject, "tree_rule", None)
    mode = sibling_sampling(subject)
    common = dict(check=f"properties/{DECISIONS_PROPERTY}", law=DECISIONS_PROPERTY, world="properties", seed=seed,
                  reproduce=reproduce, kind=CheckKind.PROPERTY, category=Category.CONFORMANCE)
    if name is None:
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=0, condition="no tree rule",
                       summary="not judged: no tree rule is declared (tree_rule) or named (--rule)", **common)
    spec = tree_rule(name)
    cases = edge_trees(mode) + generated_trees(mode, seed)
    common["condition"] = (f"rule {spec.name}; {len(cases)} trees ({len(edge_trees(mode))} edge cases, {mode} "
                           f"siblings) x every draw forced to 1/2 and, at each threshold the walk reads (up to "
                           f"{PROBES_PER_TREE} a tree), to {', '.join(PROBE_VALUES)}")
    calls = judged = thresholds = 0
    held = None  # an unreachable finding: the search goes on for a reachable one
    for case in cases:
        probes = decision_probes(spec, case)
        thresholds += len(probes)
        forced = [("half", 0.5, None)] + [(label, value, probe) for probe in probes for label, value in probe.values]
        for label, value, probe in forced:
            expected, out, log = _decisions_call(subject, spec, case, device, seed, value)
            calls += 1
            judged += out is not None
            if expected is None:
                continue
            small = _shrink_tree(subject, spec, case, device, seed, value)
            expected, out, log = _decisions_call(subject, spec, small, device, seed, value)
            reach = _decisions_reach(subject, spec, small, device, seed, value, log)
            verdict = Verdict(outcome=Outcome.DEFECT if reach.reachable else Outcome.UNREACHABLE, samples=calls,
                              summary=_describe_decision(spec, small, label, value, probe, out[0], expected),
                              evidence=FindingEvidence(pvalue=0.0, reachability=reach), **common)
            if reach.reachable:
                return verdict
            held = held or verdict
            break
    if held is not None:
        return held
    if not judged:
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=calls, summary=(
            "not judged: on every forced call the subject crashed, broke the contract or drew outside the "
            "forcing (see properties/tree_no_forbidden_token)"), **common)
    return Verdict(outcome=Outcome.EXACT, samples=calls, evidence=FindingEvidence(pvalue=1.0),
                   summary=(f"the path of rule {spec.name} (u or 1 - u) in every call judged: {judged} of {calls} "
                            f"forced calls, {thresholds} thresholds probed"), **common)


# ---- tree_row_independence ----------------------------------------------------------------------

def _stack(name: str, cases: list[TreeCase]) -> TreeCase:
    return TreeCase(name, *(torch.cat([getattr(c, f) for c in cases])
                            for f in ("target_probs", "draft_probs", "tokens", "parents")))


def _twin(case: TreeCase) -> TreeCase:
    """The same tree with each target row mixed half and half with its draft row: other decisions,
    siblings as valid (the draft rows are unchanged)."""
    mixed = (case.target_probs.double() + case.draft_probs.double()) / 2
    mixed = (mixed / mixed.sum(-1, keepdim=True)).to(case.target_probs.dtype)
    return TreeCase(case.name, mixed, case.draft_probs, case.tokens, case.parents)


def row_batches(mode: str, seed: int) -> list[TreeCase]:
    """Batches of trees of one shape: each edge tree with its twin, and the trees drawn from each world."""
    out = [_stack(f"{c.name} and its twin (target mixed with draft)", [c, _twin(c)]) for c in edge_trees(mode)]
    groups: dict[tuple, list[TreeCase]] = {}
    for c in generated_trees(mode, seed):
        groups.setdefault((c.name.split(",")[0], tuple(c.target_probs.shape)), []).append(c)
    return out + [_stack(f"{len(cs)} trees of {world}", cs) for (world, _), cs in groups.items() if len(cs) > 1]


def _emitted(row: torch.Tensor) -> list[int]:
    return [int(x) for x in row.tolist() if x >= 0]


def tree_row_verdict(subject, device, seed: int, reproduce: str, rule: str | None = None) -> Verdict:
    """``properties/tree_row_independence``: under each forced value, every row of a batch alone
    gives what it gave in the batch (a call that crashes, breaks the contract or draws outside the
    forcing is not judged; a difference that does not recur when both calls are made again is not
    reported)."""
    batches = row_batches(sibling_sampling(subject), seed)
    common = dict(check=f"properties/{ROW_PROPERTY}", law=ROW_PROPERTY, world="properties", seed=seed,
                  reproduce=reproduce, kind=CheckKind.PROPERTY,
                  condition=(f"{len(batches)} batches of trees x every draw forced to "
                             f"{', '.join(str(v) for v in ROW_VALUES)}; each row alone against its batch"))
    calls = judged = 0
    for batch in batches:
        for value in ROW_VALUES:
            out, log, error = _call(subject, batch, device, seed, value)
            calls += 1
            if error is not None or not log.complete:
                continue
            for row in range(out.shape[0]):
                single = TreeCase(batch.name, *(getattr(batch, f)[row:row + 1]
                                                for f in ("target_probs", "draft_probs", "tokens", "parents")))
                alone, alone_log, error = _call(subject, single, device, seed, value)
                calls += 1
                if error is not None or not alone_log.complete:
                    continue
                judged += 1
                if _emitted(alone[0]) == _emitted(out[row]):
                    continue
                again, again_alone = _call(subject, batch, device, seed, value)[0], \
                    _call(subject, single, device, seed, value)[0]
                if again is None or again_alone is None or not torch.equal(again, out) \
                        or not torch.equal(again_alone, alone):
                    continue  # not deterministic under forcing: a source exactcheck does not see
                return Verdict(outcome=Outcome.DEFECT, samples=calls, summary=(
                    f"{batch.name}, every draw forced to {value}: row {row} gave {_emitted(out[row])} in a batch of "
                    f"{out.shape[0]} but {_emitted(alone[0])} alone"), evidence=FindingEvidence(
                        pvalue=0.0, reachability=structural("a row's output depends on the other rows of its batch at "
                                                            "identical random numbers")), **common)
            if not log.draws:
                break  # no draw took the forced value: the other values make the same calls
    if not judged:
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=calls, summary=(
            "not judged: on every forced call the subject crashed, broke the contract or drew outside the forcing"),
            **common)
    return Verdict(outcome=Outcome.EXACT, samples=calls, evidence=FindingEvidence(pvalue=1.0),
                   summary=f"every row alone as in its batch ({judged} rows judged in {calls} forced calls)", **common)


# the tree audit's properties, in the order it reports them: name -> verdict(subject, device, seed,
# reproduce, rule); those in ``RULE_TREE_PROPERTIES`` are planned only where a tree rule is judged
TREE_PROPERTIES = {TREE_PROPERTY: tree_boundary_verdict, ROW_PROPERTY: tree_row_verdict,
                   DECISIONS_PROPERTY: tree_decisions_verdict}
RULE_TREE_PROPERTIES = (DECISIONS_PROPERTY,)
