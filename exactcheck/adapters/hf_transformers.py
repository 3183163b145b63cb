"""transformers' ``_speculative_sampling`` (assisted generation's accept/reject step) as a
step-level verifier.

``_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits,
assistant_ensemble_weight)`` takes logits for one sequence (batch size 1) and draws its random
numbers from torch's global generator (``rand_like`` for acceptance, ``multinomial`` for the
correction or bonus token). The adapter calls it once per row, with the logits adapter's
``log(probs)``; before the batch it seeds the global generator from the audit's generator (so a
seeded audit is reproducible) and restores the global state afterwards.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.verifier import PADDING, Verifier, from_logits

__all__ = ["speculative_sampling_verifier"]


def speculative_sampling_verifier(assistant_ensemble_weight: float | None = None) -> Verifier:
    """The installed transformers' ``_speculative_sampling`` as a ``Verifier``."""
    from transformers.generation.utils import _speculative_sampling

    def transformers_speculative_sampling(target_logits, draft_logits, draft_tokens, generator):
        batch, k = draft_tokens.shape
        seed = int(torch.rand(1, dtype=torch.float64, generator=generator,
                              device=draft_tokens.device).item() * 2 ** 53)
        out = draft_tokens.new_full((batch, k + 1), PADDING)
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        try:
            for row in range(batch):
                tokens, _ = _speculative_sampling(draft_tokens[row:row + 1], draft_logits[row:row + 1],
                                                  k, target_logits[row:row + 1],
                                                  assistant_ensemble_weight)
                out[row, :tokens.shape[1]] = tokens[0]
        finally:
            torch.random.set_rng_state(state)
        return out

    verifier = from_logits(transformers_speculative_sampling)
    verifier.__name__ = "transformers._speculative_sampling"
    return verifier


def __getattr__(name: str):
    # `exactcheck audit exactcheck.adapters.hf_transformers:speculative_sampling` works too
    if name == "speculative_sampling":
        return speculative_sampling_verifier()
    raise AttributeError(name)
