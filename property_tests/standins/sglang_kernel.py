"""A stand-in for sgl-kernel's ``tree_speculative_sampling_target_only`` (CUDA only), in pure
torch, with its semantics on trees given by ``retrive_next_token`` / ``retrive_next_sibling``:

- walk from the root; at each level try the current node's children in sibling order: child
  token x is accepted when ``coin <= prob_acc / threshold_acc`` or ``p(x) >= threshold_single``,
  where ``prob_acc`` accumulates the target probabilities of the siblings tried at this level and
  ``coin`` is the accepted parent's uniform; a tried sibling's draft probability is set to its
  target probability (so the final residual excludes it);
- after the walk, one token from ``max(p - draft_probs, 0)`` at the last accepted node (``p``
  alone after a full chain), by inverse CDF at ``coin * sum``: the first index whose running sum
  exceeds it among tokens of positive mass, else the last token of positive mass;
- ``predicts[slot of the accepted parent] = child token``; the final token goes to the last
  accepted node's slot.
"""
from __future__ import annotations

import torch


def tree_speculative_sampling_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index,
                                          retrive_next_token, retrive_next_sibling, uniform_samples,
                                          uniform_samples_for_final_sampling, target_probs, draft_probs,
                                          threshold_single=1.0, threshold_acc=1.0, deterministic=True):
    batch, nodes = candidates.shape
    speculative = accept_index.shape[1]
    threshold_acc = max(threshold_acc, 1e-9)
    if bool((retrive_next_sibling == -1).all()) and speculative == nodes:
        return _chain(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples,
                      uniform_samples_for_final_sampling, target_probs, draft_probs, threshold_single, threshold_acc)
    for b in range(batch):
        prob_acc = 0.0
        row = 0  # node whose target row is in use
        coin = float(uniform_samples[b, 0])
        last = int(retrive_index[b, 0])
        accept_index[b, 0] = last
        accepted = 0
        current = 0
        for _ in range(1, speculative):
            current = int(retrive_next_token[b, current])
            while current != -1:
                token = int(candidates[b, current])
                single = float(target_probs[b, row, token])
                prob_acc += single
                if coin <= prob_acc / threshold_acc or single >= threshold_single:
                    prob_acc = 0.0
                    row = current
                    coin = float(uniform_samples[b, current])
                    predicts[last] = token
                    accepted += 1
                    accept_index[b, accepted] = int(retrive_index[b, current])
                    last = int(retrive_index[b, current])
                    break
                draft_probs[b, row, token] = target_probs[b, row, token]
                current = int(retrive_next_sibling[b, current])
            if current == -1:
                break
        accept_token_num[b] = accepted
        p = target_probs[b, row]
        residual = p if accepted == speculative - 1 else (p - draft_probs[b, row]).clamp(min=0)
        u = float(uniform_samples_for_final_sampling[b]) * float(residual.sum())
        running = torch.cumsum(residual, 0)
        above = ((running > u) & (residual > 0)).nonzero()
        if above.numel():
            sampled = int(above[0, 0])
        else:
            positive = (residual > 0).nonzero()
            sampled = int(positive[-1, 0]) if positive.numel() else residual.numel() - 1
        predicts[last] = sampled


def _chain(predicts, accept_index, accept_token_num, candidates, retrive_index, uniform_samples, final_samples,
           target_probs, draft_probs, threshold_single, threshold_acc):
    """The same walk, vectorised over rows, when every node has one child (node j's child is
    j + 1, as ``SglangChainVerifier`` lays a chain out)."""
    batch, nodes = candidates.shape
    k = nodes - 1
    drafts = candidates[:, 1:]
    p_draft = target_probs[:, :k].gather(2, drafts[..., None])[..., 0]
    accept = (uniform_samples[:, :k] <= p_draft / threshold_acc) | (p_draft >= threshold_single)
    n = accept.to(torch.int64).cumprod(1).sum(1)
    rows = torch.arange(batch, device=candidates.device)
    p = target_probs[rows, n]
    residual = p.clone()
    rejected = n < k
    if bool(rejected.any()):  # the tried draft's draft probability is set to its target probability
        tried = drafts[rows[rejected], n[rejected]]
        draft_probs[rows[rejected], n[rejected], tried] = target_probs[rows[rejected], n[rejected], tried]
        residual[rejected] = (p[rejected] - draft_probs[rows[rejected], n[rejected]]).clamp(min=0)
    u = final_samples * residual.sum(1)
    running = residual.cumsum(1)
    hit = (running > u[:, None]) & (residual > 0)
    positive = residual > 0
    vocab = residual.shape[1]
    first_hit = torch.where(hit.any(1), hit.to(torch.int64).argmax(1), torch.full_like(n, -1))
    last_positive = torch.where(positive.any(1), vocab - 1 - positive.flip(1).to(torch.int64).argmax(1),
                                torch.full_like(n, vocab - 1))
    sampled = torch.where(first_hit >= 0, first_hit, last_positive)
    position = torch.arange(nodes, device=candidates.device)[None]
    accept_index.copy_(torch.where(position <= n[:, None], retrive_index, torch.full_like(retrive_index, -1))
                       .to(accept_index.dtype))
    accept_token_num.copy_(n.to(accept_token_num.dtype))
    values = torch.cat([drafts, drafts[:, :1]], 1).clone()
    values.scatter_(1, n[:, None], sampled[:, None])
    written = position <= n[:, None]
    predicts[retrive_index[written]] = values[written].to(predicts.dtype)
