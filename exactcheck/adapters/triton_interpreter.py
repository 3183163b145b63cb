"""Running the engines' Triton kernels on a CPU, under Triton's interpreter (``TRITON_INTERPRET=1``).

The kernels themselves run unchanged; what the interpreter (Triton 3.7) and a machine without a
GPU lack is filled in here, and only when the interpreter is on:

- ``CUDA_VISIBLE_DEVICES`` must be set (empty is fine) before vLLM is imported: with no Triton
  driver active and the variable unset, vLLM replaces ``triton.jit`` by a placeholder and the
  first call fails with "Cannot inspect kernel parameters". ``check_environment`` says so in one
  line instead.
- ``libdevice.log1p`` is a stub under the interpreter (it returns None); vLLM V2's
  ``rejection_sampler_utils`` uses it once, for the residual of a rejected draft with draft
  logits. ``interpreted_log1p`` computes it in numpy, in the operand's dtype.
- vLLM's Triton top-k/top-p kernel (``topk_topp_triton``) does not run under the interpreter (its
  loop indices are Python ints there, and it sizes its grid by the GPU's compute units, which
  vLLM's platform layer does not know on a CPU): ``apply_top_k_top_p`` takes vLLM's own PyTorch
  implementation instead (``apply_top_k_top_p_pytorch``, the path vLLM itself takes where Triton
  is absent). On a GPU the Triton kernel runs.

``prepare_vllm(module)`` / ``prepare_sglang(module)`` apply what the module needs and return the
list of what was patched (the adapters record it in their names' notes, so a report says so).
"""
from __future__ import annotations

import os
import types

from exactcheck.errors import UsageError

__all__ = ["interpreting", "check_environment", "interpreted_log1p", "prepare_vllm", "prepare_sglang"]


def interpreting() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_environment() -> None:
    """One line, before vLLM is imported, if its Triton kernels would become placeholders here."""
    import torch
    if interpreting() and not torch.cuda.is_available() and "CUDA_VISIBLE_DEVICES" not in os.environ:
        raise UsageError("vLLM's Triton kernels under TRITON_INTERPRET=1 on a CPU need CUDA_VISIBLE_DEVICES set "
                         "(empty is fine): without it vLLM replaces triton.jit by a placeholder")


def interpreted_log1p(x):
    """``libdevice.log1p`` for Triton's interpreter: log(1 + x) in numpy, in x's dtype."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle
    handle = x.handle
    with np.errstate(divide="ignore", invalid="ignore"):  # log1p(-1) = -inf, as on the GPU
        value = np.log1p(handle.data).astype(handle.data.dtype)
    return tl.tensor(TensorHandle(value, handle.dtype.scalar), x.type)


def _log1p_is_a_stub(device) -> bool:
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle
        probe = tl.tensor(TensorHandle(np.zeros(1, np.float32), tl.float32), tl.block_type(tl.float32, [1]))
        return device.log1p(probe) is None
    except Exception:  # noqa: BLE001 - not the interpreter's stub: leave it alone
        return False


def prepare_vllm(module) -> list[str]:
    """Fill what the interpreter lacks for vLLM ``module`` (a rejection-sampler module); returns
    what was patched (nothing outside the interpreter)."""
    if not interpreting():
        return []
    patched = []
    device = getattr(module, "tldevice", None)
    if device is not None and _log1p_is_a_stub(device):
        module.tldevice = types.SimpleNamespace(log1p=interpreted_log1p)
        patched.append("libdevice.log1p (numpy)")
    try:
        import vllm.v1.sample.ops.topk_topp_sampler as topk
    except ImportError:
        return patched
    if getattr(topk, "HAS_TRITON", False) and hasattr(topk, "apply_top_k_top_p_pytorch"):
        topk.HAS_TRITON = False  # this module's choice only: the samplers' kernels stay Triton
        patched.append("top-k/top-p: vLLM's PyTorch implementation (its Triton kernel does not interpret)")
    return patched


def prepare_sglang(module) -> list[str]:
    """SGLang's chain verifier needs nothing beyond what the interpreter has."""
    return []
