"""The reference verifier: exact, vectorised speculative sampling (Leviathan et al., 2023).

For draft position i with target row p_i and draft row q_i, draft token x is accepted with
probability min(1, p_i(x) / q_i(x)): a float64 uniform u in [0, 1) accepts when
``u * q_i(x) < p_i(x)``. The strict inequality means a token with p_i(x) = 0 is never accepted,
whatever u is (u = 0 included). At the first rejection, at position n, one token is drawn from the
residual max(0, p_n - q_n), normalised; after k acceptances the bonus token is drawn from p_k.

Invalid inputs: a NaN, infinite or negative probability among the entries it reads (the draft
tokens' p and q, the row it samples from, which covers an all-zero row) raises ValueError, and
so does a draft token whose draft probability is 0 (it cannot have been proposed).

Zero residual: a rejection at n with max(0, p_n - q_n) summing to 0 can only happen when p_n and
q_n agree up to rounding (two normalised rows with p <= q everywhere are equal). The reference
then draws the correction from p_n itself, the limit of the residual law as q_n -> p_n; it never
returns an out-of-vocabulary id or NaN.

Sampling from a row is by inverse CDF on float64 cumulative sums: token = #{j : cdf_j <= u}. u = 0
picks the first token of positive mass, and a u beyond the last cumulative value (rounding) is
clamped to the last token of positive mass, so a zero-mass token is never drawn.

The class is split into one method per step so that each mutant in ``exactcheck.step.mutants``
overrides exactly one of them.
"""
from __future__ import annotations

import math

import torch

from exactcheck.contracts.verifier import PADDING
from exactcheck.contracts.sampling import sample_rows

__all__ = ["ReferenceVerifier", "reference_verifier", "row_at", "at_drafts", "final_pq"]


def at_drafts(rows: torch.Tensor, draft_tokens: torch.Tensor) -> torch.Tensor:
    """``rows[b, i, draft_tokens[b, i]]`` for i < k: each row's probability of its draft token."""
    batch, positions, vocab = rows.shape
    k = draft_tokens.shape[1]
    row = torch.arange(batch * positions, device=rows.device).view(batch, positions)[:, :k]
    return rows.reshape(-1).take(torch.add(draft_tokens, row, alpha=vocab))


def row_at(rows: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``rows[b, position[b]]`` for ``rows`` [B, P, V]: the row at each trial's position."""
    batch, positions, vocab = rows.shape
    flat = torch.add(position, torch.arange(batch, device=position.device), alpha=positions)
    return rows.reshape(batch * positions, vocab).index_select(0, flat)


def _uniforms(shape: tuple[int, ...], generator: torch.Generator, device: torch.device,
              row_generators=None) -> torch.Tensor:
    """float64 uniforms in [0, 1); rows with their own generator draw from it."""
    u = torch.rand(*shape, dtype=torch.float64, generator=generator, device=device)
    for row, gen in enumerate(row_generators or ()):
        if gen is not None:
            u[row] = torch.rand(shape[1:], dtype=torch.float64, generator=gen, device=device)
    return u


def final_pq(target: torch.Tensor, draft_probs: torch.Tensor,
             n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_n, q_n) per trial, in the inputs' dtype: the target and draft rows at the stop
    position n, with q_n = 0 at the bonus position n = k (so max(0, p - q) is then p_k)."""
    k = draft_probs.shape[1]
    return row_at(target, n), row_at(draft_probs, n.clamp(max=k - 1)).mul_((n < k)[:, None])


def smallest_probability(values: torch.Tensor, name: str) -> float:
    """The smallest of the entries actually read, after refusing NaN, infinite or negative ones."""
    low, high = (float(v) for v in torch.aminmax(values))  # one pass; a NaN fails both tests
    if not (low >= 0 and high < math.inf):
        raise ValueError(f"{name} holds a NaN, infinite or negative probability where the "
                         "verifier reads it")
    return low


def checked_probabilities(values: torch.Tensor, name: str) -> torch.Tensor:
    """``values``, after refusing NaN, infinite or negative probabilities among them."""
    smallest_probability(values, name)
    return values


class ReferenceVerifier:
    """Exact speculative verification step; call it as a ``Verifier``. It declares its rule
    (``exactcheck.rules``: token-wise rejection sampling), so its conformance laws are judged by
    that rule alone; so do the mutants, which subclass it."""

    name = "reference"
    acceptance_rule = "token-wise"

    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor,
                 draft_tokens: torch.Tensor, generator: torch.Generator,
                 row_generators: list[torch.Generator | None] | None = None) -> torch.Tensor:
        """``row_generators`` (optional, vLLM-style): one generator or None per row; a seeded
        row draws all its random numbers from its own generator, the others from ``generator``."""
        batch, k = draft_tokens.shape
        device = draft_tokens.device
        target = self.target_rows(target_probs)
        u_accept = self.acceptance_uniforms(batch, k, generator, device, row_generators)
        p_draft = checked_probabilities(at_drafts(target, draft_tokens).double(), "target_probs")
        q_draft = at_drafts(draft_probs, draft_tokens).double()
        if smallest_probability(q_draft, "draft_probs") == 0:
            raise ValueError("a draft token has draft probability 0: it cannot have been proposed")
        accepted = self.accept(u_accept, p_draft, q_draft)
        n = self.accepted_length(accepted)
        rows = self.final_rows(target, draft_probs, n)
        u_final = self.final_uniforms(batch, generator, device, u_accept, n, row_generators)
        last = self.sample_final(rows, u_final)
        return self.assemble(draft_tokens, n, last)

    def target_rows(self, target_probs: torch.Tensor) -> torch.Tensor:
        """The target rows for positions 0..k, as the verifier reads them."""
        return target_probs

    def acceptance_uniforms(self, batch: int, k: int, generator: torch.Generator,
                            device: torch.device, row_generators=None) -> torch.Tensor:
        return _uniforms((batch, k), generator, device, row_generators)

    def accept(self, u: torch.Tensor, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Accept with probability min(1, p/q); never when p = 0."""
        return u * q < p

    def accepted_length(self, accepted: torch.Tensor) -> torch.Tensor:
        """Number of drafts accepted before the first rejection."""
        return accepted.to(torch.int64).cumprod(1).sum(1)

    def final_rows(self, target: torch.Tensor, draft_probs: torch.Tensor,
                   n: torch.Tensor) -> torch.Tensor:
        """Normalised float64 law of the token after the accepted drafts: the residual
        max(0, p_n - q_n) after a rejection at n < k, the target row p_k after k acceptances."""
        p, q = final_pq(target, draft_probs, n)
        p, q = checked_probabilities(p, "target_probs"), checked_probabilities(q, "draft_probs")
        residual = torch.sub(p.double(), q).clamp_(min=0)  # q promoted: exact for float32 p, q
        mass = residual.sum(1, keepdim=True)
        empty = mass[:, 0] <= 0
        if empty.any():  # p_n == q_n up to rounding: the residual's limit is p_n
            residual[empty] = p[empty].double()
            mass[empty] = residual[empty].sum(1, keepdim=True)
            if bool((mass <= 0).any()):
                raise ValueError("target_probs has an all-zero row where the verifier samples")
        return residual.div_(mass)

    def final_uniforms(self, batch: int, generator: torch.Generator, device: torch.device,
                       u_accept: torch.Tensor, n: torch.Tensor, row_generators=None) -> torch.Tensor:
        return _uniforms((batch,), generator, device, row_generators)

    def sample_final(self, rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """One token per row by inverse CDF (never a zero-mass token)."""
        return sample_rows(rows, u)

    def assemble(self, draft_tokens: torch.Tensor, n: torch.Tensor,
                 last: torch.Tensor) -> torch.Tensor:
        """Accepted drafts, then the final token, then -1 padding."""
        batch, k = draft_tokens.shape
        positions = torch.arange(k + 1, device=draft_tokens.device)
        out = torch.nn.functional.pad(draft_tokens, (0, 1), value=PADDING)
        out.masked_fill_(positions >= n[:, None], PADDING)
        return out.scatter_(1, n[:, None], last[:, None])


reference_verifier = ReferenceVerifier()
