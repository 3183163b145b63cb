"""A stand-in for ``vllm.v1.sample.rejection_sampler`` (the functions exactcheck's vLLM adapter
calls), in pure torch, with vLLM V1's semantics:

- ``rejection_sample``: per request, its drafts are accepted while ``draft_prob > 0 and
  target_prob / draft_prob >= u`` with ``u`` a float32 uniform (the stand-in's choice: vLLM draws
  float64 uniforms, ``uniform_dtype=torch.float64`` as the 0.33 stand-in passes) (the request's generator draws
  its ``num_draft_tokens`` uniforms with ``Tensor.uniform_``; requests without one use torch's
  global generator); at the first rejection the recovered token is emitted; after every draft
  is accepted the bonus token handed in is appended; unused slots hold -1.
- recovered tokens: one float32 ``Exp(1)`` vector per request (``Tensor.exponential_`` with the
  request's generator), and at each position ``argmax(max(p - q, 0) / e)`` (an exponential race
  over the residual, unnormalised). torch's ``argmax`` treats NaN as the largest value; Triton's
  ``tl.argmax`` in vLLM's kernel may not, so a finding that rests on a NaN here is the stand-in's.
- the greedy path: the target argmax is emitted up to and including the first position where it
  differs from the draft; the bonus token after full agreement.
- ``compute_probs``: logits divided by the per-request temperature (greedy requests' -1
  replaced by 1), softmax in float32.
"""
from __future__ import annotations

import torch

PLACEHOLDER_TOKEN_ID = -1
GREEDY_TEMPERATURE = -1
MAX_SPEC_LEN = 32


def _request_of_token(cu_num_draft_tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    return torch.searchsorted(cu_num_draft_tokens.to(torch.int64),
                              torch.arange(num_tokens, device=cu_num_draft_tokens.device), right=True)


def compute_probs(logits, cu_num_draft_tokens, sampling_metadata):
    if sampling_metadata.all_greedy:
        return logits
    request = _request_of_token(cu_num_draft_tokens, logits.shape[0])
    temperature = sampling_metadata.temperature.to(logits.dtype)
    temperature = torch.where(temperature == GREEDY_TEMPERATURE, torch.ones_like(temperature), temperature)
    return torch.softmax(logits / temperature[request][:, None], dim=-1, dtype=torch.float32)


def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device, dtype=torch.float32):
    u = torch.rand((num_tokens,), dtype=dtype, device=device)
    start = 0
    for request, n in enumerate(num_draft_tokens):
        if n == 0:
            continue
        generator = generators.get(request)
        if generator is not None:
            u[start:start + n].uniform_(generator=generator)
        start += n
    return u


def sample_recovered_tokens(num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            sampling_metadata, device):
    batch, vocab = len(num_draft_tokens), target_probs.shape[-1]
    race = torch.empty((batch, vocab), dtype=torch.float32, device=device)
    race.exponential_()
    for request, generator in sampling_metadata.generators.items():
        if num_draft_tokens[request] > 0:
            race[request].exponential_(generator=generator)
    request = _request_of_token(cu_num_draft_tokens, draft_token_ids.shape[0])
    if draft_probs is None:  # n-gram drafts: the draft token's target probability is set aside
        residual = target_probs.clone()
        residual.scatter_(1, draft_token_ids.to(torch.int64)[:, None], 0.0)
    else:
        residual = (target_probs - draft_probs).clamp(min=0)
    return torch.argmax(residual / race[request], dim=-1)


def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                     target_probs, bonus_token_ids, sampling_metadata, uniform_dtype=torch.float32):
    batch = len(num_draft_tokens)
    device = target_probs.device
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32, device=device)
    starts = [0] + cu_num_draft_tokens.tolist()[:-1]
    tokens = draft_token_ids.to(torch.int64)
    if sampling_metadata.all_greedy:
        argmax = target_probs.argmax(-1)
        for r in range(batch):
            s, n = starts[r], num_draft_tokens[r]
            for pos in range(n):
                out[r, pos] = argmax[s + pos]
                if tokens[s + pos] != argmax[s + pos]:
                    break
            else:
                out[r, n] = bonus_token_ids[r, 0]
        return out
    uniform = generate_uniform_probs(tokens.shape[0], num_draft_tokens, sampling_metadata.generators, device,
                                     uniform_dtype)
    recovered = sample_recovered_tokens(num_draft_tokens, cu_num_draft_tokens, tokens, draft_probs, target_probs,
                                        sampling_metadata, device)
    p = target_probs.gather(1, tokens[:, None])[:, 0]
    q = torch.ones_like(p) if draft_probs is None else draft_probs.gather(1, tokens[:, None])[:, 0]
    accept = (q > 0) & (p / q >= uniform)
    # vectorised over requests of equal draft count (the audit's case); ragged requests loop
    k = max_spec_len
    if all(n == k for n in num_draft_tokens):
        accept = accept.view(batch, k)
        n_acc = accept.to(torch.int64).cumprod(1).sum(1)
        drafts, rec = tokens.view(batch, k), recovered.view(batch, k)
        position = torch.arange(k + 1, device=device)[None]
        body = torch.cat([drafts, bonus_token_ids.to(torch.int64)], 1)
        final = torch.where(n_acc < k, rec.gather(1, n_acc.clamp(max=k - 1)[:, None])[:, 0], body[:, k])
        result = torch.where(position < n_acc[:, None], body, torch.full_like(body, PLACEHOLDER_TOKEN_ID))
        result.scatter_(1, n_acc[:, None], final[:, None])
        return result.to(torch.int32)
    for r in range(batch):
        s, n = starts[r], num_draft_tokens[r]
        for pos in range(n):
            if accept[s + pos]:
                out[r, pos] = tokens[s + pos]
            else:
                out[r, pos] = recovered[s + pos]
                break
        else:
            out[r, n] = bonus_token_ids[r, 0]
    return out
