"""The tree-verifier contract (step level), in the spirit of the chain contract.

    verify_tree(target_probs [B, N+1, V], draft_probs [B, N+1, V] | None, tokens [B, N+1] int64,
                parents [B, N+1] int64, generator) -> [B, D+1] int64

Node 0 is the root (the context so far): ``tokens[:, 0]`` is unused (-1) and ``parents[:, 0]`` is
-1; nodes 1..N are candidates with ``parents[:, i] < i``. ``target_probs[:, i]`` is the target's
law after the path to node i; ``draft_probs[:, i]`` the law node i's children were drawn from
(None for a subject that takes no draft rows, as target-only verification). The output is the
accepted path's tokens from the root's child down, then one correction or bonus token, then -1
padding; D is the tree's depth.

How siblings were drawn is part of the tree world (``toy_models.tree_worlds``); a subject declares
the one it expects in ``sibling_sampling`` ("iid", the default: SpecInfer;
"without_replacement": EAGLE-1; "top_k": deterministic siblings) and, optionally, ``takes_draft_probs =
False`` (it is called with None) and ``tree_rule`` (a name in ``exactcheck.tree.laws.TREE_RULES``:
its emitted law per step is then checked as conformance).

``call_tree_verifier`` validates the answer: a tensor of int64 ids, shape [B, D+1], each row a
path of the tree (every emitted token but the last is a child of the node before it), then one
token in [0, V), then padding only; anything else is a ``ContractViolation`` naming the row.
"""
from __future__ import annotations

from typing import Protocol

import torch

from exactcheck.errors import ContractViolation, Violation
from exactcheck.subject_call import SnapshotInputs, call_subject

__all__ = ["TreeVerifier", "call_tree_verifier", "children_table", "sibling_sampling", "takes_draft_probs",
           "tree_depths"]


class TreeVerifier(Protocol):
    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor | None, tokens: torch.Tensor,
                 parents: torch.Tensor, generator: torch.Generator) -> torch.Tensor: ...


def sibling_sampling(subject) -> str:
    return getattr(subject, "sibling_sampling", "iid")


def takes_draft_probs(subject) -> bool:
    return bool(getattr(subject, "takes_draft_probs", True))


def children_table(parents: torch.Tensor) -> torch.Tensor:
    """[B, N+1, K] node ids of each node's children in index order, -1 padded (K: the most
    children any node has)."""
    b, m = parents.shape
    if b == 1:  # one tree (a loop's verify): read in Python, not with tensor ops
        kids = [[] for _ in range(m)]
        for node, parent in enumerate(parents[0, 1:].tolist(), 1):
            kids[parent].append(node)
        width = max(map(len, kids)) if m > 1 else 1
        return torch.tensor([[k + [-1] * (width - len(k)) for k in kids]], dtype=torch.int64, device=parents.device)
    par = parents[:, 1:]
    same = par[:, :, None] == par[:, None, :]
    earlier = torch.ones(m - 1, m - 1, dtype=torch.bool, device=parents.device).tril(-1)
    rank = (same & earlier).sum(2)  # how many earlier siblings each node has
    width = int(rank.max()) + 1 if m > 1 else 1
    table = torch.full((b, m, width), -1, dtype=torch.int64, device=parents.device)
    rows = torch.arange(b, device=parents.device)[:, None].expand(-1, m - 1)
    nodes = torch.arange(1, m, device=parents.device)[None].expand(b, -1)
    table[rows, par, rank] = nodes
    return table


def tree_depths(parents: torch.Tensor) -> torch.Tensor:
    """[B, N+1] depth of every node (root 0)."""
    if parents.shape[0] == 1:  # one tree: in Python
        depth = [0] * parents.shape[1]
        for node, parent in enumerate(parents[0, 1:].tolist(), 1):
            depth[node] = depth[max(parent, 0)] + 1
        return torch.tensor([depth], dtype=parents.dtype, device=parents.device)
    depth = torch.zeros_like(parents)
    for i in range(1, parents.shape[1]):
        depth[:, i] = depth.gather(1, parents[:, i:i + 1].clamp(min=0))[:, 0] + 1
    return depth


def call_tree_verifier(subject, target_probs, draft_probs, tokens, parents, generator) -> torch.Tensor:
    """Call the subject (with ``draft_probs`` or None, as it declares) and validate its output."""
    guard = SnapshotInputs(("target_probs", target_probs), ("draft_probs", draft_probs), ("tokens", tokens),
                           ("parents", parents))
    p, q, t, par = guard.copies
    out = call_subject(subject, p, q if takes_draft_probs(subject) else None, t, par, generator)
    guard.check()
    return validate_tree_output(out, tokens, parents, target_probs.shape[-1])


def validate_tree_output(out, tokens: torch.Tensor, parents: torch.Tensor, vocab: int) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise ContractViolation(Violation.NOT_A_TENSOR, f"got {type(out).__name__}")
    if out.dtype != torch.int64:
        raise ContractViolation(Violation.WRONG_DTYPE, f"got {out.dtype}")
    depth = int(tree_depths(parents).max())
    b = tokens.shape[0]
    if tuple(out.shape) != (b, depth + 1):
        raise ContractViolation(Violation.WRONG_SHAPE, f"got {tuple(out.shape)}, expected {(b, depth + 1)} "
                                                       f"(batch, tree depth + 1)")
    out = out.to(tokens.device)
    pad = out == -1
    bad = (~pad) & ((out < 0) | (out >= vocab))
    if bad.any():
        row = int(bad.any(1).nonzero()[0, 0])
        raise ContractViolation(Violation.OUT_OF_VOCABULARY, f"row {row}: {out[row].tolist()}, V = {vocab}", row)
    after = pad.int().cummax(1).values.bool() & ~pad
    if after.any():
        row = int(after.any(1).nonzero()[0, 0])
        raise ContractViolation(Violation.TOKEN_AFTER_PADDING, f"row {row}: {out[row].tolist()}", row)
    emitted = (~pad).sum(1)
    if (emitted == 0).any():
        row = int((emitted == 0).nonzero()[0, 0])
        raise ContractViolation(Violation.NOTHING_EMITTED, f"row {row}", row)
    # every emitted token but the last must be a child of the node before it; with duplicate
    # siblings the path may run through any of them, so the set of nodes it can be at is kept
    at = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
    at[:, 0] = True
    parent_ids = parents.clamp(min=0)
    for j in range(depth):
        on_path = emitted > j + 1  # position j is a path token
        if not on_path.any():
            break
        from_here = at.gather(1, parent_ids) & (parents >= 0)  # nodes whose parent the path is at
        nxt = from_here & (tokens == out[:, j:j + 1])
        broken = on_path & ~nxt.any(1)
        if broken.any():
            row = int(broken.nonzero()[0, 0])
            raise ContractViolation(Violation.NOT_A_TREE_PATH, (
                f"row {row}: emitted {out[row].tolist()}; token {int(out[row, j])} at position {j} is not a child "
                f"of the node reached before it"), row)
        at = torch.where(on_path[:, None], nxt, at)
    return out
