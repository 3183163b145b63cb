"""Exact verifiers that follow other rules than token-wise rejection sampling, written
differently from each other: three block verifiers (Sun et al. 2024, as vLLM 0.33 and SGLang ship
it) and a second target-only one. None declares its rule (``acceptance_rule``): exactcheck must
find no exactness defect in any of them, and must say which registered rule each one fits.

- ``block_vectorised``: every prefix weight and stop probability at once, float64, u <= h with
  h = 0 excluded (so u = 0 never stops past a forbidden draft), the correction by inverse CDF;
- ``block_log_space``: vLLM's form: cumulative log weights in float32, uniforms clamped to at
  least 2^-31, u <= h, the correction by Gumbel-max over the log residual;
- ``block_lazy``: SGLang's scan from the last position back, one uniform drawn per position as it
  goes, strict u < h, the correction by an exponential race;
- ``target_only_mirrored``: SGLang's target-only rule with the mirrored uniform (u = 1 - rand,
  accept when u <= p(d), u in (0, 1]), the correction by inverse CDF of p with the rejected
  draft removed.
"""
from __future__ import annotations

import torch

from exactcheck.corpus.verifiers import _assemble, _at  # the output layout, shared by the corpus

__all__ = ["OTHER_RULE_VERIFIERS", "FITS"]


def _weights(p_at: torch.Tensor, q_at: torch.Tensor) -> torch.Tensor:
    """Prefix weights w_0..w_k (float64): w_0 = 1, w_{j+1} = min(1, w_j p_j(d_j) / q_j(d_j))."""
    ratio = torch.where(q_at > 0, p_at / q_at.clamp(min=1e-300), torch.zeros_like(p_at))
    w = [torch.ones_like(p_at[:, 0])]
    for j in range(p_at.shape[1]):
        w.append(torch.minimum(w[-1] * ratio[:, j], torch.ones_like(w[-1])))
    return torch.stack(w, 1)


def _stops(p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(stop probabilities h_0..h_k [B, k+1], residual rows max(w_j p_j - q_j, 0) [B, k, V])."""
    k = q.shape[1]
    residual = (w[:, :k, None] * p[:, :k] - q).clamp(min=0)
    mass = residual.sum(-1)
    denominator = mass + 1 - w[:, :k]
    h = torch.where(denominator > 0, mass / denominator.clamp(min=1e-300), torch.ones_like(mass))
    h = torch.cat([h, w[:, k:]], 1)
    h[:, 0] = 1.0
    return h, residual


def _final(p: torch.Tensor, residual: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """The law of the token after tau accepted drafts: the normalised residual at tau (p itself if
    it is all zero, a case of probability 0), or p_k at tau = k."""
    k = residual.shape[1]
    rows = torch.arange(p.shape[0], device=p.device)
    at = p[rows, tau]
    r = torch.where((tau < k)[:, None], residual[rows, tau.clamp(max=k - 1)], at)
    r = torch.where((r.sum(1) > 0)[:, None], r, at)
    return r / r.sum(1, keepdim=True)


def block_vectorised(target_probs, draft_probs, draft_tokens, generator):
    p, q = target_probs.double(), draft_probs.double()
    batch, k = draft_tokens.shape
    w = _weights(_at(p, draft_tokens), _at(q, draft_tokens))
    h, residual = _stops(p, q, w)
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    passes = torch.cat([torch.ones_like(u[:, :1], dtype=torch.bool), (u <= h[:, 1:]) & (h[:, 1:] > 0)], 1)
    tau = (passes * torch.arange(k + 1, device=u.device)).max(1).values
    rows = _final(p, residual, tau)
    v = torch.rand(batch, dtype=torch.float64, generator=generator, device=u.device)
    cdf = rows.cumsum(1)
    last = (cdf <= (v * cdf[:, -1])[:, None]).sum(1)
    positive_last = rows.shape[1] - 1 - (rows.flip(1) > 0).to(torch.int8).argmax(1)
    return _assemble(draft_tokens, tau, torch.minimum(last, positive_last))


def block_log_space(target_probs, draft_probs, draft_tokens, generator):
    """Log weights in float32 as vLLM's kernel keeps them; u >= 2^-31 (never 0), u <= h."""
    batch, k = draft_tokens.shape
    logp = target_probs.float().clamp(min=0).log()
    logq = draft_probs.float().clamp(min=0).log()
    step = (_at(logp, draft_tokens) - _at(logq, draft_tokens)).nan_to_num(nan=-torch.inf)
    cum = [torch.zeros(batch, device=draft_tokens.device)]
    for j in range(k):
        cum.append(torch.clamp(cum[-1] + step[:, j], max=0.0))
    w = torch.stack(cum, 1).exp().double()
    p, q = target_probs.double(), draft_probs.double()
    h, residual = _stops(p, q, w)
    u = torch.rand(batch, k, generator=generator, device=draft_tokens.device).clamp(min=2.0 ** -31).double()
    passes = torch.cat([torch.ones_like(u[:, :1], dtype=torch.bool), u <= h[:, 1:]], 1)
    tau = (passes * torch.arange(k + 1, device=u.device)).max(1).values
    rows = _final(p, residual, tau).float()
    gumbel = -torch.log(-torch.log(torch.rand(rows.shape, generator=generator, device=u.device).clamp(min=1e-38)))
    last = torch.where(rows > 0, rows.log() + gumbel, torch.full_like(rows, -torch.inf)).argmax(1)
    return _assemble(draft_tokens, tau, last)


def block_lazy(target_probs, draft_probs, draft_tokens, generator):
    """From the last position back, one uniform a position, strict u < h: the first to pass is tau."""
    p, q = target_probs.double(), draft_probs.double()
    batch, k = draft_tokens.shape
    w = _weights(_at(p, draft_tokens), _at(q, draft_tokens))
    h, residual = _stops(p, q, w)
    tau = torch.zeros(batch, dtype=torch.int64, device=draft_tokens.device)
    open_ = torch.ones(batch, dtype=torch.bool, device=draft_tokens.device)
    for j in range(k, 0, -1):
        u = torch.rand(batch, dtype=torch.float64, generator=generator, device=draft_tokens.device)
        hit = open_ & (u < h[:, j])
        tau = torch.where(hit, j, tau)
        open_ &= ~hit
    rows = _final(p, residual, tau)
    race = torch.empty_like(rows).exponential_(generator=generator)
    last = torch.where(rows > 0, rows / race, torch.full_like(rows, -1.0)).argmax(1)
    return _assemble(draft_tokens, tau, last)


def target_only_mirrored(target_probs, draft_probs, draft_tokens, generator):
    """Accept d with probability p(d) (u = 1 - rand in (0, 1], u <= p(d), so p = 0 never passes);
    after a rejection, p without the rejected draft by inverse CDF."""
    p = target_probs.double()
    batch, k = draft_tokens.shape
    u = 1.0 - torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    n = (u <= _at(p, draft_tokens)).to(torch.int64).cumprod(1).sum(1)
    rows_index = torch.arange(batch, device=p.device)
    rows = p[rows_index, n].clone()
    rejected = n < k
    rows[rejected, draft_tokens[rejected, n[rejected]]] = 0.0
    rows = torch.where((rows.sum(1) > 0)[:, None], rows, p[rows_index, n])
    v = 1.0 - torch.rand(batch, dtype=torch.float64, generator=generator, device=p.device)
    cdf = rows.cumsum(1)
    last = torch.searchsorted(cdf, (v * cdf[:, -1])[:, None])[:, 0]
    positive_last = rows.shape[1] - 1 - (rows.flip(1) > 0).to(torch.int8).argmax(1)
    return _assemble(draft_tokens, n, torch.minimum(last, positive_last))


OTHER_RULE_VERIFIERS = {f.__name__: f for f in (block_vectorised, block_log_space, block_lazy,
                                                 target_only_mirrored)}
"""Name -> exact verifier of another rule; importable as ``exactcheck.corpus.other_rules:NAME``."""

FITS = {"block_vectorised": "block", "block_log_space": "block", "block_lazy": "block",
        "target_only_mirrored": "target-only"}
"""The registered rule each one follows (the audit must name it)."""
