"""The README's worked example: a token-wise rejection-sampling verifier (Leviathan et al., 2023)
in the step contract, and the same verifier with one planted bug.

    exactcheck audit examples.my_verifier:verifier --level quick         # run from the repository root
    exactcheck audit examples.my_verifier:buggy_verifier --level quick

``verifier`` is the README's block, byte for byte (property_tests/front_ends/test_readme_example.py checks
it and audits both). ``buggy_verifier`` differs in one line: after a rejection it draws the
correction from p_n instead of the residual max(p_n - q_n, 0), so a rejected draft can come back
as its own correction (the ``resample_from_target`` mutant of the selftest).
"""
import torch
import torch.nn.functional as F


def verifier(target_probs, draft_probs, draft_tokens, generator):
    B, k = draft_tokens.shape
    p, q = target_probs.double(), F.pad(draft_probs.double(), (0, 0, 0, 1))  # q_k = 0
    p_d = p[:, :k].gather(2, draft_tokens[..., None])[..., 0]  # p_i(d_i)
    q_d = q[:, :k].gather(2, draft_tokens[..., None])[..., 0]  # q_i(d_i)
    u = torch.rand(B, k, dtype=torch.float64, generator=generator, device=p.device)
    n = (u * q_d < p_d).long().cumprod(1).sum(1)  # drafts accepted before the first rejection
    rows = torch.arange(B, device=p.device)
    residual = (p[rows, n] - q[rows, n]).clamp(min=0)  # max(p_n - q_n, 0); p_k after k acceptances
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p[rows, n])  # p_n = q_n: p_n
    last = torch.multinomial(residual, 1, generator=generator)[:, 0]
    keep = torch.arange(k + 1, device=p.device) < n[:, None]
    out = torch.where(keep, F.pad(draft_tokens, (0, 1)), -1)  # accepted drafts, then -1 padding
    out[rows, n] = last  # the correction or bonus token
    return out


def buggy_verifier(target_probs, draft_probs, draft_tokens, generator):
    B, k = draft_tokens.shape
    p, q = target_probs.double(), F.pad(draft_probs.double(), (0, 0, 0, 1))  # q_k = 0
    p_d = p[:, :k].gather(2, draft_tokens[..., None])[..., 0]  # p_i(d_i)
    q_d = q[:, :k].gather(2, draft_tokens[..., None])[..., 0]  # q_i(d_i)
    u = torch.rand(B, k, dtype=torch.float64, generator=generator, device=p.device)
    n = (u * q_d < p_d).long().cumprod(1).sum(1)  # drafts accepted before the first rejection
    rows = torch.arange(B, device=p.device)
    residual = p[rows, n]  # BUG: the correction drawn from p_n, not max(p_n - q_n, 0)
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, p[rows, n])  # p_n = q_n: p_n
    last = torch.multinomial(residual, 1, generator=generator)[:, 0]
    keep = torch.arange(k + 1, device=p.device) < n[:, None]
    out = torch.where(keep, F.pad(draft_tokens, (0, 1)), -1)  # accepted drafts, then -1 padding
    out[rows, n] = last  # the correction or bonus token
    return out
