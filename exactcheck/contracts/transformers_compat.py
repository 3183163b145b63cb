"""Everything that differs between the transformers releases exactcheck supports, in one place.

Supported: the last 4.x line (4.57) and every 5.x release (tested: 4.57.6, 5.17.0, 5.24.0). What
moved between them and is handled here:

* The cache argument of a model's ``forward`` and the cache field of its outputs: ``cache``
  from 5.2x, ``past_key_values`` before. Passing ``cache=`` to a 5.17 model is *silently*
  swallowed by its ``**kwargs`` (the model then runs with no cache at all), so every call that
  hands a model a cache goes through :func:`forward`.
* The output dataclasses (``CausalLMOutputWithPast``, ``generate``'s outputs) carry the cache
  under the same two names: :func:`causal_lm_output`, :func:`output_cache`.

Only this module looks at the version; the rest of the code asks it.
"""
from __future__ import annotations

import functools

__all__ = ["TRANSFORMERS_FLOOR", "cache_argument", "forward", "causal_lm_output", "output_cache",
           "given_cache", "new_cache", "require_supported"]

TRANSFORMERS_FLOOR = (4, 57)


def _version() -> tuple[int, int]:
    import transformers
    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def require_supported() -> None:
    """Raise ImportError, in one line, if the installed transformers is older than the floor."""
    import transformers
    if _version() < TRANSFORMERS_FLOOR:
        floor = ".".join(map(str, TRANSFORMERS_FLOOR))
        raise ImportError(f"exactcheck needs transformers>={floor}; this environment has "
                          f"{transformers.__version__} (pip install 'transformers>={floor}')")


@functools.lru_cache(maxsize=None)
def cache_argument() -> str:
    """The name a model's ``forward`` takes its cache under, and outputs carry it under."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def forward(model, input_ids, cache=None, **kwargs):
    """``model(input_ids=..., <cache argument>=cache, **kwargs)`` under this transformers."""
    if cache is not None:
        kwargs[cache_argument()] = cache
    return model(input_ids=input_ids, **kwargs)


def causal_lm_output(logits, cache):
    """A ``CausalLMOutputWithPast`` holding ``logits`` and ``cache``."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    return CausalLMOutputWithPast(logits=logits, **{cache_argument(): cache})


def output_cache(output):
    """The cache an output (a forward's or ``generate``'s) carries, or None."""
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None


def given_cache(cache=None, past_key_values=None):
    """The cache a ``forward`` was handed, under either name (for models we define)."""
    return cache if cache is not None else past_key_values


def new_cache():
    """An empty ``DynamicCache``."""
    from transformers import DynamicCache
    return DynamicCache()


def has_ensemble_weight() -> bool:
    """Whether ``generate`` takes ``assistant_ensemble_weight`` (5.x; absent in 4.57)."""
    from transformers import GenerationConfig
    return hasattr(GenerationConfig(), "assistant_ensemble_weight")


def require_ensemble_weight() -> None:
    import transformers
    if not has_ensemble_weight():
        raise ImportError(f"transformers {transformers.__version__} has no assistant_ensemble_weight "
                          "(it arrived with the 5.x releases)")


def prompt_lookup_kwargs(has_stop_tokens: bool, model=None) -> dict:
    """Extra ``generate`` arguments prompt-lookup decoding needs on this release: 4.x's
    candidate generator calls ``isin(ids, eos_token_id)`` and crashes when there is no EOS, so
    it is handed an empty EOS list (no token stops generation; the law is unchanged). With an
    empty EOS list, 4.x's ``_prepare_special_tokens`` takes the pad token from ``eos[0]`` when
    the model has none (generation/utils.py in 4.57.6) and crashes, so such a model is also
    handed pad token 0: a single row without EOS is never padded, so no token changes."""
    if has_stop_tokens or _version() >= (5, 0):
        return {}
    extra: dict = {"eos_token_id": []}
    config = getattr(model, "generation_config", None)
    if getattr(config, "pad_token_id", None) is None:
        extra["pad_token_id"] = 0
    return extra
