"""Tree-cache invariants, checked on the forward calls the cached toy models recorded.

The models (``toy_models.tree_cache_lm.TreeCacheLM``) log every forward of one generation in one
shared, ordered list (``TreeForwardCall``: the cache before the call as tokens and position ids,
the inputs, their position ids and the tree mask). With F = prompt + the generated tokens, N the
tree's candidates and (parents, depths) the round's breadth-first tree (``tree.topology``; in a
dynamic world, the tree worked out from the draft's own rows, below), an exact tree generator
that keeps the conventions of ``exactcheck.contracts.tree_generator`` keeps, at every call:

1. ``committed_cache`` (every target call: each verify sees the previous verify's compaction;
   the first draft call of each round; the target's cache after the last verify): the cache
   holds F's first m tokens at positions 0 .. m-1: no rejected-branch entry left behind, no
   gap, no duplicate, nothing out of order;
2. ``committed_inputs`` (target calls): the verify forward's n inputs are c = n - N >= 1
   committed tokens F[m:m+c] (the last of them the root) followed by the N candidates;
3. ``tree_positions`` (target calls): the committed inputs sit at m .. m+c-1 and candidate i at
   depth d at (m + c - 1) + d: the root's position plus its depth;
4. ``tree_mask`` (target calls): a committed input sees the cache and the inputs up to itself; a
   candidate sees the cache, every committed input, its ancestors and itself, and no sibling,
   cousin or other node;
5. ``visible_path`` (every call of either model): what each input sees has positions exactly
   0, 1, ..., k, once each, its own the last. A correct tree mask with correct positions shows
   every input one root-to-node path; a visible sibling or cousin repeats a position, a wrong
   position leaves a gap. This is the draft's check (its forwards have no fixed layout);
6. ``drafted_tree`` (dynamic worlds, ``tree.expansion = (top, beam, depth, total)``): the round's
   tree is EAGLE-2's selection redone here from the logits the draft returned (softmax in
   float64; ties by token id, then by path score, depth and order drafted, as
   ``exactcheck.tree.cached_loop.ReferenceTreeLoop.draft_dynamic`` says): the round's first draft
   call ends with the root (its row gives depth 1), the draft call for depth d = 1 .. depth-1
   feeds the ``beam`` best nodes of depth d, best first, and the verify forward's candidates are
   the ``total`` best drafted nodes, breadth-first. That tree is then the one checks 2-4 hold
   the verify forward to. It needs the draft's recorded logits (``TreeForwardCall.logits``).
   **Near-ties.** An exact generator that scores in another precision or order (float16 or
   bfloat16 log-space sums, as EAGLE's ``topK_genrate`` adds them; ``torch.topk``'s tie order)
   may pick another tree where two scores a decision compares are within ``TIE_TOLERANCE``
   (relative) of each other. A beam fed in another order, or with another node, that EAGLE-2
   could pick up to such near-ties (every node clearly above the cut in it, none clearly below,
   one reading of its tokens) is followed: the round is judged on the generator's tree. Another
   beam or candidate set that a near-tie can explain but not follow (every token fed a child
   within the tolerance of its row's top-k and of the cut, and some decision's margin below
   it) leaves the round not judged (checks 2-4 skipped, 1 and 5 still run, the count in the
   verdict), never a breach. Anything else is a breach.

A round is one target call; draft calls before target call r belong to round r. Each breach is a
``TreeBreach`` (invariant, round, role, call index, detail). Deterministic: an exact generator
never breaches, so any breach is a finding.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from toy_models.tree_worlds import TreeWorld

__all__ = ["TreeBreach", "NearTies", "check_tree_calls", "dynamic_tree", "near_tie_beam", "TREE_INVARIANTS", "TIE_TOLERANCE"]

# relative gap below which two scores of a dynamic tree's decision are a near-tie: scores summed in
# log space in bfloat16 (EAGLE adds log-softmax scores in the model's dtype: about 2^-9 of |log p|
# a term, a few terms a path) stay within it; float32 and float16 far within
TIE_TOLERANCE = 2.0 ** -4

TREE_INVARIANTS = ("committed_cache", "committed_inputs", "tree_positions", "tree_mask", "visible_path",
                   "drafted_tree")


@dataclass(frozen=True)
class TreeBreach:
    """One broken invariant at one forward call (``call`` -1: the target's cache after the last verify)."""

    invariant: str
    round: int
    role: str
    call: int
    detail: str

    def describe(self) -> str:
        where = "the target cache after the last verify" if self.call < 0 else f"forward call {self.call} ({self.role})"
        return f"{self.invariant} broken in round {self.round} at {where}: {self.detail}"


def check_tree_calls(calls, prompt, generated, tree: TreeWorld,
                     final_target_cache: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
                     unjudged: list | None = None) -> list[TreeBreach]:
    """Every broken invariant over the recorded ``calls`` of one generation of ``generated`` after
    ``prompt``; ``final_target_cache``: (tokens, positions) the target's cache held at the end;
    ``unjudged`` (a list, if given) gets (round, detail) for each dynamic round not judged (a
    near-tie explains the generator's other tree)."""
    final = tuple(int(x) for x in prompt) + tuple(int(x) for x in generated)
    fixed = None if tree.expansion is not None else tree.topology + (None,)
    breaches: list[TreeBreach] = []
    rounds, first_of_round, drafts = 0, True, []
    for i, call in enumerate(calls):
        if call.role == "target" or first_of_round:
            breaches += _committed_cache(call.cached_tokens, call.cached_positions, final, rounds, call.role, i)
        if call.role == "target":
            expected, found, ties = fixed, [], None
            if expected is None:
                expected, found, ties = dynamic_tree(drafts, tree.expansion, rounds, i)
                breaches += found
            if expected is not None:
                breaches += _verify_call(call, i, rounds, final, *expected, ties=ties, unjudged=unjudged)
            elif not found and unjudged is not None:
                unjudged.append((rounds, "a draft forward fed another beam than EAGLE-2's, within a near-tie "
                                         f"(relative gap < {TIE_TOLERANCE:.2g}) of it"))
            drafts = []
        else:
            drafts.append((i, call))
        breaches += _visible_path(call, i, rounds)
        rounds += call.role == "target"
        first_of_round = call.role == "target"
    if final_target_cache is not None:
        tokens, positions = final_target_cache
        breaches += _committed_cache(tuple(tokens), tuple(positions), final, rounds, "target", -1, partial=True)
    return breaches


def _committed_cache(tokens, positions, final, rnd, role, call, partial=False) -> list[TreeBreach]:
    """The cache holds F[:m] at positions 0..m-1 (``partial``: F may end before the cache does,
    after the last round's extra tokens were cut)."""
    m = len(tokens)
    if positions != tuple(range(m)):
        bad = next(j for j, p in enumerate(positions) if p != j)
        return [TreeBreach("committed_cache", rnd, role, call, (
            f"cache entry {bad} is at position {positions[bad]} (cache positions {list(positions)}; expected "
            f"0..{m - 1}: an entry left behind, skipped or stored at a wrong position)"))]
    limit = min(m, len(final)) if partial else m
    wrong = next((j for j in range(limit) if j >= len(final) or tokens[j] != final[j]), None)
    if wrong is not None:
        there = final[wrong] if wrong < len(final) else "nothing"
        return [TreeBreach("committed_cache", rnd, role, call, (
            f"cache entry {wrong} holds token {tokens[wrong]}, the committed sequence has {there} there "
            f"(a rejected branch's entry left behind)"))]
    return []


def _gaps(values, k: int) -> float:
    """The smallest relative gap between neighbours among the ``k`` + 1 largest ``values``
    (in order): the margin of a top-``k`` choice and of its order."""
    ordered = sorted((float(v) for v in values), reverse=True)[:k + 1]
    return min(((a - b) / a for a, b in zip(ordered, ordered[1:]) if a > 0), default=float("inf"))


def near_tie_beam(level, scores, tokens, beam: int, fed: list[int]) -> list[int] | None:
    """The nodes of ``level`` the generator fed (``fed``: tokens, best first) where they are the one
    beam EAGLE-2 could pick up to near-ties: every node clearly above the ``beam``-th best score
    (by more than ``TIE_TOLERANCE``, relative) in it, every one in it no further below that score
    than the tolerance, each no more than that above the one before it, and the fed tokens read
    as such nodes in one way only (a token can be drafted under two parents); else None."""
    if len(fed) != beam:
        return None
    cut = sorted((scores[i] for i in level), reverse=True)[beam - 1]
    must = {i for i in level if scores[i] > cut * (1 + TIE_TOLERANCE)}
    options = [[i for i in level if tokens[i] == x and scores[i] >= cut * (1 - TIE_TOLERANCE)] for x in fed]
    valid = [list(nodes) for nodes in itertools.product(*options)
             if len(set(nodes)) == beam and must <= set(nodes)
             and all(scores[b] <= scores[a] * (1 + TIE_TOLERANCE) for a, b in zip(nodes, nodes[1:]))]
    return valid[0] if len(valid) == 1 else None


@dataclass(frozen=True)
class NearTies:
    """What a near-tie could change in a dynamic round: the smallest relative margin of its
    decisions, and the tokens a tree picked within ``TIE_TOLERANCE`` of them could hold (every
    drafted node's, and every child within the tolerance of a row's top-k, whose path score is
    within it of the kept set's last)."""

    margin: float
    tokens: frozenset

    def explain(self, tokens) -> bool:
        """Whether other candidate ``tokens`` may be a near-tie's choice (so not judged)."""
        return self.margin < TIE_TOLERANCE and set(tokens) <= self.tokens


def dynamic_tree(drafts, expansion, rnd: int, verify: int) -> tuple[tuple | None, list[TreeBreach], NearTies | None]:
    """EAGLE-2's tree of round ``rnd``, redone from the logits of its draft calls ``drafts``
    ((call index, call) pairs; ``verify``: the index of its verify call): ((parents, depths,
    tokens) of the kept tree, breadth-first; no breaches; its ``NearTies``), or (None, the
    ``drafted_tree`` breach, None) where the draft calls do not follow it; (None, [], None)
    where a draft forward fed another beam that a near-tie can explain (not judged). A beam fed
    in another order or with another node within a near-tie is followed (``near_tie_beam``)."""
    top, beam, depth, total = expansion
    margin = float("inf")

    def breach(index, detail, role="draft", explained=False):
        if explained:
            return None, [], None
        return None, [TreeBreach("drafted_tree", rnd, role, index, detail)], None

    if not drafts:
        return breach(verify, "no draft forward before the verify; the round's tree is drafted from the draft's rows",
                      "target")
    if any(call.logits is None for _, call in drafts):
        raise ValueError("a dynamic tree world's cache checks need the draft's logits (TreeForwardCall.logits)")
    tokens, parents, depths, scores = [-1], [-1], [0], [1.0]
    near: list[tuple[int, int, float]] = []  # (depth, token, path score) of every child within a near-tie of a top-k
    rows = {0: torch.softmax(torch.as_tensor(drafts[0][1].logits, dtype=torch.float64), -1)[-1]}
    frontier = [0]
    for d in range(1, depth + 1):
        level = []
        for parent in frontier:
            margin = min(margin, _gaps(rows[parent].tolist(), top))
            ordered = torch.sort(rows[parent], descending=True, stable=True).indices.tolist()
            edge = float(rows[parent][ordered[top - 1]]) * (1 - TIE_TOLERANCE)
            near += [(d, x, scores[parent] * float(rows[parent][x])) for x in ordered if float(rows[parent][x]) >= edge]
            for x in ordered[:top]:
                tokens.append(x)
                parents.append(parent)
                depths.append(d)
                scores.append(scores[parent] * float(rows[parent][x]))
                level.append(len(tokens) - 1)
        if d == depth:
            break
        margin = min(margin, _gaps([scores[i] for i in level], beam))
        frontier = sorted(level, key=lambda i: (-scores[i], i))[:beam]
        expected = [tokens[i] for i in frontier]
        followed = None if d >= len(drafts) else near_tie_beam(level, scores, tokens, beam,
                                                                list(drafts[d][1].input_tokens))
        if followed is not None and [tokens[i] for i in followed] != expected:
            frontier, expected = followed, [tokens[i] for i in followed]  # another beam, within a near-tie
        if d >= len(drafts) or list(drafts[d][1].input_tokens) != expected:
            index, got = (drafts[d][0], list(drafts[d][1].input_tokens)) if d < len(drafts) else (drafts[-1][0], None)
            cut = sorted((scores[i] for i in level), reverse=True)[beam - 1] * (1 - TIE_TOLERANCE)
            explained = (margin < TIE_TOLERANCE and got is not None and len(got) == beam
                         and set(got) <= {x for dd, x, sc in near if dd == d and sc >= cut})
            return breach(index, f"the draft forward for depth {d} feeds {got if got is not None else 'nothing'}; "
                                 f"the {beam} best nodes of depth {d} by path score, best first, are {expected}",
                          explained=explained)
        out = torch.softmax(torch.as_tensor(drafts[d][1].logits, dtype=torch.float64), -1)
        rows.update(zip(frontier, out))
    if len(drafts) > depth:
        return breach(drafts[depth][0], f"{len(drafts)} draft forwards before the verify; EAGLE-2 with depth {depth} "
                                        f"makes {depth} (the committed tokens, then depths 1 .. {depth - 1})")
    margin = min(margin, _gaps(scores[1:], total))
    kept = sorted(range(1, len(tokens)), key=lambda i: (-scores[i], depths[i], i))[:total]
    order = [0] + sorted(kept, key=lambda i: (depths[i], i))
    new = {old: j for j, old in enumerate(order)}
    last = min(scores[i] for i in kept) * (1 - TIE_TOLERANCE)
    ties = NearTies(margin, frozenset(x for _, x, sc in near if sc >= last))
    return ((-1,) + tuple(new[parents[i]] for i in order[1:]), tuple(depths[i] for i in order),
            tuple(tokens[i] for i in order)), [], ties


def _verify_call(call, index, rnd, final, parents, depths, tokens=None, ties=None, unjudged=None) -> list[TreeBreach]:
    """Checks 2-4 on one verify forward; ``tokens``: the candidates' expected tokens (dynamic trees),
    ``ties`` their ``NearTies``: other candidates a near-tie explains leave the round not judged
    (recorded in ``unjudged``)."""
    m, n, nodes = len(call.cached_tokens), len(call.input_tokens), len(parents)
    c = n - (nodes - 1)
    where = dict(round=rnd, role="target", call=index)
    if c < 1 or m + c > len(final) or call.input_tokens[:c] != final[m:m + c]:
        return [TreeBreach("committed_inputs", detail=(
            f"the verify forward feeds {list(call.input_tokens)} after a cache of {m} entries; expected the "
            f"committed tokens {list(final[m:m + max(c, 1)])} then {nodes - 1} candidates"), **where)]
    root = m + c - 1  # the root's index among cache + inputs, and its position
    expected = list(range(m, m + c)) + [root + depths[i] for i in range(1, nodes)]
    out = []
    if tokens is not None and tuple(call.input_tokens[c:]) != tuple(tokens[1:]) and ties is not None \
            and ties.explain(call.input_tokens[c:]):
        if unjudged is not None:
            unjudged.append((rnd, f"the verify forward's candidates are another tree than EAGLE-2's, within a near-tie "
                                  f"(relative gap {ties.margin:.2g} < {TIE_TOLERANCE:.2g}) of it"))
        return out
    if tokens is not None and tuple(call.input_tokens[c:]) != tuple(tokens[1:]):
        out.append(TreeBreach("drafted_tree", detail=(
            f"the verify forward's candidates are {list(call.input_tokens[c:])}; EAGLE-2's tree from the draft's "
            f"rows has {list(tokens[1:])} (breadth-first, parents {list(parents)})"), **where))
    if list(call.input_positions) != expected:
        bad = next(j for j, (a, b) in enumerate(zip(call.input_positions, expected)) if a != b)
        what = f"candidate {bad - c + 1} (depth {depths[bad - c + 1]})" if bad >= c else f"committed input {bad}"
        out.append(TreeBreach("tree_positions", detail=(
            f"{what} is at position {call.input_positions[bad]}, expected {expected[bad]} "
            f"(inputs at {list(call.input_positions)}, expected {expected})"), **where))
    for a in range(n):
        node = a - c + 1  # tree node id of input a (0: the root), negative for earlier committed inputs
        allowed = set(range(m + min(a, c - 1) + 1))  # cache and committed inputs up to a (or all of them)
        if node > 0:
            j = node
            while j > 0:
                allowed.add(root + j)
                j = parents[j]
        seen = set(call.visible(a))
        if seen != allowed:
            out.append(TreeBreach("tree_mask", detail=_mask_detail(node, seen, allowed, root, parents, a), **where))
            break
    return out


def _mask_detail(node, seen, allowed, root, parents, a) -> str:
    who = f"candidate {node}" if node > 0 else ("the root" if node == 0 else f"committed input {a}")
    extra, missing = sorted(seen - allowed), sorted(allowed - seen)
    parts = []
    if extra:
        names = [f"node {j - root} ({_relation(node, j - root, parents)})" if j > root else f"entry {j}" for j in extra]
        parts.append(f"sees {', '.join(names)}")
    if missing:
        parts.append(f"does not see {', '.join(f'node {j - root}' if j >= root else f'entry {j}' for j in missing)}")
    return f"{who} {' and '.join(parts)}; it may see the committed entries, its ancestors and itself only"


def _relation(node: int, other: int, parents) -> str:
    if node <= 0:
        return "a candidate"
    if parents[other] == parents[node]:
        return "a sibling"
    return "a cousin" if other < node else "a later node"


def _visible_path(call, index, rnd) -> list[TreeBreach]:
    positions = call.cached_positions + call.input_positions
    m = len(call.cached_tokens)
    for a in range(len(call.input_tokens)):
        seen = call.visible(a)
        got = sorted(positions[j] for j in seen)
        own = call.input_positions[a]
        if got != list(range(len(got))) or m + a not in seen or own != len(got) - 1:
            return [TreeBreach("visible_path", rnd, call.role, index, (
                f"input {a} (token {call.input_tokens[a]} at position {own}) sees positions {got}; a path from "
                f"position 0 to its own, each once, was expected"))]
    return []
