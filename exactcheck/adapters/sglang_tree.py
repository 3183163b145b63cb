"""SGLang's tree verification through exactcheck's tree contract (``exactcheck.contracts.tree_verifier``).

SGLang 0.5.23 lays a tree out per request as ``candidates`` [B, N+1] (node tokens; node 0 the last
verified token), ``retrive_index`` [B, N+1] (each node's flat index into ``predicts``),
``retrive_next_token`` (a node's first child, -1 none) and ``retrive_next_sibling`` (its next
sibling, -1 none), with ``target_probs`` [B, N+1, V] by node and float32 ``uniform_samples``
[B, N+1] (one coin per node, used for its children) and ``uniform_samples_for_final_sampling``
[B]. ``tree_speculative_sampling_target_only``
(``sglang/kernels/jit/include/sgl_kernel/speculative/sampling.cuh``) walks it: at each level the
siblings' target mass is added up (``prob_acc``) until the coin falls below it; a rejected sibling's
draft entry is overwritten with its target probability (``// FIXME: leverage draft probs``) so the
correction, drawn from relu(target - draft) with draft rows passed as zeros, leaves out the
rejected siblings. It writes ``predicts`` (at each accepted node's index the next token),
``accept_index`` [B, D+1] and ``accept_token_num`` [B].

* ``sglang_tree_layout(tokens, parents)``: exactcheck's (tokens, parents) as that layout;
* ``layout_target_only``: the kernel's walk in torch on that layout, line for line (the coin
  comparison ``coin < prob_acc``, the overwrite, the final inverse CDF with its last-valid-id
  fallback), so the layout conversion and the decoding are audited on CPU; like the kernel it
  adds a duplicate sibling's mass again (EAGLE's top-k siblings never repeat);
* ``SglangTreeGreedy``: greedy tree verification (``verify_tree_greedy``): SGLang's Triton kernel
  ``verify_tree_greedy_kernel_triton`` (``sglang/kernels/ops/speculative/spec_tree.py``; it runs
  under Triton's interpreter on a CPU, so the engines step audits it), or its walk in torch
  (``layout_greedy``); judged on the greedy tree worlds;
* ``SglangTreeTargetOnly``: the subject; ``kernel="cuda"`` calls SGLang's CUDA kernel (sgl-kernel or
  SGLang's JIT module: CUDA only; without a GPU ``cuda_kernel_available()`` says why), ``"layout"``
  the torch walk above.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.tree_verifier import children_table, tree_depths

__all__ = ["sglang_tree_layout", "layout_target_only", "SglangTreeTargetOnly", "cuda_kernel_available",
           "layout_greedy", "SglangTreeGreedy"]


def sglang_tree_layout(tokens: torch.Tensor, parents: torch.Tensor, root_token: int = 0):
    """(candidates, retrive_index, retrive_next_token, retrive_next_sibling), int64 [B, N+1]."""
    b, m = tokens.shape
    table = children_table(parents)  # [B, M, K]
    candidates = tokens.clone()
    candidates[:, 0] = root_token
    index = (torch.arange(b, device=tokens.device)[:, None] * m + torch.arange(m, device=tokens.device)[None])
    next_token = table[:, :, 0].clone()
    next_sibling = torch.full_like(tokens, -1)
    for j in range(table.shape[2] - 1):
        here, after = table[:, :, j], table[:, :, j + 1]
        rows = torch.arange(b, device=tokens.device)[:, None].expand_as(here)
        valid = here >= 0
        next_sibling[rows[valid], here[valid]] = after[valid]
    return candidates, index, next_token, next_sibling


def _emitted(predicts, accept_index, accept_num, device) -> torch.Tensor:
    """The contract's output [B, D+1] from SGLang's: ``predicts`` at the accepted nodes' indices
    (the next token at each), up to ``accept_num`` + 1 tokens, then -1."""
    predicts, accept_index, accept_num = (x.to(device).long() for x in (predicts, accept_index, accept_num))
    keep = torch.arange(accept_index.shape[1], device=device)[None] <= accept_num[:, None]
    out = torch.full(accept_index.shape, -1, dtype=torch.int64, device=device)
    out[keep] = predicts[accept_index.clamp(min=0)][keep]
    return out


def layout_target_only(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                       retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs,
                       draft_probs, threshold_single: float = 1.0, threshold_acc: float = 1.0) -> None:
    """``TreeSpeculativeSamplingTargetOnly``'s walk, in torch on CPU, writing the same outputs."""
    b, n = candidates.shape
    spec = accept_index.shape[1]
    threshold_acc = max(threshold_acc, 1e-9)
    flat_p = target_probs.reshape(b * n, -1)
    flat_q = draft_probs.reshape(b * n, -1)
    vocab = flat_p.shape[1]
    for bx in range(b):
        prob_acc = 0.0
        offset = bx * n
        coin = float(uniform_samples[bx, 0])
        last = int(retrive_index[bx, 0])
        accept_index[bx, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, spec):
            cur = int(retrive_next_token[bx, cur])
            while cur != -1:
                draft_index = int(retrive_index[bx, cur])
                token = int(candidates[bx, cur])
                single = float(flat_p[offset, token])
                prob_acc += single
                if single > 0 and (coin < prob_acc / threshold_acc or single >= threshold_single):
                    prob_acc = 0.0
                    offset = bx * n + cur
                    coin = float(uniform_samples[bx, cur])
                    predicts[last] = token
                    accepted += 1
                    accept_index[bx, accepted] = draft_index
                    last = draft_index
                    break
                flat_q[offset, token] = flat_p[offset, token]
                cur = int(retrive_next_sibling[bx, cur])
            if cur == -1:
                break
        accept_token_num[bx] = accepted
        coin = float(uniform_samples_for_final_sampling[bx])
        q = flat_q[offset] if accepted != spec - 1 else torch.zeros_like(flat_p[offset])
        relu = (flat_p[offset] - q).clamp(min=0)
        u = coin * float(relu.sum())
        cdf = relu.cumsum(0)
        above = (cdf > u) & (relu > 0)
        if above.any():
            sampled = int(above.nonzero()[0, 0])
        else:
            valid = (relu > 0).nonzero()
            sampled = int(valid[-1, 0]) if valid.numel() else vocab - 1
        predicts[last] = sampled


def cuda_kernel_available() -> str | None:
    """None if SGLang's CUDA tree kernel can run here; else why not (one line)."""
    if not torch.cuda.is_available():
        return "SGLang's tree_speculative_sampling_target_only is a CUDA kernel and no CUDA device is present"
    try:
        _cuda_kernel()
    except ImportError as exc:
        return f"SGLang's tree kernel is not importable: {exc}"
    return None


def _cuda_kernel():
    try:
        from sgl_kernel import tree_speculative_sampling_target_only
    except ImportError:
        from sglang.kernels.ops.speculative.sampling import tree_speculative_sampling_target_only
    return tree_speculative_sampling_target_only


@dataclass(frozen=True)
class SglangTreeTargetOnly:
    """SGLang's target-only tree verification behind the tree contract: deterministic (top-k)
    siblings, called without draft rows, thresholds 1 (exact)."""

    kernel: str = "layout"  # "cuda": SGLang's kernel; "layout": its walk in torch
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    sibling_sampling = "top_k"
    takes_draft_probs = False
    tree_rule = "target_only"

    @property
    def __name__(self) -> str:
        return f"sglang tree_speculative_sampling_target_only ({self.kernel})"

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        b, m, vocab = target_probs.shape
        depth = int(tree_depths(parents).max())
        device = "cuda" if self.kernel == "cuda" else target_probs.device
        candidates, index, next_token, next_sibling = (x.to(device) for x in sglang_tree_layout(tokens, parents))
        coins = torch.rand((b, m), dtype=torch.float32, generator=generator, device=generator.device).to(device)
        final = torch.rand((b,), dtype=torch.float32, generator=generator, device=generator.device).to(device)
        predicts = torch.full((b * m,), -1, dtype=torch.int32, device=device)
        accept_index = torch.full((b, depth + 1), -1, dtype=torch.int32, device=device)
        accept_num = torch.zeros(b, dtype=torch.int32, device=device)
        p = target_probs.to(device, torch.float32).contiguous()
        q = torch.zeros_like(p)
        run = _cuda_kernel() if self.kernel == "cuda" else layout_target_only
        run(predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, coins, final, p, q,
            threshold_single=self.threshold_single, threshold_acc=self.threshold_acc)
        return _emitted(predicts, accept_index, accept_num, tokens.device)


def layout_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
                  retrive_next_sibling, target_predict) -> None:
    """``verify_tree_greedy_kernel_triton``'s walk in torch: at each level the first sibling equal to
    the target's argmax after the last accepted node is accepted; the argmax there ends the step."""
    b, n = candidates.shape
    spec = accept_index.shape[1]
    flat_target = target_predict.reshape(-1)
    for bx in range(b):
        last = int(retrive_index[bx, 0])
        accept_index[bx, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, spec):
            cur = int(retrive_next_token[bx, cur])
            target = int(flat_target[last])
            matched = False
            while cur != -1:
                if int(candidates[bx, cur]) == target:
                    predicts[last] = target
                    accepted += 1
                    accept_index[bx, accepted] = int(retrive_index[bx, cur])
                    last = int(retrive_index[bx, cur])
                    matched = True
                    break
                cur = int(retrive_next_sibling[bx, cur])
            if not matched:
                break
        accept_token_num[bx] = accepted
        predicts[last] = int(flat_target[last])


def _triton_greedy():
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton
    return verify_tree_greedy_triton


@dataclass(frozen=True)
class SglangTreeGreedy:
    """SGLang's greedy tree verification behind the tree contract: the target's argmax per node
    (``target_predict``) is what it compares candidates with; top-k siblings; greedy worlds only."""

    kernel: str = "layout"  # "triton": SGLang's Triton kernel; "layout": its walk in torch
    sibling_sampling = "top_k"
    takes_draft_probs = False
    greedy = True

    @property
    def __name__(self) -> str:
        return f"sglang verify_tree_greedy ({self.kernel})"

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        b, m, _ = target_probs.shape
        depth = int(tree_depths(parents).max())
        candidates, index, next_token, next_sibling = sglang_tree_layout(tokens, parents)
        target_predict = target_probs.argmax(-1).to(torch.int64)  # [B, N+1], by node = by flat index
        predicts = torch.full((b * m,), -1, dtype=torch.int64, device=tokens.device)
        accept_index = torch.full((b, depth + 1), -1, dtype=torch.int64, device=tokens.device)
        accept_num = torch.zeros(b, dtype=torch.int64, device=tokens.device)
        run = _triton_greedy() if self.kernel == "triton" else layout_greedy
        run(predicts, accept_index, accept_num, candidates, index, next_token, next_sibling, target_predict)
        return _emitted(predicts, accept_index, accept_num, tokens.device)
