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
from exactcheck.contracts.verifier import PADDING

__all__ = ["SglangChainVerifier", "SglangTritonChainVerifier", "MissingEngine", "KERNEL_MODULE", "TRITON_MODULE"]

KERNEL_MODULE = "sgl_kernel"


def _coins(batch: int, nodes: int, generator, row_generators, device):
    """The float32 coins SGLang draws for a verify call (``torch.rand_like(candidates)`` and
    ``torch.rand(bs)`` in ``eagle_utils._verify_coins``), from the audit's generator, or each
    row's own where a check hands ``row_generators``."""
    coins = torch.rand((batch, nodes), dtype=torch.float32, generator=generator, device=device)
    final = torch.rand((batch,), dtype=torch.float32, generator=generator, device=device)
    for row, g in enumerate(row_generators or ()):
        if g is not None:
            coins[row] = torch.rand((nodes,), dtype=torch.float32, generator=g, device=device)
            final[row] = torch.rand((), dtype=torch.float32, generator=g, device=device)
    return coins, final


def _chain(draft_tokens: torch.Tensor) -> dict:
    """A chain laid out as SGLang's EAGLE worker lays a tree out: the root and the drafts as
    ``candidates``, node j -> slot, node j's child j + 1, no siblings; empty outputs."""
    batch, k = draft_tokens.shape
    nodes, device = k + 1, draft_tokens.device
    following = torch.arange(1, nodes + 1, dtype=torch.int64, device=device)
    following[-1] = -1
    return dict(
        candidates=torch.cat([torch.zeros((batch, 1), dtype=torch.int64, device=device),
                              draft_tokens.to(torch.int64)], 1).contiguous(),
        retrive_index=torch.arange(batch * nodes, dtype=torch.int64, device=device).view(batch, nodes),
        retrive_next_token=following.expand(batch, nodes).contiguous(),
        retrive_next_sibling=torch.full((batch, nodes), -1, dtype=torch.int64, device=device),
        predicts=torch.full((batch * nodes,), -1, dtype=torch.int32, device=device),
        accept_index=torch.full((batch, nodes), -1, dtype=torch.int32, device=device),
        accept_token_num=torch.zeros((batch,), dtype=torch.int32, device=device))


def _emitted(layout: dict) -> torch.Tensor:
    """The emitted tokens [B, k+1]: ``predicts[accept_index[b, :accept_token_num[b] + 1]]``, padded."""
    accept_index, nodes = layout["accept_index"], layout["accept_index"].shape[1]
    emitted = layout["accept_token_num"].to(torch.int64) + 1
    out = layout["predicts"].to(torch.int64)[accept_index.to(torch.int64).clamp(min=0)]
    position = torch.arange(nodes, device=out.device)[None]
    return torch.where(position < emitted[:, None], out, torch.full_like(out, PADDING))


def _verify(kernel, draft_tokens: torch.Tensor, generator, row_generators, **arguments) -> torch.Tensor:
    """One verify call through an SGLang kernel on a chain: its layout, its coins, the rows and
    options in ``arguments``; the emitted tokens [B, k+1]."""
    batch, k = draft_tokens.shape
    layout = _chain(draft_tokens)
    coins, final = _coins(batch, k + 1, generator, row_generators, draft_tokens.device)
    kernel(**layout, uniform_samples=coins, uniform_samples_for_final_sampling=final, deterministic=True,
           **arguments)
    return _emitted(layout)


def _softmaxed(rows: torch.Tensor) -> torch.Tensor:
    """Rows as SGLang's samplers make them: a float32 softmax of their logits (normalised)."""
    rows = rows.float()
    logits = torch.where(rows > 0, rows.clamp(min=torch.finfo(torch.float32).tiny).log(),
                         torch.full_like(rows, -torch.inf))
    return torch.softmax(logits, dim=-1).contiguous()


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
        target = target_probs.to(torch.float32).contiguous()
        return _verify(self.kernel, draft_tokens, generator, row_generators, target_probs=target,
                       draft_probs=torch.zeros_like(target), threshold_single=self.threshold_single,
                       threshold_acc=self.threshold_acc)


TRITON_MODULE = "sglang.kernels.ops.speculative.reject_sampling"


@dataclass
class SglangTritonChainVerifier:
    """A step ``Verifier`` backed by SGLang's Triton chain verifier,
    ``chain_speculative_sampling_triton`` (kernel ``speculative_sampling_classic_kernel``), the
    sampler SGLang's EAGLE worker selects with ``--speculative-use-rejection-sampling``:
    token-wise rejection sampling (``coin * q < p``; the correction by a CDF walk over
    max(p - q, 0)), or block verification with ``block_verification=True``
    (``--speculative-use-block-verification``). The subject declares the rule it follows.

    Layout as ``eagle_utils.verify_tree_greedy_or_sample`` builds it: the chain (``_chain``),
    ``target_probs`` [B, k+1, V] and ``draft_probs`` [B, k, V] float32 softmaxed rows, float32
    coins [B, k+1] and final coins [B] (``_coins``). Runs wherever Triton runs (a GPU, or a CPU
    under ``TRITON_INTERPRET=1``); ``kernel=`` takes any callable with its signature."""

    kernel: Any = None
    block_verification: bool = False
    acceptance_rule: str = field(default="token-wise", init=False)
    name: str = field(default="sglang chain_speculative_sampling_triton", init=False)

    def __post_init__(self):
        if self.kernel is None:
            module = load_module(TRITON_MODULE, "exactcheck.adapters.sglang (Triton)",
                                 "install sglang >= 0.5.23 (pip install --no-deps sglang) and triton, or pass kernel=")
            self.kernel = module.chain_speculative_sampling_triton
        if self.block_verification:
            self.acceptance_rule = "block"
            self.name += " (block verification)"

    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 generator: torch.Generator, row_generators: list[torch.Generator | None] | None = None
                 ) -> torch.Tensor:
        options = {"block_verification": True} if self.block_verification else {}
        return _verify(self.kernel, draft_tokens, generator, row_generators, target_probs=_softmaxed(target_probs),
                       draft_probs=_softmaxed(draft_probs), threshold_single=1.0, threshold_acc=1.0, **options)
