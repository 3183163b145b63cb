"""Tiny models with a byte-level BPE tokenizer trained locally, as every real model ships one.

The WordLevel tokenizer of ``toy_models.hf_served_models.write_llama`` reads every sequence of ids
back as itself (a word per id, joined by spaces). A byte-level BPE tokenizer does not: the ids
``t`` ``he`` decode to ``the``, which encodes to the single id ``the``; a lone byte of a multi-byte
character decodes to no text at all. A text-prompt server (mlx-lm, llama-cpp-python) can therefore
not be sent every context a law expansion wants, and logprobs keyed by a token's text name several
ids with one string. These models make both happen on purpose.

- ``train_bpe(vocab_size)``: a byte-level BPE (``tokenizers.trainers.BpeTrainer``: the 256-byte
  alphabet, ``<s>`` and ``</s>``, then merges learnt from ``CORPUS``, a few English paragraphs
  written here), GPT-2's pre-tokenizer and decoder, ``<s>`` added before a text
  (``TemplateProcessing``). Deterministic: the same call gives the same ``tokenizer.json``.
- ``write_bpe_llama(seed)``: a Hugging Face Llama directory with that tokenizer (for mlx-lm, and
  the toy served model's text dialects); ``write_bpe_llama_draft(target)``: its draft.
- ``write_bpe_gguf(seed)``: a GGUF Llama with the same vocabulary as llama.cpp reads a GPT-2 BPE
  (``tokenizer.ggml.model = "gpt2"``, the merges, ``tokenizer.ggml.pre = "gpt-2"``), weights from
  ``toy_models.gguf_models`` (for llama-cpp-python's server), beside its tokenizer directory
  (``bpe_tokenizer_dir``: the ``tokenizer.json`` the audit reads string-keyed logprobs through).

Everything is written once per settings under ``${EXACTCHECK_CACHE:-~/.cache/exactcheck}``. Nothing
is downloaded.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from toy_models.cache_lock import cache_lock

__all__ = ["CORPUS", "BPE_VOCAB", "train_bpe", "write_bpe_llama", "write_bpe_llama_draft", "write_bpe_gguf",
           "bpe_tokenizer_dir", "BOS", "EOS"]

BPE_VOCAB = 320  # 2 special tokens, 256 bytes, 62 merges
BOS, EOS = 0, 1  # <s>, </s>: the first ids the trainer gives its special tokens
FORMAT = 1  # bump when what is written changes

# a few paragraphs (written for these tests, any English would do): the merges the trainer learns
CORPUS = """\
Once upon a time there was a little town by the sea. The people of the town went out in their boats
every morning and came back in the evening with fish, and the children ran down to the water to meet
them. There was a baker who made the best bread in the land, and a teacher who told the children
stories about the stars. In the winter the wind came in from the sea, and the houses were warm with
fires. In the summer the fields were green and the days were long.
The quick brown fox jumps over the lazy dog. The dog did not mind; it was a warm day and the dog was
tired. Then the fox ran into the forest, where the trees were tall and the light was green.
One, two, three, four, five: the numbers went on and on. 1, 2, 3, 4, 5, 6, 7, 8, 9, 10.
Café, naïve, façade, résumé: words that came from another language keep their accents.
"""


def _cache_root() -> Path:
    return Path(os.environ.get("EXACTCHECK_CACHE") or Path.home() / ".cache" / "exactcheck") / "bpe-models"


def train_bpe(vocab_size: int = BPE_VOCAB):
    """A byte-level BPE ``tokenizers.Tokenizer`` learnt from ``CORPUS`` (see the module's docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                             special_tokens=[("<s>", BOS)])
    assert tokenizer.token_to_id("<s>") == BOS and tokenizer.token_to_id("</s>") == EOS
    return tokenizer


def bpe_tokenizer_dir(vocab_size: int = BPE_VOCAB) -> Path:
    """A directory holding only the tokenizer (``tokenizer.json`` and its config), written once."""
    path = _cache_root() / f"tokenizer-v{vocab_size}-f{FORMAT}"
    if not (path / ".complete").exists():
        with cache_lock(path):  # one writer at a time (toy_models.cache_lock)
            if not (path / ".complete").exists():
                _save_tokenizer(path, vocab_size)
                (path / ".complete").write_text(json.dumps({"vocab_size": vocab_size}))
    return path


def _save_tokenizer(path: Path, vocab_size: int) -> int:
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = train_bpe(vocab_size)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   clean_up_tokenization_spaces=False)
    fast.save_pretrained(path)
    return tokenizer.get_vocab_size()


def write_bpe_llama(seed: int = 0, *, layers: int = 2, hidden: int = 64, scale: float = 3.0,
                    vocab_size: int = BPE_VOCAB) -> Path:
    """A random Llama (float32, head size 32, LM head times ``scale``) with the BPE tokenizer, in
    Hugging Face's directory format; ``eos_token_id`` is ``</s>``. Written once per settings."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = _cache_root() / f"llama-v{vocab_size}-l{layers}-h{hidden}-x{scale:g}-seed{seed}-f{FORMAT}"
    if (path / ".complete").exists():
        return path
    with cache_lock(path):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
        if (path / ".complete").exists():
            return path
        size = _save_tokenizer(path, vocab_size)
        config = LlamaConfig(vocab_size=size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                             num_attention_heads=hidden // 32, num_key_value_heads=hidden // 32, head_dim=32,
                             max_position_embeddings=512, bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False,
                             torch_dtype="float32")
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
        with torch.no_grad():
            model.lm_head.weight.mul_(scale)
            model.lm_head.weight[EOS].mul_(0.25)  # </s> possible but not frequent: most answers run to their length
        model.save_pretrained(path, safe_serialization=True)
        (path / ".complete").write_text(json.dumps({"seed": seed, "layers": layers, "hidden": hidden, "scale": scale}))
    return path


def write_bpe_llama_draft(target: str | os.PathLike, noise: float = 0.5, seed: int = 1) -> Path:
    """A draft for ``write_bpe_llama``'s ``target``: the same architecture and tokenizer, every weight
    moved by relative Gaussian noise ``noise``. Written beside the target, once per settings."""
    import shutil

    from toy_models.hf_served_models import save_noised

    target = Path(target)
    path = target.with_name(f"{target.name}-draft-noise{noise:g}-seed{seed}")
    if (path / ".complete").exists():
        return path
    with cache_lock(path):  # one writer at a time (toy_models.cache_lock); a waiter finds it written
        if (path / ".complete").exists():
            return path
        save_noised(target, path, noise, seed)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (target / name).is_file():
                shutil.copy(target / name, path / name)
        (path / ".complete").write_text(json.dumps({"target": target.name, "noise": noise, "seed": seed}))
    return path


def write_bpe_gguf(seed: int = 0, vocab_size: int = BPE_VOCAB) -> Path:
    """A GGUF Llama (``toy_models.gguf_models``' weights and shape, vocabulary the BPE tokenizer's)
    that llama.cpp tokenizes as a GPT-2 BPE; ``<s>`` added before a prompt, ``</s>`` its end of text.
    Its tokenizer directory: ``bpe_tokenizer_dir(vocab_size)``. Written once per settings."""
    import tempfile

    import gguf

    from toy_models.gguf_models import GGUFConfig, _tensor_order, _weights

    path = _cache_root() / f"llama-v{vocab_size}-seed{seed}-f{FORMAT}.gguf"
    if path.is_file():
        return path
    tokenizer = train_bpe(vocab_size)
    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
              for m in json.loads(tokenizer.to_str())["model"]["merges"]]
    config = GGUFConfig(vocab_size=len(tokens), special_shift=3.0)
    # gguf_models pushes its ids 0-3 down (its special tokens); here ids 0-1 are <s>, </s> and 2-3 two bytes
    target, _ = _weights(config, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        c = config
        w.add_name(f"exactcheck-bpe-{vocab_size}-seed{seed}")
        w.add_context_length(c.context_length)
        w.add_embedding_length(c.n_embd)
        w.add_block_count(c.n_layer)
        w.add_feed_forward_length(c.n_ff)
        w.add_head_count(c.n_head)
        w.add_head_count_kv(c.n_head_kv)
        w.add_layer_norm_rms_eps(c.rms_eps)
        w.add_rope_dimension_count(c.n_embd // c.n_head)
        w.add_rope_freq_base(c.rope_freq_base)
        w.add_vocab_size(len(tokens))
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types([3 if i in (BOS, EOS) else 1 for i in range(len(tokens))])  # control, normal
        w.add_token_merges(merges)
        w.add_bos_token_id(BOS)
        w.add_eos_token_id(EOS)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        for name in sorted(target, key=_tensor_order):
            w.add_tensor(name, target[name])
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
