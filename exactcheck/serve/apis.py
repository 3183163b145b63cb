"""The APIs a serve audit speaks, and the one a URL gets: ``open_endpoint``."""
from __future__ import annotations

from exactcheck.serve.client import Client, EndpointError
from exactcheck.serve.endpoint import Endpoint
from exactcheck.serve.llama_cpp_api import LlamaCppEndpoint, is_llama_cpp
from exactcheck.serve.openai_api import OpenAICompletionsEndpoint

__all__ = ["APIS", "open_endpoint"]

APIS = ("auto", "llama.cpp", "openai")


def open_endpoint(api: str, base: str, client: Client, *, model: str | None = None,
                  reference_probabilities: str | None = None) -> Endpoint:
    """The endpoint of ``api`` (``APIS``) at ``base``, checked (``Endpoint.check``: the server is up
    and answers that API); "auto": llama.cpp's native API where the server answers llama.cpp's
    ``/props``, else OpenAI's. ``reference_probabilities``: what an OpenAI endpoint's logprobs are
    ("raw" or "post-sampling"; default: raw, post-sampling on llama.cpp)."""
    if api not in APIS:
        raise EndpointError(f"api {api!r}: expected one of {', '.join(APIS)}")
    if api == "auto":
        api = "llama.cpp" if is_llama_cpp(client, base) else "openai"
    endpoint = LlamaCppEndpoint(base, client, model=model) if api == "llama.cpp" else \
        OpenAICompletionsEndpoint(base, client, model=model, reference_kind=reference_probabilities)
    endpoint.check()
    return endpoint
