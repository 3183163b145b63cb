"""Exact inverse-CDF sampling from float64 cumulative tables (used by the driver and reference)."""
from __future__ import annotations

import torch

__all__ = ["inverse_cdf", "sample_rows"]


def inverse_cdf(cdf: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token = #{j : cdf_j <= u} for nondecreasing float64 ``cdf`` ([V] or [B, V]) and uniforms
    ``u`` [B] in [0, 1). u = 0 gives the first token of positive mass; a u at or beyond the
    rounded total is clamped to the last token of positive mass, so zero-mass tokens are never
    returned."""
    batched = cdf.dim() == 2
    token = torch.searchsorted(cdf, u[:, None] if batched else u, right=True)
    token = token[:, 0] if batched else token
    vocab = cdf.shape[-1]
    overflow = token >= vocab
    if overflow.any():
        total = cdf[..., -1:]
        if batched:
            token[overflow] = (cdf[overflow] < total[overflow]).sum(1)
        else:
            token[overflow] = int((cdf < total).sum())
    return token


def sample_rows(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of normalised float64 ``rows`` [B, V], by inverse CDF with ``u`` [B]."""
    return inverse_cdf(rows.cumsum(1), u)
