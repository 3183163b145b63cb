"""SGLang's chain (non-tree) verification as a step verifier subject.

SGLang verifies speculative drafts with sgl-kernel's ``tree_speculative_sampling_target_only``
(EAGLE's tree; a chain is the tree with one child per node). ``SglangChainVerifier`` hands
exactcheck's verify call to it in the layout SGLang's EAGLE worker builds:

- ``candidates`` [B, k+1] int64: the last verified token (the root; any id) and the k drafts;
- ``retrive_index`` [B, k+1] int64: each node's slot in the flattened ``predicts``;
  ``retrive_next_token``: node j's child is j+1 (the last has none, -1); ``retrive_next_sibling``:
  -1 (a chain has no siblings);
- ``target_probs`` [B, k+1, V] float32: node j's row is the target's law after the root and j
  drafts; ``draft_probs``: zeros, as SGLang passes them (the kernel writes into them);
- ``uniform_samples`` [B, k+1] and ``uniform_samples_for_final_sampling`` [B] float32, drawn here
  from exactcheck's generator (SGLang draws them from torch's global generator; a check that
  hands ``row_generators`` gets each row's from its own);
- outputs ``predicts`` [B (k+1)], ``accept_index`` [B, k+1], ``accept_token_num`` [B] int32: the
  emitted tokens are ``predicts[accept_index[b, :accept_token_num[b] + 1]]``.

The kernel accepts draft x with probability p(x) (``coin <= p(x)``), not min(1, p/q), and after
a rejection samples from p with x removed: the target-only rule, which is exact whatever the
draft law is. The subject declares it (``acceptance_rule``), so the audit checks that rule's
accepted-length and correction laws. ``threshold_single`` / ``threshold_acc`` below 1 (SGLang's
``--speculative-accept-threshold-*``) accept more and are lossy by design.

The kernel runs on CUDA only; without sgl-kernel the adapter raises ``MissingEngine``. ``kernel=``
takes any callable with the kernel's signature (the tests pass a pure-torch stand-in).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from exactcheck.adapters.vllm import MissingEngine, load_module
from exactcheck.step.contract import PADDING

__all__ = ["SglangChainVerifier", "MissingEngine", "KERNEL_MODULE", "audit_chain_verifier"]

KERNEL_MODULE = "sgl_kernel"


@dataclass
class SglangChainVerifier:
    """A step ``Verifier`` backed by SGLang's target-only tree kernel on a chain."""

    kernel: Any = None
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    acceptance_rule: str = field(default="target-only", init=False)
    name: str = field(default="sglang tree_speculative_sampling_target_only (chain)", init=False)

    def __post_init__(self):
        if self.kernel is None:
            self.kernel = load_module(KERNEL_MODULE, "exactcheck.adapters.sglang",
                                      "install sgl-kernel (CUDA only) or pass kernel=").tree_speculative_sampling_target_only
        self.lossy = self.threshold_single < 1 or self.threshold_acc < 1

    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 generator: torch.Generator, row_generators: list[torch.Generator | None] | None = None
                 ) -> torch.Tensor:
        batch, k = draft_tokens.shape
        nodes = k + 1
        device = target_probs.device
        candidates = torch.cat([torch.zeros((batch, 1), dtype=torch.int64, device=device),
                                draft_tokens.to(torch.int64)], 1).contiguous()
        retrive_index = torch.arange(batch * nodes, dtype=torch.int64, device=device).view(batch, nodes)
        following = torch.arange(1, nodes + 1, dtype=torch.int64, device=device)
        following[-1] = -1
        retrive_next_token = following.expand(batch, nodes).contiguous()
        retrive_next_sibling = torch.full((batch, nodes), -1, dtype=torch.int64, device=device)
        coins = torch.rand((batch, nodes), dtype=torch.float32, generator=generator, device=device)
        final = torch.rand((batch,), dtype=torch.float32, generator=generator, device=device)
        for row, g in enumerate(row_generators or ()):
            if g is not None:
                coins[row] = torch.rand((nodes,), dtype=torch.float32, generator=g, device=device)
                final[row] = torch.rand((), dtype=torch.float32, generator=g, device=device)
        target = target_probs.to(torch.float32).contiguous()
        predicts = torch.full((batch * nodes,), -1, dtype=torch.int32, device=device)
        accept_index = torch.full((batch, nodes), -1, dtype=torch.int32, device=device)
        accept_token_num = torch.zeros((batch,), dtype=torch.int32, device=device)
        self.kernel(predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
                    candidates=candidates, retrive_index=retrive_index, retrive_next_token=retrive_next_token,
                    retrive_next_sibling=retrive_next_sibling, uniform_samples=coins,
                    uniform_samples_for_final_sampling=final, target_probs=target,
                    draft_probs=torch.zeros_like(target), threshold_single=self.threshold_single,
                    threshold_acc=self.threshold_acc, deterministic=True)
        emitted = accept_token_num.to(torch.int64) + 1
        slots = accept_index.to(torch.int64).clamp(min=0)
        out = predicts.to(torch.int64)[slots]
        position = torch.arange(nodes, device=device)[None]
        return torch.where(position < emitted[:, None], out, torch.full_like(out, PADDING))


def audit_chain_verifier(kernel=None, *, level: str = "quick", device: str | None = None, **options):
    """Audit the installed sgl-kernel's chain verification (or ``kernel``) at ``level`` and return
    the ``StepAuditResult``; ``device`` defaults to CUDA when available (the kernel needs it);
    ``options`` are ``run_audit``'s."""
    from exactcheck.step.runner import run_audit
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    subject = SglangChainVerifier(kernel)
    return run_audit(subject, subject_name=subject.name, level=level, device=device, **options)
