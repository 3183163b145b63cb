"""The engine paths exactcheck audits through the real kernels, one named subject each, for the
command line (``exactcheck audit exactcheck.adapters.engine_paths:NAME``; a class is instantiated
with no arguments), the engines step of CI (``.ci/engines``) and ``benchmarks/gpu_session.sh``.

Each is the configuration a user of that engine sets; the adapter declares its rule to the audit
(token-wise or block). ``PATHS`` maps each name to (engine and function, what the user sets)."""
from __future__ import annotations

from dataclasses import dataclass

from exactcheck.adapters.sglang import SglangTritonChainVerifier
from exactcheck.adapters.vllm import VllmRejectionSampler, VllmV2RejectionSampler

__all__ = ["PATHS", "VllmV1Temperature1", "VllmV1Temperature07TopK", "VllmV1Greedy", "VllmV2Standard",
           "VllmV2Block", "VllmV2Synthetic", "VllmV2Fly", "SglangTritonTokenWise", "SglangTritonBlock"]


@dataclass
class VllmV1Temperature1(VllmRejectionSampler):
    """vLLM V1 ``rejection_sample`` at temperature 1 (probabilistic draft)."""


@dataclass
class VllmV1Temperature07TopK(VllmRejectionSampler):
    """vLLM V1 at temperature 0.7 with top-k, through ``apply_sampling_constraints``."""

    temperature: float | None = 0.7
    top_k: bool = True


@dataclass
class VllmV1Greedy(VllmRejectionSampler):
    """vLLM V1's greedy path (temperature 0)."""

    greedy: bool = True


@dataclass
class VllmV2Standard(VllmV2RejectionSampler):
    """vLLM V2 (model runner V2) ``rejection_sample_method='standard'``."""


@dataclass
class VllmV2Block(VllmV2RejectionSampler):
    """vLLM V2 ``rejection_sample_method='block'``."""

    method: str = "block"


@dataclass
class VllmV2Synthetic(VllmV2RejectionSampler):
    """vLLM V2 ``rejection_sample_method='synthetic'`` (benchmarking: a fixed acceptance rate of
    0.5 per draft); lossy: its exactness verdicts measure what it costs."""

    method: str = "synthetic"


@dataclass
class VllmV2Fly(VllmV2RejectionSampler):
    """vLLM V2 ``rejection_sample_method='fly'`` (vLLM's defaults: window min(6, k - 1), entropy
    threshold 0.3, top-3 entropy); lossy."""

    method: str = "fly"


@dataclass
class SglangTritonTokenWise(SglangTritonChainVerifier):
    """SGLang's Triton chain verifier, ``--speculative-use-rejection-sampling``."""


@dataclass
class SglangTritonBlock(SglangTritonChainVerifier):
    """SGLang's Triton chain verifier with ``--speculative-use-block-verification``."""

    block_verification: bool = True


_V1, _V2, _SGL = ("vLLM 0.33.0 vllm/v1/sample/rejection_sampler.py rejection_sample",
                  "vLLM 0.33.0 vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py rejection_sample",
                  "SGLang 0.5.23 sglang/kernels/ops/speculative/reject_sampling.py chain_speculative_sampling_triton")
PATHS = {
    "VllmV1Temperature1": (_V1, "temperature 1, probabilistic draft"),
    "VllmV1Temperature07TopK": (_V1, "temperature 0.7, top-k"),
    "VllmV1Greedy": (_V1, "greedy (temperature 0)"),
    "VllmV2Standard": (_V2, "rejection_sample_method='standard', probabilistic draft"),
    "VllmV2Block": (_V2, "rejection_sample_method='block', probabilistic draft"),
    "VllmV2Synthetic": (_V2, "rejection_sample_method='synthetic', conditional rate 0.5 (lossy)"),
    "VllmV2Fly": (_V2, "rejection_sample_method='fly', vLLM's defaults (lossy)"),
    "SglangTritonTokenWise": (_SGL, "--speculative-use-rejection-sampling"),
    "SglangTritonBlock": (_SGL, "--speculative-use-rejection-sampling --speculative-use-block-verification"),
}
