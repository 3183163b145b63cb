"""A stand-in for vLLM 0.33's ``vllm.v1.sample.rejection_sampler`` API (the functions exactcheck's
vLLM adapter calls), in pure torch, on the semantics of ``vllm_rejection_sampler``:

- ``rejection_sample`` takes ``target_logits`` and applies the softmax itself (float32), draws
  its acceptance uniforms in float64 (``torch.rand(..., dtype=torch.float64)``, then
  ``Tensor.uniform_`` with each request's generator), takes ``synthetic_mode`` and friends with
  their defaults; ``GREEDY_TEMPERATURE`` is 0;
- ``apply_sampling_constraints``: logits divided by each request's temperature (greedy's 0
  replaced by 1), then top-k per request (the k largest kept, the rest -inf; vLLM's
  ``apply_top_k_top_p_pytorch`` with no top-p); the logits unchanged when every request is
  greedy.
"""
from __future__ import annotations

import torch

from standins import vllm_rejection_sampler as v1

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = 0


def apply_sampling_constraints(logits, cu_num_draft_tokens, sampling_metadata):
    if sampling_metadata.all_greedy:
        return logits
    request = v1._request_of_token(cu_num_draft_tokens, logits.shape[0])
    temperature = sampling_metadata.temperature.to(logits.dtype)
    temperature = torch.where(temperature == GREEDY_TEMPERATURE, torch.ones_like(temperature), temperature)
    logits = logits / temperature[request][:, None]
    if sampling_metadata.top_k is not None:
        k = sampling_metadata.top_k.to(torch.int64)[request]
        ordered = logits.sort(-1, descending=True).values
        kth = ordered.gather(1, (k - 1).clamp(min=0, max=logits.shape[-1] - 1)[:, None])
        logits = logits.masked_fill(logits < kth, -torch.inf)
    return logits


def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=False,
                     synthetic_conditional_rates=None, use_fp64_gumbel=False, fly_window_size=None,
                     fly_entropy_threshold=None, fly_entropy_top_k=3):
    if sampling_metadata.all_greedy:
        probs = target_logits  # the greedy path reads the argmax only
    else:
        probs = target_logits.softmax(dim=-1, dtype=torch.float32)
    return v1.rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                               probs, bonus_token_ids, sampling_metadata, uniform_dtype=torch.float64)
