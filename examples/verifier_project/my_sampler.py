"""A small project's own speculative-sampling verifier (the rejection-sampler layout of vLLM):
``verify(target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k], generator)
-> [B, k+1]`` accepted drafts, one correction or bonus token, then -1 padding.

``correct_verifier`` is written from the paper (Leviathan et al., 2023). ``buggy_verifier`` has
a planted defect: after a rejection it draws the correction from p instead of from the residual
max(0, p - q) -- a mistake that keeps every emitted token plausible and is invisible to a
token-set check.
"""
import torch


def _verify(target_probs, draft_probs, draft_tokens, generator, residual: bool):
    batch, k = draft_tokens.shape
    p = target_probs.double()
    q = draft_probs.double()
    p_draft = p[:, :k].gather(2, draft_tokens[..., None])[..., 0]
    q_draft = q.gather(2, draft_tokens[..., None])[..., 0]
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=p.device)
    accepted = u * q_draft < p_draft
    n = (accepted.cumprod(1)).sum(1)  # drafts accepted before the first rejection
    rows = p[torch.arange(batch), n]  # the bonus row p_k when every draft was accepted
    rejected = n < k
    if residual and rejected.any():
        q_n = q[torch.arange(batch), n.clamp(max=k - 1)]
        diff = (rows - q_n).clamp(min=0)
        mass = diff.sum(1, keepdim=True)
        use = rejected[:, None] & (mass > 0)
        rows = torch.where(use, diff / mass.clamp(min=1e-300), rows)
    last = torch.multinomial(rows, 1, generator=generator)[:, 0]
    out = torch.full((batch, k + 1), -1, dtype=torch.int64, device=p.device)
    positions = torch.arange(k + 1, device=p.device)
    keep = positions[None, :k] < n[:, None]
    out[:, :k] = torch.where(keep, draft_tokens, out[:, :k])
    out.scatter_(1, n[:, None], last[:, None])
    return out


def correct_verifier(target_probs, draft_probs, draft_tokens, generator):
    return _verify(target_probs, draft_probs, draft_tokens, generator, residual=True)


def buggy_verifier(target_probs, draft_probs, draft_tokens, generator):
    return _verify(target_probs, draft_probs, draft_tokens, generator, residual=False)
