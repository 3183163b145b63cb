"""Exact inverse-CDF sampling from float64 cumulative tables (used by the driver and reference)."""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["inverse_cdf", "sample_rows", "AliasTable", "CdfTable", "state_sampler", "ALIAS_MAX_VOCAB"]

# Walker tables are built in O(S V^2); above this vocabulary the driver samples by inverse CDF
ALIAS_MAX_VOCAB = 64


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


class AliasTable:
    """Walker's alias tables for a table of laws ``[S, V]``: one token per state in O(1) — a
    column j = floor(u V) and a coin frac(u V) < keep[s, j], else alias[s, j].

    Built in float64 for all states at once by Robin Hood pairing (Marsaglia et al. 2004): V - 1
    times, the poorest unfinished column keeps its mass and borrows the rest from the richest.
    Zero-mass tokens get keep = 0 and are never drawn. The law drawn matches the table up to the
    float64 rounding of the build (about 1e-15 per token)."""

    def __init__(self, law: torch.Tensor):
        law = law.double().cpu().numpy()
        states, vocab = law.shape
        scaled = law / law.sum(1, keepdims=True) * vocab
        keep = np.ones((states, vocab))
        alias = np.tile(np.arange(vocab), (states, 1))
        done = np.zeros((states, vocab), dtype=bool)
        rows = np.arange(states)
        for _ in range(vocab - 1):
            poor = np.where(done, np.inf, scaled).argmin(1)
            rich = np.where(done, -np.inf, scaled).argmax(1)
            keep[rows, poor] = np.clip(scaled[rows, poor], 0.0, 1.0)
            alias[rows, poor] = rich
            scaled[rows, rich] -= 1.0 - scaled[rows, poor]
            done[rows, poor] = True
        self.vocab = vocab
        self.keep = torch.from_numpy(keep).reshape(-1)
        self.alias = torch.from_numpy(alias).reshape(-1)

    def to(self, device: torch.device) -> "AliasTable":
        self.keep, self.alias = self.keep.to(device), self.alias.to(device)
        return self

    def sample(self, states: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        scaled = u * self.vocab
        column = scaled.to(torch.int64)
        cell = states * self.vocab + column
        return torch.where(scaled - column < self.keep.take(cell), column, self.alias.take(cell))


class CdfTable:
    """Per-state inverse-CDF sampling from a float64 cumulative table ``[S, V]``: built in
    O(S V) (a Walker table takes O(S V^2), hopeless at V = 32,000). Each draw binary-searches its
    state's row in place, reading about log2(V) entries instead of gathering the row: the token is
    the one ``inverse_cdf`` gives for that row, clamp included. Same law as ``AliasTable`` up to
    float64 rounding."""

    def __init__(self, law: torch.Tensor):
        law = law.double()
        self.vocab = law.shape[1]
        self.cdf = (law / law.sum(1, keepdim=True)).cumsum(1)

    def to(self, device: torch.device) -> "CdfTable":
        self.cdf = self.cdf.to(device)
        return self

    def sample(self, states: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        vocab = self.vocab
        flat = self.cdf.view(-1)
        row = states * vocab
        # #{j : cdf_j <= u} by bisection: lo counts entries known to be <= u, hi bounds the count
        lo = torch.zeros_like(states)
        hi = torch.full_like(states, vocab)
        for _ in range(vocab.bit_length()):
            mid = (lo + hi) >> 1
            below = flat.take(row + mid.clamp(max=vocab - 1)) <= u
            lo = torch.where(below & (lo < hi), mid + 1, lo)
            hi = torch.where(below, hi, mid)
        overflow = lo >= vocab  # u at or past the rounded total: inverse_cdf's clamp, on those rows
        if overflow.any():
            lo[overflow] = inverse_cdf(self.cdf.index_select(0, states[overflow]), u[overflow])
        return lo


def state_sampler(law: torch.Tensor) -> "AliasTable | CdfTable":
    """The sampler the driver draws draft tokens with: Walker tables (O(1) a draw) up to
    ``ALIAS_MAX_VOCAB`` tokens, where every built-in world lies, inverse CDF above."""
    return AliasTable(law) if law.shape[1] <= ALIAS_MAX_VOCAB else CdfTable(law)
