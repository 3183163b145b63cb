"""Exact tree verifiers: one per way siblings are drawn, each written from its paper.

All walk the tree from the root. At a node, its children are tried in index order against a
residual ``r`` that starts as the node's target row; the first accepted child is emitted and the
walk descends into it with a fresh residual (its own target row); when every child is rejected (or
the node is a leaf) one token is drawn from ``r`` and the step ends.

* ``multi_round`` (SpecInfer; siblings i.i.d. from the node's draft row q): child x is
  accepted with probability min(1, r(x)/q(x)); on rejection r <- norm(max(r - q, 0)).
* ``without_replacement`` (recursive speculative decoding, EAGLE-1 as shipped; siblings drawn one after another
  from q with the earlier ones removed): sibling j was drawn from q_j (q without siblings
  1..j-1, renormalised); accepted with min(1, r(x)/q_j(x)); on rejection r <- norm(max(r - q_j,
  0)).
* ``deterministic`` (TensorRT-LLM's dynamic tree after #15098; siblings fixed, e.g. top-k): each
  sibling is a point mass, accepted with probability r(x); on rejection x is zeroed in r and r
  renormalised ("zeroing tried tokens"). Draft rows are not used.
* ``target_only`` (SGLang's tree kernel, exact at thresholds 1): one coin u per level; the first
  sibling whose cumulative target mass (each distinct token counted once) exceeds u is accepted;
  if none, the correction is drawn from the target row with the siblings' tokens zeroed. Called
  without draft rows.

Uniforms are float64 from the generator handed in; corrections by inverse CDF on float64 uniforms.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.tree_verifier import children_table, tree_depths

__all__ = ["multi_round", "without_replacement", "deterministic", "target_only", "typical", "typical_medusa", "greedy",
           "LOSSY_TREE_VERIFIERS", "REFERENCE_TREE_VERIFIERS", "gather", "normalised", "multi_round_deciding",
           "walk_tree", "inverse_cdf"]


def inverse_cdf(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token at uniform ``u`` [B] under ``rows`` [B, V] (unnormalised), never one of mass 0."""
    cdf = rows.cumsum(1)
    token = (cdf <= u[:, None] * cdf[:, -1:]).sum(1)
    last = (cdf < cdf[:, -1:]).sum(1)
    return torch.minimum(token, last)


def normalised(rows: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    total = rows.sum(1, keepdim=True)
    positive = total > 0
    return torch.where(positive, rows / torch.where(positive, total, 1.0), fallback)


def walk_tree(target_probs, draft_probs, tokens, parents, generator, try_children, correction_row=None) -> torch.Tensor:
    """The common walk: ``try_children(p, q, kid_tokens, kid_valid, generator) -> (accepted child
    slot or -1 [B], residual [B, V])`` decides at one node for every row; the rest is shared.
    ``correction_row(residual, parent_row)`` (mutants only) replaces the row the correction is
    drawn from; ``parent_row`` is the target row of the node before the current one (the root's
    own at the root)."""
    b, m, vocab = target_probs.shape
    device = target_probs.device
    p_all = target_probs.double()
    q_all = draft_probs.double() if draft_probs is not None else None
    table = children_table(parents)
    depth = int(tree_depths(parents).max())
    out = torch.full((b, depth + 1), -1, dtype=torch.int64, device=device)
    rows = torch.arange(b, device=device)
    node = torch.zeros(b, dtype=torch.int64, device=device)
    live = torch.ones(b, dtype=torch.bool, device=device)
    parent_row = p_all[:, 0]
    for level in range(depth + 1):
        kids = table[rows, node]  # [B, K]
        valid = kids >= 0
        kid_tokens = torch.where(valid, tokens.gather(1, kids.clamp(min=0)), 0)
        p = p_all[rows, node]
        q = q_all[rows, node] if q_all is not None else None
        slot, residual = try_children(p, q, kid_tokens, valid & live[:, None], generator)
        accepted = live & (slot >= 0)
        ending = live & ~accepted
        u = torch.rand(b, dtype=torch.float64, generator=generator, device=device)
        if ending.any():  # rows that end here take a correction drawn with u
            if correction_row is not None:
                residual = correction_row(residual, parent_row)
            out[:, level] = torch.where(ending, inverse_cdf(residual, u), out[:, level])
        if not accepted.any():
            break
        chosen = kids.gather(1, slot.clamp(min=0)[:, None])[:, 0].clamp(min=0)
        out[:, level] = torch.where(accepted, tokens.gather(1, chosen[:, None])[:, 0], out[:, level])
        parent_row = torch.where(accepted[:, None], p, parent_row)
        node = torch.where(accepted, chosen, node)
        live = accepted
    return out


def gather(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return rows.gather(1, tokens[:, None])[:, 0]


def multi_round_deciding(decide):
    """The multi-round rule's ``try_children`` with its acceptance decision ``decide(r(x), q(x),
    generator) -> accept [B]`` (it draws its own coin): the reference's, the corpus's coin
    conventions and the boundary mutant differ only there."""
    def children(p, q, kid_tokens, valid, generator):
        r = p.clone()
        slot = torch.full((p.shape[0],), -1, dtype=torch.int64, device=p.device)
        for j in range(kid_tokens.shape[1]):
            trying = valid[:, j] & (slot < 0)
            x = kid_tokens[:, j]
            decided = decide(gather(r, x), gather(q, x), generator)  # draws its coin, tried or not
            if not trying.any():
                continue  # nothing changes
            accept = trying & decided
            slot = torch.where(accept, torch.full_like(slot, j), slot)
            reject = trying & ~accept
            r = torch.where(reject[:, None], normalised((r - q).clamp(min=0), r), r)
        return slot, r
    return children


def _strict_float64_coin(rx, qx, generator):
    u = torch.rand(rx.shape[0], dtype=torch.float64, generator=generator, device=rx.device)
    return u * qx < rx  # u < r/q without dividing (q(x) > 0: x was drawn from q)


multi_round_children = multi_round_deciding(_strict_float64_coin)


def _without_replacement_children(p, q, kid_tokens, valid, generator):
    r, qj = p.clone(), q.clone()
    slot = torch.full((p.shape[0],), -1, dtype=torch.int64, device=p.device)
    for j in range(kid_tokens.shape[1]):
        trying = valid[:, j] & (slot < 0)
        x = kid_tokens[:, j]
        qj = normalised(qj, qj)
        rx, qx = gather(r, x), gather(qj, x)
        u = torch.rand(p.shape[0], dtype=torch.float64, generator=generator, device=p.device)
        if trying.any():  # else slot and r stay as they are
            accept = trying & (u * qx < rx)
            slot = torch.where(accept, torch.full_like(slot, j), slot)
            reject = trying & ~accept
            r = torch.where(reject[:, None], normalised((r - qj).clamp(min=0), r), r)
        qj = torch.where(valid[:, j:j + 1], qj.scatter(1, x[:, None], 0.0), qj)  # sibling j+1 excludes x
    return slot, r


def deterministic_children(p, q, kid_tokens, valid, generator, tried_slots: int | None = None):
    """Point-mass siblings; ``tried_slots`` (mutants only): the tried-token mask has that many
    slots, so sibling j zeroes sibling j mod slots's token."""
    r = p.clone()
    slot = torch.full((p.shape[0],), -1, dtype=torch.int64, device=p.device)
    for j in range(kid_tokens.shape[1]):
        trying = valid[:, j] & (slot < 0)
        u = torch.rand(p.shape[0], dtype=torch.float64, generator=generator, device=p.device)
        if not trying.any():
            continue  # nothing changes
        x = kid_tokens[:, j]
        accept = trying & (u < gather(r, x))
        slot = torch.where(accept, torch.full_like(slot, j), slot)
        reject = trying & ~accept
        zeroed = x if tried_slots is None else kid_tokens[:, j % tried_slots]
        r = torch.where(reject[:, None], normalised(r.scatter(1, zeroed[:, None], 0.0), r), r)
    return slot, r


def target_only_children(p, q, kid_tokens, valid, generator, count_duplicates: bool = False):
    """One coin per level over the siblings' target mass; ``count_duplicates`` (mutants only) adds
    a duplicate sibling's mass again."""
    b, k = kid_tokens.shape
    u = torch.rand(b, dtype=torch.float64, generator=generator, device=p.device)
    slot = torch.full((b,), -1, dtype=torch.int64, device=p.device)
    seen = torch.zeros_like(p, dtype=torch.bool)
    cumulative = torch.zeros(b, dtype=torch.float64, device=p.device)
    for j in range(k):
        x = kid_tokens[:, j]
        fresh = valid[:, j] & (count_duplicates | ~seen.gather(1, x[:, None])[:, 0])  # a duplicate adds nothing
        cumulative = cumulative + torch.where(fresh, gather(p, x), 0.0)
        accept = fresh & (slot < 0) & (u < cumulative)
        slot = torch.where(accept, torch.full_like(slot, j), slot)
        seen = seen | (torch.nn.functional.one_hot(x, p.shape[1]).bool() & valid[:, j:j + 1])
    residual = normalised(p.masked_fill(seen, 0.0), p)
    return slot, residual


def multi_round(target_probs, draft_probs, tokens, parents, generator):
    """SpecInfer's multi-round speculative sampling (siblings i.i.d. from q)."""
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, multi_round_children)


multi_round.sibling_sampling = "iid"
multi_round.tree_rule = "multi_round"


def without_replacement(target_probs, draft_probs, tokens, parents, generator):
    """Recursive rejection sampling for siblings drawn without replacement."""
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, _without_replacement_children)


without_replacement.sibling_sampling = "without_replacement"
without_replacement.tree_rule = "without_replacement"


def deterministic(target_probs, draft_probs, tokens, parents, generator):
    """Deterministic siblings (top-k) as point masses; tried tokens zeroed (TensorRT-LLM #15098's fix)."""
    return walk_tree(target_probs, draft_probs, tokens, parents, generator, deterministic_children)


deterministic.sibling_sampling = "top_k"
deterministic.tree_rule = "deterministic"


def target_only(target_probs, draft_probs, tokens, parents, generator):
    """SGLang's target-only recursion at thresholds 1: one coin per level over the siblings' target mass."""
    return walk_tree(target_probs, None, tokens, parents, generator, target_only_children)


target_only.sibling_sampling = "top_k"
target_only.takes_draft_probs = False
target_only.tree_rule = "target_only"

def _typical_walk(target_probs, tokens, parents, generator, argmax_bonus: bool, posterior_threshold: float = 0.09,
                  posterior_alpha: float = 0.3):
    """Typical acceptance over the whole tree (``exactcheck.tree.rules.Typical``), batched: every
    node's acceptance, the deepest fully accepted node (ties: the larger sum of log p), its path,
    then argmax p there (or, without ``argmax_bonus``, a draw from p at a leaf)."""
    b, m, vocab = target_probs.shape
    device = target_probs.device
    p = target_probs.double()
    entropy = -(p * torch.log(p + 1e-5)).sum(-1)  # [B, N+1]
    threshold = torch.clamp(posterior_alpha * torch.exp(-entropy), max=posterior_threshold)
    rows = torch.arange(b, device=device)
    depth = tree_depths(parents)
    ok = torch.ones(b, m, dtype=torch.bool, device=device)
    loglik = torch.zeros(b, m, dtype=torch.float64, device=device)
    for i in range(1, m):
        par = parents[:, i]
        prob = p[rows, par, tokens[:, i].clamp(min=0)]
        ok[:, i] = ok[rows, par] & (prob > threshold[rows, par])
        loglik[:, i] = loglik[rows, par] + torch.log(prob)
    # rank: deepest first, then likelihood; node 0 (depth 0, always accepted) when nothing is
    score_depth = torch.where(ok, depth, torch.full_like(depth, -1))
    best_depth = score_depth.max(1).values
    at_best = score_depth == best_depth[:, None]
    best = torch.where(at_best, loglik, torch.full_like(loglik, -torch.inf)).argmax(1)
    best = torch.where(best_depth == 0, torch.zeros_like(best), best)
    out = torch.full((b, int(depth.max()) + 1), -1, dtype=torch.int64, device=device)
    node = best.clone()
    for j in range(int(best_depth.max()), 0, -1):  # the path, filled from its end
        on = best_depth >= j
        out[:, j - 1] = torch.where(on, tokens[rows, node], out[:, j - 1])
        node = torch.where(on, parents[rows, node], node)
    row = p[rows, best]
    leaf = ~(parents == best[:, None]).any(1)
    u = torch.rand(b, dtype=torch.float64, generator=generator, device=device)
    final = row.argmax(1) if argmax_bonus else torch.where(leaf, inverse_cdf(row, u), row.argmax(1))
    out[rows, best_depth] = final
    return out


def typical(target_probs, draft_probs, tokens, parents, generator):
    """Typical acceptance on a top-k tree, the bonus drawn from p at a leaf (lossy)."""
    return _typical_walk(target_probs, tokens, parents, generator, argmax_bonus=False)


typical.sibling_sampling = "top_k"
typical.takes_draft_probs = False
typical.tree_rule = "typical"


def typical_medusa(target_probs, draft_probs, tokens, parents, generator):
    """Typical acceptance as Medusa ships it: argmax at the node reached (lossy)."""
    return _typical_walk(target_probs, tokens, parents, generator, argmax_bonus=True)


typical_medusa.sibling_sampling = "top_k"
typical_medusa.takes_draft_probs = False
typical_medusa.tree_rule = "typical_medusa"

REFERENCE_TREE_VERIFIERS = {"multi_round": multi_round, "without_replacement": without_replacement,
                            "deterministic": deterministic, "target_only": target_only}

def _greedy_children(p, q, kid_tokens, valid, generator):
    """The child whose token is the target's argmax (lowest id on a tie), if any; the residual is
    the argmax itself, so the correction (or bonus) is argmax p."""
    best = p.argmax(1)
    hit = valid & (kid_tokens == best[:, None])
    slot = torch.where(hit.any(1), hit.int().argmax(1), torch.full_like(best, -1))
    return slot, torch.nn.functional.one_hot(best, p.shape[1]).double()


def greedy(target_probs, draft_probs, tokens, parents, generator):
    """Greedy tree verification: the argmax child, else the argmax as correction (lossy but for a
    greedy target)."""
    return walk_tree(target_probs, None, tokens, parents, generator, _greedy_children)


greedy.sibling_sampling = "top_k"
greedy.takes_draft_probs = False
greedy.tree_rule = "greedy"

# lossy by design: each follows its declared rule, and its output law is the rule's, not the target's
LOSSY_TREE_VERIFIERS = {"typical": typical, "typical_medusa": typical_medusa, "greedy": greedy}
