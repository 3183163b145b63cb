"""Reference verifiers of two more registered rules (``exactcheck.rules``), one method per step
like ``exactcheck.contracts.reference_verifier``, so each mutant of ``exactcheck.step.mutants`` that follows one
of these rules overrides exactly one step:

- ``BlockVerifier``: block verification (Sun et al. 2024; vLLM 0.33 ``rejection_sample_method =
  "block"``): prefix weights w_j, stop probabilities h_j, tau = the last j whose uniform passes
  h_j (u <= h_j and h_j > 0: a stop of probability 0 is never taken, u = 0 included), the
  correction from max(w_tau p_tau - q_tau, 0) normalised, the bonus from p_k;
- ``ThresholdVerifier``: SGLang's target-only verification with its thresholds (here at
  ``single`` 1 and ``acc`` 0.5, a lossy configuration): accept d if p(d) > 0 and
  (u < p(d) / acc or p(d) >= single); after a rejection, p without d.

They share the reference's input checks, uniforms, inverse-CDF draw and output layout.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.reference_verifier import ReferenceVerifier, at_drafts, checked_probabilities, row_at, smallest_probability

__all__ = ["BlockVerifier", "ThresholdVerifier"]


class BlockVerifier(ReferenceVerifier):
    """Exact block verification (declares ``block``)."""

    name = "block-reference"
    acceptance_rule = "block"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator, row_generators=None):
        batch, k = draft_tokens.shape
        device = draft_tokens.device
        target = self.target_rows(target_probs)
        p_draft = checked_probabilities(at_drafts(target, draft_tokens).double(), "target_probs")
        q_draft = at_drafts(draft_probs, draft_tokens).double()
        if smallest_probability(q_draft, "draft_probs") == 0:
            raise ValueError("a draft token has draft probability 0: it cannot have been proposed")
        u = self.acceptance_uniforms(batch, k, generator, device, row_generators)
        w = self.weights(p_draft, q_draft)
        h = self.stop_probabilities(target.double(), draft_probs.double(), w)
        n = self.stop_position(u, h, w)
        rows = self.block_final_rows(target, draft_probs, n, w)
        last = self.sample_final(rows, self.final_uniforms(batch, generator, device, u, n, row_generators))
        return self.assemble(draft_tokens, n, last)

    def weights(self, p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
        """w_0 = 1, w_{j+1} = min(1, w_j p_j(d_j) / q_j(d_j)) [B, k+1]."""
        w = [torch.ones_like(p_draft[:, 0])]
        for j in range(p_draft.shape[1]):
            w.append(torch.clamp(w[-1] * p_draft[:, j] / q_draft[:, j], max=1.0))
        return torch.stack(w, 1)

    def stop_probabilities(self, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """h_j = R_j / (R_j + 1 - w_j) with R_j = sum max(w_j p_j - q_j, 0) over row j (h = 1 where
        the denominator is 0), h_k = w_k; [B, k+1], h_0 unused."""
        k = q.shape[1]
        mass = (w[:, :k, None] * p[:, :k] - q).clamp(min=0).sum(-1)
        denominator = mass + 1 - w[:, :k]
        h = torch.where(denominator > 0, mass / denominator.clamp(min=1e-300), torch.ones_like(mass))
        return torch.cat([h, w[:, k:]], 1)

    def stop_position(self, u: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """tau = the last j >= 1 with u_j <= h_j and h_j > 0, else 0."""
        passes = (u <= h[:, 1:]) & (h[:, 1:] > 0)
        positions = torch.arange(1, h.shape[1], device=u.device)
        return torch.where(passes, positions, 0).max(1).values

    def block_final_rows(self, target: torch.Tensor, draft_probs: torch.Tensor, n: torch.Tensor,
                         w: torch.Tensor) -> torch.Tensor:
        """max(w_n p_n - q_n, 0) normalised after a stop at n < k (p_n if that is all zero, a case
        of probability 0), p_k at n = k."""
        k = draft_probs.shape[1]
        p = checked_probabilities(row_at(target, n), "target_probs").double()
        q = checked_probabilities(row_at(draft_probs, n.clamp(max=k - 1)), "draft_probs").double() * (n < k)[:, None]
        scale = torch.where(n < k, w.gather(1, n[:, None])[:, 0], torch.ones_like(w[:, 0]))
        residual = (scale[:, None] * p - q).clamp(min=0)
        mass = residual.sum(1, keepdim=True)
        residual = torch.where(mass > 0, residual, p)
        return residual / residual.sum(1, keepdim=True)


class ThresholdVerifier(ReferenceVerifier):
    """SGLang's thresholds on a chain, lossy by design at acc = 0.5 (declares
    ``sglang-threshold:single=1,acc=0.5``)."""

    name = "threshold-reference"
    single, acc = 1.0, 0.5
    acceptance_rule = "sglang-threshold:single=1,acc=0.5"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator, row_generators=None):
        batch, k = draft_tokens.shape
        device = draft_tokens.device
        target = self.target_rows(target_probs)
        u = self.acceptance_uniforms(batch, k, generator, device, row_generators)
        p_draft = checked_probabilities(at_drafts(target, draft_tokens).double(), "target_probs")
        n = self.accepted_length(self.accept(u, p_draft, None))
        rows = self.rows_without_draft(target, draft_tokens, n)
        last = self.sample_final(rows, self.final_uniforms(batch, generator, device, u, n, row_generators))
        return self.assemble(draft_tokens, n, last)

    def accept(self, u, p, q):
        return (p > 0) & ((u < p / self.acc) | (p >= self.single))

    def rows_without_draft(self, target, draft_tokens, n):
        """p_n without the rejected draft d_n, normalised (p_n if nothing is left); p_k after k
        acceptances."""
        k = draft_tokens.shape[1]
        p = checked_probabilities(row_at(target, n), "target_probs").double()
        rows = p.clone()
        rejected = (n < k).nonzero()[:, 0]
        rows[rejected, draft_tokens[rejected, n[rejected]]] = 0.0
        rows = torch.where(rows.sum(1, keepdim=True) > 0, rows, p)
        return rows / rows.sum(1, keepdim=True)
