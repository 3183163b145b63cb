"""A stand-in for vLLM 0.33's model-runner-V2 ``rejection_sample``
(``vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils``), in pure torch, with its Python
signature and the semantics of its ``standard`` and ``block`` methods (read from the 0.33.0 wheel):

- inputs packed per request: ``target_logits`` [num_logits, V] (processed logits), ``draft_logits``
  [max_reqs, k, V] before temperature (or None: one-hot drafts), ``draft_sampled`` shifted by one
  (the draft checked at row ``cu[r] + i`` is ``draft_sampled[cu[r] + i + 1]``), ``cu_num_logits``,
  ``pos`` (absolute positions: they key the random numbers), the request-state maps,
  ``temperature`` (0: greedy) and ``seed`` per request state;
- the acceptance uniform of row ``pos`` is drawn from the request's seed and the position (vLLM:
  Philox ``tl.rand(seed', pos)``; here ``torch.rand`` from a generator seeded with both), clamped
  to at least 2^-31; block mode mixes the step into the seed (``seed ^ (i << 32)``);
- standard: accept while log p(d) > log u + log q(d) (strict); resample at the first rejection from
  max(p - q, 0) by Gumbel-max; bonus from p by Gumbel-max;
- block: cumulative log weights in float32, log w_{i+1} = min(log w_i + log p(d_i) - log q(d_i), 0);
  h_i = R / (R + 1 - w) with R over the next row (1 where the denominator is 0), h at the last
  draft = w_k; tau = the last i with u_i <= h_i (non-strict); resample from max(w_tau p - q, 0);
- returns ``(sampled [B, k+1] int64, num_sampled [B] int32)``; only ``sampled[r, :num_sampled[r]]``
  is valid (no -1 padding).
"""
from __future__ import annotations

import torch

TINY_UNIFORM = 4.6566127342e-10  # 2^-31: vLLM's clamp on its acceptance uniforms


def _uniform(seed: int, pos: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed((seed * 1_000_003 + pos) & ((1 << 63) - 1))
    return torch.rand((), generator=generator).clamp(min=TINY_UNIFORM)


def _gumbel_argmax(log_rows: torch.Tensor, seed: int, pos: int) -> int:
    generator = torch.Generator().manual_seed((seed * 998_244_353 + pos + 7) & ((1 << 63) - 1))
    u = torch.rand(log_rows.shape, generator=generator).clamp(min=1e-20)
    return int((log_rows - torch.log(-torch.log(u))).argmax())


def rejection_sample(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
                     expanded_idx_mapping, expanded_local_pos, temperature, seed, num_speculative_steps,
                     synthetic_conditional_rates=None, use_fp64=False, use_block_verification=False, contexts=None,
                     watermarking=None, watermarking_skip_mask=None, watermark_key=None, fly_window_size=0,
                     fly_entropy_threshold=0.3, fly_entropy_top_k=3):
    if synthetic_conditional_rates is not None or fly_window_size:
        raise NotImplementedError("the stand-in has the standard and block methods only")
    batch, k = idx_mapping.shape[0], num_speculative_steps
    sampled = torch.full((batch, k + 1), 1 << 40, dtype=torch.int64)  # "uninitialised"
    num_sampled = torch.zeros(batch, dtype=torch.int32)
    for r in range(batch):
        state = int(idx_mapping[r])
        start, end = int(cu_num_logits[r]), int(cu_num_logits[r + 1])
        n = end - start - 1
        logp = torch.log_softmax(target_logits[start:end].float(), -1)  # [n+1, V]
        drafts = draft_sampled[start + 1:start + 1 + n].to(torch.int64)
        if draft_logits is None:
            logq = torch.full((n, logp.shape[1]), -torch.inf)
            logq[torch.arange(n), drafts] = 0.0
        else:
            logq = torch.log_softmax(draft_logits[state, :n].float() / float(temperature[state]), -1)
        request_seed = int(seed[state])
        at = torch.arange(n)
        step = logp[at, drafts] - logq[at, drafts] if n else torch.zeros(0)
        if use_block_verification:
            cum = [torch.tensor(0.0)]
            for i in range(n):
                cum.append(torch.clamp(cum[-1] + step[i], max=0.0))
            w = torch.stack(cum).exp()  # w_0..w_n, float32
            tau = 0
            for i in range(n):  # step i keeps the prefix of i + 1 drafts
                u = _uniform(request_seed ^ (i << 32), int(pos[start + i]))
                weight = w[i + 1]
                if i + 1 < n:
                    mass = (weight * logp[i + 1].exp() - logq[i + 1].exp()).clamp(min=0).sum()
                    denominator = mass + 1 - weight
                    h = mass / denominator if denominator > 0 else torch.tensor(1.0)
                else:
                    h = weight
                if u <= h:
                    tau = i + 1
            scale = w[tau]
        else:
            tau = 0
            while tau < n and bool(logp[tau, drafts[tau]] > torch.log(_uniform(request_seed, int(pos[start + tau])))
                                   + logq[tau, drafts[tau]]):
                tau += 1
            scale = torch.tensor(1.0)
        if tau < n:
            residual = (scale * logp[tau].exp() - logq[tau].exp()).clamp(min=0)
            rows = torch.where(residual > 0, residual.log(), torch.full_like(residual, -torch.inf))
        else:
            rows = logp[n]
        sampled[r, :tau] = drafts[:tau]
        sampled[r, tau] = _gumbel_argmax(rows, request_seed, int(pos[start + tau]))
        num_sampled[r] = tau + 1
    return sampled, num_sampled
