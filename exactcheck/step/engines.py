"""One-call audits of the engines' installed step verifiers, for an engine's own test suite::

    from exactcheck.step.engines import audit_rejection_sampler

    def test_rejection_sampler_is_exact():
        result = audit_rejection_sampler(level="quick")
        assert result.passed, "\\n".join(v.describe() for v in result.failed)

The adapters (``exactcheck.adapters.vllm``, ``.sglang``) wrap the kernels as step verifiers; these
functions audit them with ``run_audit``."""
from __future__ import annotations

import torch

from exactcheck.adapters.sglang import SglangChainVerifier
from exactcheck.adapters.vllm import VllmRejectionSampler
from exactcheck.step.runner import run_audit

__all__ = ["audit_rejection_sampler", "audit_chain_verifier"]


def audit_rejection_sampler(module=None, *, level: str = "quick", temperature: float | None = None,
                            greedy: bool = False, top_k: bool = False, device: str | None = None, **options):
    """Audit the installed vLLM's rejection sampler (or ``module``) at ``level`` and return the
    ``StepAuditResult``. For a vLLM test::

        from exactcheck.step.engines import audit_rejection_sampler

        def test_rejection_sampler_is_exact():
            result = audit_rejection_sampler(level="quick")
            assert result.passed, "\\n".join(v.describe() for v in result.failed)

    ``device`` defaults to CUDA when available; ``options`` are ``run_audit``'s (``seed``,
    ``worlds``, ``alpha``, ``require``, ...)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    subject = VllmRejectionSampler(module, temperature=temperature, greedy=greedy, top_k=top_k)
    return run_audit(subject, subject_name=subject.name, level=level, device=device, **options)


def audit_chain_verifier(kernel=None, *, level: str = "quick", device: str | None = None, **options):
    """Audit the installed sgl-kernel's chain verification (or ``kernel``) at ``level`` and return
    the ``StepAuditResult``; ``device`` defaults to CUDA when available (the kernel needs it);
    ``options`` are ``run_audit``'s."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    subject = SglangChainVerifier(kernel)
    return run_audit(subject, subject_name=subject.name, level=level, device=device, **options)
