"""The APIs a serve audit speaks (a registry of dialects), and the one a URL gets: ``open_endpoint``.

A dialect is one module with an ``Endpoint`` class and a ``detect(client, base)``; ``DIALECTS``
declares, per dialect, what it gives the audit (prompts as token ids or text, how ids come back,
the probabilities' format and kind, speculation counters, settings); what one lacks, the audit
reports as "not judged" with the reason. ``--api auto`` asks each dialect's ``detect`` in the
registry's order (llama.cpp, mlx-lm, llama-cpp-python, SGLang), the OpenAI API being what is left.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.endpoint import Endpoint
from exactcheck.endpoints import llama_cpp_python_api, mlx_lm_api, sglang_api
from exactcheck.endpoints.llama_cpp_api import LlamaCppEndpoint, is_llama_cpp
from exactcheck.endpoints.openai_api import OpenAICompletionsEndpoint

__all__ = ["APIS", "DIALECTS", "Dialect", "open_endpoint", "detect_api", "declared_settings"]


@dataclass(frozen=True)
class Dialect:
    """One API a serve audit speaks: its module, its endpoint class, how a server is recognised as
    speaking it (``detect``: None for the fallback), and what it gives (``gives``: field -> words)."""

    name: str
    module: str
    endpoint: Callable[..., Endpoint]  # (base, client, *, model, reference_kind) -> Endpoint
    detect: Callable[[Client, str], bool] | None
    gives: dict = field(default_factory=dict)


def _llama_cpp(base: str, client: Client, *, model: str | None = None, reference_kind: str | None = None) -> Endpoint:
    return LlamaCppEndpoint(base, client, model=model)


# in the order ``auto`` asks them; the one without ``detect`` is what is left
DIALECTS: dict[str, Dialect] = {d.name: d for d in (
    Dialect("llama.cpp", "exactcheck.endpoints.llama_cpp_api", _llama_cpp, is_llama_cpp, dict(
        prompts="token ids", ids="tokens (return_tokens)", probabilities="post-sampling (n_probs, post_sampling_probs)",
        counters="per request (timings.draft_n)", settings="/slots", cache_switch="cache_prompt")),
    Dialect("mlx-lm", "exactcheck.endpoints.mlx_lm_api", mlx_lm_api.MlxLmEndpoint, mlx_lm_api.detect, mlx_lm_api.GIVES),
    Dialect("llama-cpp-python", "exactcheck.endpoints.llama_cpp_python_api",
            llama_cpp_python_api.LlamaCppPythonEndpoint, llama_cpp_python_api.detect, llama_cpp_python_api.GIVES),
    Dialect("sglang", "exactcheck.endpoints.sglang_api", sglang_api.SGLangEndpoint, sglang_api.detect, sglang_api.GIVES),
    Dialect("openai", "exactcheck.endpoints.openai_api", OpenAICompletionsEndpoint, None, dict(
        prompts="token ids", ids="choices[0].token_ids (vLLM return_token_ids), else logprobs (llama.cpp)",
        probabilities="raw (vLLM) or post-sampling (llama.cpp, --reference-probabilities); logprobs=N top lists",
        counters="server-wide /metrics (vLLM), per request timings (llama.cpp)",
        settings="/get_server_info (SGLang), /slots (llama.cpp)", cache_switch="cache_prompt (llama.cpp)")),
)}

APIS = ("auto", *DIALECTS)  # what --api takes: a new dialect is its module and its row above, nothing else


def detect_api(client: Client, base: str) -> str:
    """The dialect ``auto`` picks for ``base``: the first whose ``detect`` recognises it, else the fallback."""
    for dialect in DIALECTS.values():
        if dialect.detect is not None and dialect.detect(client, base):
            return dialect.name
    return next(d.name for d in DIALECTS.values() if d.detect is None)


def open_endpoint(api: str, base: str, client: Client, *, model: str | None = None,
                  reference_probabilities: str | None = None, declared=()) -> Endpoint:
    """The endpoint of ``api`` (``APIS``) at ``base``, checked (``Endpoint.check``: the server is up
    and answers that API); "auto": llama.cpp's native API where the server answers llama.cpp's
    ``/props``, mlx-lm's where it is mlx-lm's server (``mlx_lm_api.detect``), SGLang's ``/generate``
    where it answers SGLang's ``/get_model_info`` (``sglang_api.detect``), else OpenAI's.
    ``reference_probabilities``: what an OpenAI endpoint's logprobs are ("raw" or "post-sampling";
    default: raw, post-sampling on llama.cpp). ``declared``: the server settings the operator declares,
    ``NAME=VALUE`` each (``--server-setting``), checked against what the dialect takes (``declarable``)."""
    if api != "auto" and api not in DIALECTS:
        raise EndpointError(f"api {api!r}: expected one of {', '.join(('auto', *DIALECTS))}")
    if api == "auto":
        api = detect_api(client, base)
    endpoint = DIALECTS[api].endpoint(base, client, model=model, reference_kind=reference_probabilities)
    endpoint.declared = declared_settings(endpoint, declared)
    endpoint.check()
    return endpoint


def declared_settings(endpoint: Endpoint, declared) -> dict[str, str]:
    """``NAME=VALUE`` declarations (``--server-setting``) as a dict, each one the dialect takes
    (``Endpoint.declarable``); anything else is one line (``EndpointError``) before the audit starts."""
    out = {}
    for item in declared or ():
        name, sep, value = str(item).partition("=")
        name, value = name.strip(), value.strip()
        declarable = getattr(endpoint, "declarable", {})
        takes = declarable.get(name, {})
        if not sep or value not in takes:
            known = "; ".join(f"{n}={v}" for n, values in declarable.items() for v in values) or "none"
            raise EndpointError(f"--server-setting {item!r}: {endpoint.api} takes {known}")
        out[name] = value
    return out
