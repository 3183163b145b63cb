"""Tree verifiers with one defect each, from the bug classes engines shipped (field notes, section
5), and one that is exact but wasteful.

* ``residual_from_draft_q`` (TensorRT-LLM #15098): deterministic top-k siblings verified with the
  i.i.d. formula: accepted with min(1, r/q), residual max(r - q, 0) with the draft row q, so the
  residual is not the target's leftover law;
* ``duplicates_double_counted``: target-only verification of i.i.d. siblings that adds a
  duplicate sibling's target mass again (nothing tests duplicate siblings in SGLang's kernel);
* ``lone_child_greedy`` (TensorRT-LLM #15842: a K = 1 "tree" diverges from the chain): a node
  with a single child accepts it only if it is the target row's argmax;
* ``tree_read_as_chain`` (TensorRT-LLM #18210: a dynamic tree silently verified as a linear
  chain): nodes 1..N taken as one chain, whatever their parents;
* ``mask_of_32_slots`` (the out-of-bounds read past 32 siblings flagged in #15098's review): the
  tried-token mask holds 32 slots, so sibling j >= 32 zeroes sibling j - 32's token instead of its
  own and a rejected token can come back as the correction;
* ``correction_ignores_residual``: after every child is rejected, the correction is drawn from
  the node's target row instead of the residual;
* ``correction_from_parent_row``: the correction (or bonus) is drawn from the row of the node
  before the one reached (an off-by-one in the row index: the wrong node's row);
* ``coin_at_or_below_ratio`` (``BOUNDARY_TREE_MUTANTS``; the non-strict ``coin <= prob_acc`` read
  in TensorRT-LLM's tree walk): float32 coins compared with ``<=``, so a coin of exactly 0 accepts
  a sibling the target forbids. Its law is within 2^-24 a coin of the exact one: only the
  boundary-coin property (``exactcheck.tree.properties``) sees it.

* ``siblings_pruned_by_target`` (a dynamic tree whose shape reads the target): i.i.d. siblings
  whose target probability is below half their draft probability are dropped before the walk, so
  the siblings tried are no longer draws from q and the residual misses their updates.

``pruned_by_target_top_k`` drops the same siblings from a top-k tree and verifies with tried
tokens zeroed: exact (point-mass siblings are exact for any sibling set chosen from anything but
the coins), so a shape that reads the target is a finding only where the rule needs the siblings'
law. ``first_branch_only`` verifies the first child chain and ignores the other siblings: exact in law
(the first branch alone is a chain drawn from q), fewer tokens accepted. It belongs to the corpus
of correct subjects, not here: it shows that exactness is judged by the output law.
"""
from __future__ import annotations

import functools

import torch

from exactcheck.contracts.tree_reference import (deterministic_children, gather, multi_round_children, multi_round_deciding,
                                       normalised, target_only_children, inverse_cdf, walk_tree)

__all__ = ["TREE_MUTANTS", "BOUNDARY_TREE_MUTANTS", "first_branch_only", "pruned_by_target_top_k"]


def _residual_from_draft_q(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, multi_round_children)


_residual_from_draft_q.sibling_sampling = "top_k"


def _duplicates_double_counted(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, None, tokens, parents, generator,
                     functools.partial(target_only_children, count_duplicates=True))


_duplicates_double_counted.sibling_sampling = "iid"
_duplicates_double_counted.takes_draft_probs = False


def _lone_child_children(p, q, kid_tokens, valid, generator):
    alone = valid[:, 0] & ~valid[:, 1:].any(1) if valid.shape[1] > 1 else valid[:, 0]
    slot, r = multi_round_children(p, q, kid_tokens, valid & ~alone[:, None], generator)
    greedy = alone & (kid_tokens[:, 0] == p.argmax(1))
    slot = torch.where(greedy, torch.zeros_like(slot), slot)
    r = torch.where((alone & ~greedy)[:, None], normalised(p.scatter(1, kid_tokens[:, :1], 0.0), p), r)
    return slot, r


def _lone_child_greedy(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, _lone_child_children)


_lone_child_greedy.sibling_sampling = "iid"


def _tree_read_as_chain(target_probs, draft_probs, tokens, parents, generator):
    """Token-wise chain verification of nodes 1..N in index order, rows as handed in."""
    b, m, _ = target_probs.shape
    depth = 0
    par = parents[0].tolist()
    for i in range(1, m):
        d, j = 0, i
        while par[j] >= 0:
            j, d = par[j], d + 1
        depth = max(depth, d)
    p, q = target_probs.double(), draft_probs.double()
    out = torch.full((b, depth + 1), -1, dtype=torch.int64, device=tokens.device)
    live = torch.ones(b, dtype=torch.bool, device=tokens.device)
    for i in range(depth):
        x = tokens[:, i + 1]
        u = torch.rand(b, dtype=torch.float64, generator=generator, device=tokens.device)
        accept = live & (u * gather(q[:, i], x) < gather(p[:, i], x))
        out[:, i] = torch.where(accept, x, out[:, i])
        ending = live & ~accept
        v = torch.rand(b, dtype=torch.float64, generator=generator, device=tokens.device)
        correction = inverse_cdf(normalised((p[:, i] - q[:, i]).clamp(min=0), p[:, i]), v)
        out[:, i] = torch.where(ending, correction, out[:, i])
        live = accept
    v = torch.rand(b, dtype=torch.float64, generator=generator, device=tokens.device)
    out[:, depth] = torch.where(live, inverse_cdf(p[:, depth], v), out[:, depth])
    return out


_tree_read_as_chain.sibling_sampling = "iid"


def _mask_of_32_slots(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator,
                     functools.partial(deterministic_children, tried_slots=32))


_mask_of_32_slots.sibling_sampling = "top_k"


def _ignoring_residual_children(p, q, kid_tokens, valid, generator):
    slot, _ = multi_round_children(p, q, kid_tokens, valid, generator)
    return slot, p


def _correction_ignores_residual(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, _ignoring_residual_children)


_correction_ignores_residual.sibling_sampling = "iid"


def _correction_from_parent_row(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, multi_round_children,
                     correction_row=lambda residual, parent_row: parent_row)


_correction_from_parent_row.sibling_sampling = "iid"


def _first_branch_children(p, q, kid_tokens, valid, generator):
    only_first = valid.clone()
    only_first[:, 1:] = False
    return multi_round_children(p, q, kid_tokens, only_first, generator)


def _pruned_children(rule_children, ratio: float):
    """``rule_children`` after dropping each sibling whose target probability is below ``ratio``
    times its draft probability (0: below nothing): the tree's shape chosen by reading the target."""
    def children(p, q, kid_tokens, valid, generator):
        keep = p.gather(1, kid_tokens)
        if q is not None:
            keep = keep >= ratio * q.gather(1, kid_tokens)
        else:
            keep = keep > 0
        return rule_children(p, q, kid_tokens, valid & keep, generator)
    return children


def _siblings_pruned_by_target(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator,
                     _pruned_children(multi_round_children, 0.5))


_siblings_pruned_by_target.sibling_sampling = "iid"


def pruned_by_target_top_k(target_probs, draft_probs, tokens, parents, generator):
    """Exact: deterministic (top-k) siblings verified with tried tokens zeroed, after dropping every
    sibling the target gives less than half its draft mass. Point-mass siblings are exact for any
    set of siblings, chosen from anything but the coins, the target included."""
    return walk_tree(target_probs, draft_probs, tokens, parents, generator,
                     _pruned_children(deterministic_children, 0.5))


pruned_by_target_top_k.sibling_sampling = "top_k"


def first_branch_only(target_probs, draft_probs, tokens, parents, generator):
    """Exact but wasteful: the first child chain verified token-wise, the other siblings ignored."""
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, _first_branch_children)


first_branch_only.sibling_sampling = "iid"

def _coin_at_or_below(rx, qx, generator):
    coin = torch.rand(rx.shape[0], dtype=torch.float32, generator=generator, device=rx.device).double()
    return coin * qx <= rx  # non-strict: a coin of exactly 0 accepts r(x) = 0


def _coin_at_or_below_ratio(target_probs, draft_probs, tokens, parents, generator):
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, multi_round_deciding(_coin_at_or_below))


_coin_at_or_below_ratio.sibling_sampling = "iid"
_coin_at_or_below_ratio.tree_rule = "multi_round"


# The ratio r(x)/q(x) rounded to a half type before the coin is compared with it (a kernel that
# keeps probabilities in float16 or bfloat16), with the coin as drawn or mirrored (u = 1 - rand,
# compared non-strictly: exact in float64). Each threshold moves by up to 2^-11 (float16) or 2^-8
# (bfloat16) of itself: the law moves by about that much, out of a quick audit's reach; forced
# coins 2^-14 either side of the exact threshold (``tree_rule_decisions``) see it.
def _ratio_deciding(dtype: torch.dtype, mirrored: bool):
    def decide(rx, qx, generator):
        u = torch.rand(rx.shape[0], dtype=torch.float64, generator=generator, device=rx.device)
        ratio = (rx.to(dtype) / qx.to(dtype)).double()
        return (1.0 - u) <= ratio if mirrored else u < ratio
    return decide


def _ratio_mutant(dtype: torch.dtype, mirrored: bool):
    decide = multi_round_deciding(_ratio_deciding(dtype, mirrored))

    def verifier(target_probs, draft_probs, tokens, parents, generator):
        return walk_tree(target_probs, draft_probs, tokens, parents, generator, decide)
    verifier.sibling_sampling = "iid"
    verifier.tree_rule = "multi_round"
    return verifier


# found by the forced-coin properties alone (``exactcheck.tree.properties``): the first's law is
# within 2^-24 a coin of the exact law, the ratio ones within 2^-8 of each threshold
BOUNDARY_TREE_MUTANTS = {"coin_at_or_below_ratio": _coin_at_or_below_ratio,
                         "ratio_in_float16": _ratio_mutant(torch.float16, mirrored=False),
                         "ratio_in_bfloat16": _ratio_mutant(torch.bfloat16, mirrored=False),
                         "mirrored_coin_ratio_in_float16": _ratio_mutant(torch.float16, mirrored=True),
                         "mirrored_coin_ratio_in_bfloat16": _ratio_mutant(torch.bfloat16, mirrored=True)}

TREE_MUTANTS = {
    "residual_from_draft_q": _residual_from_draft_q,
    "duplicates_double_counted": _duplicates_double_counted,
    "lone_child_greedy": _lone_child_greedy,
    "tree_read_as_chain": _tree_read_as_chain,
    "mask_of_32_slots": _mask_of_32_slots,
    "correction_ignores_residual": _correction_ignores_residual,
    "correction_from_parent_row": _correction_from_parent_row,
    "siblings_pruned_by_target": _siblings_pruned_by_target,
}
for _name, _fn in {**TREE_MUTANTS, **BOUNDARY_TREE_MUTANTS}.items():
    _fn.__name__ = _name
