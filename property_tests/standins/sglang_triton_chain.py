"""A stand-in for SGLang 0.5.23's ``chain_speculative_sampling_triton`` (token-wise mode), in
pure torch, vectorised over the batch, with the kernel's semantics
(``sglang/kernels/ops/speculative/reject_sampling.py``):

- draft j (node j + 1 of the chain) is accepted while ``q > 0 and q <= 1 and coin_j * q < p``
  (float32), p and q the target's and draft's rows at the last accepted node;
- then the final token: from p at the last row if every draft was accepted, else from
  max(p - q, 0) at the rejected row, by a CDF walk: the first token whose running sum exceeds
  ``coin_final * sum``; ``VOCAB_SIZE - 1`` if none does;
- ``predicts[retrive_index[b, j]]`` gets the token accepted after node j and the final token,
  ``accept_index[b, :n + 1]`` the accepted nodes' slots, ``accept_token_num[b]`` = n.

Block verification is not modelled here (CI's engines step runs the real kernel).
"""
from __future__ import annotations

import torch


def chain_speculative_sampling_triton(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                      retrive_next_token, retrive_next_sibling, uniform_samples,
                                      uniform_samples_for_final_sampling, target_probs, draft_probs,
                                      threshold_single, threshold_acc, deterministic, *, block_verification=False):
    if block_verification:
        raise NotImplementedError("the stand-in models the token-wise mode only")
    batch, nodes = candidates.shape
    k = nodes - 1
    drafts = candidates[:, 1:].to(torch.int64)
    p = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    q = draft_probs.gather(2, drafts[..., None])[..., 0]
    accept = (q > 0) & (q <= 1) & (uniform_samples[:, :k] * q < p)
    n = accept.to(torch.int64).cumprod(1).sum(1)
    rows = torch.arange(batch, device=candidates.device)
    p_row = target_probs[rows, n]
    q_row = draft_probs[rows, n.clamp(max=k - 1)]
    q_row = torch.where((q_row >= 0) & (q_row <= 1), q_row, torch.zeros_like(q_row))
    residual = torch.where((n == k)[:, None], p_row, (p_row - q_row).clamp(min=0))
    cdf = residual.cumsum(-1)
    target_u = uniform_samples_for_final_sampling * residual.sum(-1)
    over = cdf > target_u[:, None]
    final = torch.where(over.any(-1), over.to(torch.int64).argmax(-1), torch.full_like(n, residual.shape[-1] - 1))
    position = torch.arange(nodes, device=candidates.device)[None]
    slots = retrive_index.to(torch.int64)
    accept_index.copy_(torch.where(position <= n[:, None], slots, torch.full_like(slots, -1)).to(accept_index.dtype))
    accept_token_num.copy_(n.to(accept_token_num.dtype))
    # the token after node j is draft j + 1 for j < n, the final token at j = n
    following = torch.cat([drafts, torch.zeros_like(drafts[:, :1])], 1)
    following.scatter_(1, n[:, None], final[:, None])
    flat = predicts.view(-1)
    keep = position <= n[:, None]
    flat[slots[keep]] = following[keep].to(flat.dtype)
