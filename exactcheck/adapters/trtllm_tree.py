"""TensorRT-LLM's EAGLE-3 dynamic-tree rejection sampling behind exactcheck's tree contract.

Read from TensorRT-LLM's sources after PR #15098 ("fix output distribution correctness for Eagle3
dynamic-tree rejection sampling": ``cpp/tensorrt_llm/kernels/speculativeDecoding/
dynamicTreeKernels.cu``, op ``verify_dynamic_tree_rejection_out_op`` in
``cpp/tensorrt_llm/thop/dynamicTreeOp.cpp``, called from ``tensorrt_llm/_torch/speculative/
dynamic_tree_ops.py``). The op is CUDA only (it checks ``is_cuda`` on every input) and
TensorRT-LLM is not installable here, so this adapter carries the layout and the kernel's walk in
torch; where TensorRT-LLM and a GPU are present, the op itself can be put behind the same layout.

Layout (N = nodes with the root, D = depth): ``draft_tokens`` [B, N-1] (node n >= 1's token at
n-1; the root has none), ``target_probs`` [B, N, V] float32 (row n: the target's law after node
n), ``retrieve_next_token`` / ``retrieve_next_sibling`` [B, N] (first child, next sibling, -1
none), ``tree_valid`` [B]; outputs ``accept_index`` [B, D+1], ``accept_token`` [B, D+1] (the
accepted drafts then the bonus or correction token) and ``accept_token_num`` [B].

The walk (target-only; float32): at the last accepted node, one coin u per depth; its children are
tried in sibling order with ``prob_acc += q(x)`` (q: that node's target row) and the first with
``u <= prob_acc`` is accepted (non-strict); a rejected sibling's token is recorded in a list of
``MAX_TRIED = 32`` per level. When every child is rejected, the correction is drawn from q with
the recorded tokens zeroed, against a mass u2 * R with R = 1 - prob_acc: the first token with mass
whose inclusive prefix exceeds it (strict), the last token of positive mass if none does, and
the whole row q if R <= 1e-10. At a leaf (or depth D) the bonus is drawn from q the same way.
With more than 32 siblings at one node, the 33rd and later rejected siblings stay in the residual
while R already excludes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.adapters.sglang_tree import sglang_tree_layout
from exactcheck.contracts.tree_verifier import tree_depths

__all__ = ["trtllm_tree_layout", "dynamic_tree_rejection_walk", "TrtllmDynamicTree", "MAX_TRIED"]

MAX_TRIED = 32  # kMaxTriedPerLevel


def trtllm_tree_layout(tokens: torch.Tensor, parents: torch.Tensor):
    """(draft_tokens [B, N-1], retrieve_next_token [B, N], retrieve_next_sibling [B, N]) int64."""
    _, _, next_token, next_sibling = sglang_tree_layout(tokens, parents)
    return tokens[:, 1:].clone(), next_token, next_sibling


def _draw(rows: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """The first token with positive value whose inclusive prefix exceeds ``mass`` [B] (strict),
    else the last token of positive value (float32, as the kernel scans)."""
    prefix = rows.cumsum(1)
    above = (prefix > mass[:, None]) & (rows > 0)
    first = above.int().argmax(1)
    positive = rows > 0
    last = rows.shape[1] - 1 - positive.flip(1).int().argmax(1)
    return torch.where(above.any(1), first, last)


def dynamic_tree_rejection_walk(draft_tokens, target_probs, next_token, next_sibling, depth: int,
                                generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accept_index, accept_token, accept_token_num) of the post-#15098 kernel's walk."""
    b, n, vocab = target_probs.shape
    device = target_probs.device
    q_all = target_probs.float()
    rows = torch.arange(b, device=device)
    accept_index = torch.zeros((b, depth + 1), dtype=torch.int64, device=device)
    accept_token = torch.zeros((b, depth + 1), dtype=torch.int64, device=device)
    accepted = torch.zeros(b, dtype=torch.int64, device=device)
    last = torch.zeros(b, dtype=torch.int64, device=device)
    live = torch.ones(b, dtype=torch.bool, device=device)
    node_token = torch.cat([torch.zeros_like(draft_tokens[:, :1]), draft_tokens], 1)
    for level in range(depth + 1):
        q = q_all[rows, last]
        child = next_token[rows, last] if level < depth else torch.full_like(last, -1)
        leaf = live & (child < 0)
        u = torch.rand(b, dtype=torch.float32, generator=generator, device=device)
        # a leaf or depth D: the bonus from q with mass u
        bonus = _draw(q, u)
        accept_token[rows, accepted] = torch.where(leaf, bonus, accept_token[rows, accepted])
        trying = live & ~leaf
        prob_acc = torch.zeros(b, dtype=torch.float32, device=device)
        tried = torch.zeros((b, vocab), dtype=torch.bool, device=device)
        tried_count = torch.zeros(b, dtype=torch.int64, device=device)
        found = torch.full_like(last, -1)
        cur = child.clone()
        for _ in range(n):
            active = trying & (found < 0) & (cur >= 0)
            if not active.any():
                break
            x = node_token[rows, cur.clamp(min=0)]
            prob_acc = torch.where(active, prob_acc + q.gather(1, x[:, None])[:, 0], prob_acc)
            take = active & (u <= prob_acc)
            found = torch.where(take, cur, found)
            rejected = active & ~take
            record = rejected & (tried_count < MAX_TRIED)
            tried[rows[record], x[record]] = True
            tried_count = tried_count + record.long()
            cur = torch.where(rejected, next_sibling[rows, cur.clamp(min=0)], cur)
        ok = trying & (found >= 0)
        accept_token[rows, accepted] = torch.where(ok, node_token[rows, found.clamp(min=0)], accept_token[rows, accepted])
        all_rejected = trying & (found < 0)
        u2 = torch.rand(b, dtype=torch.float32, generator=generator, device=device)
        residual = q.masked_fill(tried, 0.0)
        r = 1.0 - prob_acc
        tiny = r <= 1e-10
        correction = torch.where(tiny, _draw(q, u2), _draw(residual, u2 * r))
        accept_token[rows, accepted] = torch.where(all_rejected, correction, accept_token[rows, accepted])
        accepted = accepted + ok.long()
        accept_index[rows, accepted] = torch.where(ok, found.clamp(min=0), accept_index[rows, accepted])
        last = torch.where(ok, found.clamp(min=0), last)
        live = ok
        if not live.any():
            break
    return accept_index, accept_token, accepted


@dataclass(frozen=True)
class TrtllmDynamicTree:
    """TensorRT-LLM's dynamic-tree rejection sampling (post-#15098) behind the tree contract:
    top-k siblings, no draft rows, the kernel's walk in torch."""

    sibling_sampling = "top_k"
    takes_draft_probs = False

    @property
    def __name__(self) -> str:
        return "tensorrt_llm verify_dynamic_tree_rejection (walk in torch)"

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        depth = int(tree_depths(parents).max())
        drafts, next_token, next_sibling = trtllm_tree_layout(tokens, parents)
        _, accept_token, accepted = dynamic_tree_rejection_walk(drafts, target_probs, next_token, next_sibling,
                                                                depth, generator)
        keep = torch.arange(depth + 1, device=tokens.device)[None] <= accepted[:, None]
        return torch.where(keep, accept_token, torch.full_like(accept_token, -1))
