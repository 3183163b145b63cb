"""Tiny Llama models in Hugging Face's directory format, for servers that load one (vLLM, mlx-lm).

``write_llama(directory, seed)`` writes ``config.json``, ``model.safetensors`` and a local
word-level tokenizer (``tokenizer.json`` through transformers' ``PreTrainedTokenizerFast``; nothing
is downloaded): a random Llama with a head size vLLM's CPU attention takes (32), float32, built from
a seed, cached by its settings so a second run is instant. ``scale`` multiplies the LM head, so the
next-token laws are peaked enough to differ from uniform (a random init at the default scale is
close to uniform, where a wrong law would be hard to see).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["write_llama", "VOCAB"]

VOCAB = 64  # ids 0-2 special (<unk>, <s>, </s>), then w3 ... w63


def _cache_root() -> Path:
    return Path(os.environ.get("EXACTCHECK_CACHE") or Path.home() / ".cache" / "exactcheck") / "hf-llama"


def write_llama(directory: str | os.PathLike | None = None, seed: int = 0, *, layers: int = 2, hidden: int = 64,
                scale: float = 8.0) -> Path:
    """The model directory (written once per settings; ``directory`` None: under the cache)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(directory) if directory is not None else \
        _cache_root() / f"llama-v{VOCAB}-l{layers}-h{hidden}-x{scale:g}-seed{seed}"
    if (path / ".complete").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, head_dim=32,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         torch_dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path, safe_serialization=True)
    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)
    (path / ".complete").write_text(json.dumps({"seed": seed, "layers": layers, "hidden": hidden, "scale": scale}))
    return path
