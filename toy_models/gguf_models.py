"""Tiny Llama-architecture GGUF models written locally, for auditing a real llama.cpp server.

Nothing is downloaded: the weights are random, drawn from a seed, and the files are written with
the ``gguf`` package (``pip install 'exactcheck[serve]'``). A *pair* is a target model and a draft
model sharing one vocabulary, so llama.cpp's draft-model speculation accepts them
(``common_speculative_are_compatible``: same vocabulary type, size, special tokens and texts).

The vocabulary (64 tokens by default, SentencePiece type ``tokenizer.ggml.model = "llama"``) is::

    0 <unk>   1 <s>   2 </s>   3 <0x0A> (newline byte)   4 ▁ (space)
    5.. the letters a-z, A-Z, then digits, then t000-style fillers up to the size

so every prompt can be given as token ids (``"prompt": [5, 6, 7]`` on ``/completion``) and every
completion reads back as short text. ``add_bos_token`` is false: a token-id prompt is used as it is.

The draft is the target with noise: it shares the target's embeddings and output head exactly and
keeps the first ``draft_layers`` of the target's blocks, perturbed by ``draft_noise``. With the
blocks' weights small beside the embeddings (``block_scale``), the draft's next-token law is close to
the target's but not equal, so drafts are accepted often but not always. ``output_scale`` sets how
peaked the next-token law is: with the defaults the top token's probability at temperature 1 has
deciles 0.22 / 0.39 (median) / 0.89 over random prompts, the special tokens 0-3 share at most ~1e-3
(``special_shift``), and a rejection-sampled draft token is accepted ~60 % of the time
(measured in docs/serving-llama-cpp.md).

Files are cached by (config, seed, format version) under
``${EXACTCHECK_CACHE:-~/.cache/exactcheck}/gguf-models/``: the same call twice writes once.
Writing is deterministic: the same config and seed give byte-identical files.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np

FORMAT_VERSION = 1  # bump when the layout of written files changes, so old cache entries are not reused

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<0x0A>", "\u2581")
UNK_ID, BOS_ID, EOS_ID, NEWLINE_ID, SPACE_ID = range(5)
FIRST_WORD_ID = 5

# /v1/chat/completions: the messages' contents, one after another, with nothing added. The SPM
# tokenizer turns a character outside the vocabulary into a byte token, and llama.cpp answers an error
# (HTTP 400 "unordered_map::at") when that byte token is missing too: text must use the vocabulary.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# a template that adds tokens of its own (role names, newlines, the generation prompt), in the same
# vocabulary: `llama-server --jinja --chat-template-file FILE` with it (the chat audit's tests)
ROLE_CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }} {{ message['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant {% endif %}")

# llama.cpp's token types (llama_token_type / gguf.TokenType)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


@dataclasses.dataclass(frozen=True)
class GGUFConfig:
    """The shape and character of a tiny Llama model pair."""

    vocab_size: int = 64
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_layer: int = 2
    draft_layers: int = 1
    context_length: int = 512
    rms_eps: float = 1e-5
    rope_freq_base: float = 10000.0
    block_scale: float = 0.5  # a block's weights relative to Xavier scale: how far it moves the residual
    output_scale: float = 3.0  # standard deviation of the logits at the output head, roughly
    draft_noise: float = 0.35  # relative noise added to the draft's copies of the target's blocks
    special_shift: float = 3.0  # pushes <unk>, <s>, </s> and the newline byte down (about -10 logits); 0: off
    # lifts </s> back up (its output row reads the constant dimension with this weight instead): 0, off,
    # keeps it rare; about 1 gives it a few percent per token, so answers end inside a short window
    eos_lift: float = 0.0
    dtype: str = "f32"  # "f32" or "f16" for the 2-D weights (norms stay f32, as llama.cpp wants)

    def __post_init__(self):
        if self.vocab_size < 8 or self.vocab_size > 4096:
            raise ValueError("vocab_size must be in [8, 4096]")
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("n_embd must divide by n_head, and n_head by n_head_kv")
        if not 1 <= self.draft_layers <= self.n_layer:
            raise ValueError("draft_layers must be in [1, n_layer]")
        if self.dtype not in ("f32", "f16"):
            raise ValueError("dtype must be 'f32' or 'f16'")

    def key(self, seed: int) -> str:
        blob = json.dumps({"config": dataclasses.asdict(self), "seed": int(seed),
                           "format": FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def vocabulary(vocab_size: int = 64) -> list[str]:
    """The token texts, id by id."""
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    words += [str(d) for d in range(10)]
    tokens = list(SPECIAL_TOKENS) + words
    i = 0
    while len(tokens) < vocab_size:
        tokens.append(f"t{i:03d}")
        i += 1
    return tokens[:vocab_size]


def cache_dir() -> Path:
    root = os.environ.get("EXACTCHECK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "exactcheck")
    return Path(root) / "gguf-models"


def _weights(config: GGUFConfig, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(target tensors, draft tensors), numpy arrays in the gguf package's (rows=out, cols=in) layout."""
    rng = np.random.default_rng([int(seed), 0x6767_7566])
    c = config
    d, f, v = c.n_embd, c.n_ff, c.vocab_size
    head_dim = d // c.n_head
    d_kv = head_dim * c.n_head_kv

    def mat(rows, cols, scale=1.0):
        return (rng.standard_normal((rows, cols)) * (scale / np.sqrt(cols))).astype(np.float32)

    embd = rng.standard_normal((v, d)).astype(np.float32)
    out = mat(v, d, c.output_scale)
    if c.special_shift:
        # dimension 0 carries a constant the blocks barely move, and the special tokens' output rows
        # read it negatively: they stay possible but rare (llama.cpp's EOS would end a completion)
        embd[:, 0] = np.float32(c.special_shift)
        out[:, 0] = 0.0
        out[:NEWLINE_ID + 1, 0] = np.float32(-c.special_shift)
        if c.eos_lift:
            out[EOS_ID, 0] = np.float32(c.eos_lift)
    shared = {
        # unit-variance embeddings: the residual stream starts at norm ~ sqrt(n_embd)
        "token_embd.weight": embd,
        "output_norm.weight": np.ones(d, dtype=np.float32),
        # after the final RMSNorm the hidden state has unit RMS, so logits ~ N(0, output_scale^2)
        "output.weight": out,
    }
    blocks = []
    for _ in range(c.n_layer):
        s = c.block_scale
        blocks.append({
            "attn_norm.weight": np.ones(d, dtype=np.float32),
            "attn_q.weight": mat(d, d, 1.0),
            "attn_k.weight": mat(d_kv, d, 1.0),
            "attn_v.weight": mat(d_kv, d, 1.0),
            "attn_output.weight": mat(d, d, s),  # moves the unit-RMS residual by ~ block_scale
            "ffn_norm.weight": np.ones(d, dtype=np.float32),
            "ffn_gate.weight": mat(f, d, 1.0),
            "ffn_up.weight": mat(f, d, 1.0),
            "ffn_down.weight": mat(d, f, s),
        })
    target = dict(shared)
    for i, blk in enumerate(blocks):
        for name, w in blk.items():
            target[f"blk.{i}.{name}"] = w
    draft = dict(shared)
    for i in range(c.draft_layers):
        for name, w in blocks[i].items():
            if w.ndim == 2 and c.draft_noise > 0:
                noise = rng.standard_normal(w.shape).astype(np.float32) * np.float32(c.draft_noise) * w.std()
                w = (w + noise).astype(np.float32)
            draft[f"blk.{i}.{name}"] = w
    return target, draft


def _write(path: Path, config: GGUFConfig, tensors: dict[str, np.ndarray], n_layer: int, name: str) -> None:
    import gguf  # the optional dependency: exactcheck[serve]

    c = config
    tokens = vocabulary(c.vocab_size)
    types = [_UNKNOWN, _CONTROL, _CONTROL, _BYTE, _NORMAL] + [_NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    scores = [0.0] * len(SPECIAL_TOKENS) + [-float(i) for i in range(len(tokens) - len(SPECIAL_TOKENS))]

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, "llama")
        w.add_name(name)
        w.add_context_length(c.context_length)
        w.add_embedding_length(c.n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(c.n_ff)
        w.add_head_count(c.n_head)
        w.add_head_count_kv(c.n_head_kv)
        w.add_layer_norm_rms_eps(c.rms_eps)
        w.add_rope_dimension_count(c.n_embd // c.n_head)
        w.add_rope_freq_base(c.rope_freq_base)
        w.add_vocab_size(c.vocab_size)
        w.add_file_type(gguf.LlamaFileType.ALL_F32 if c.dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(UNK_ID)
        w.add_bos_token_id(BOS_ID)
        w.add_eos_token_id(EOS_ID)
        w.add_add_bos_token(False)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
        # the chat endpoints need a template; this one only uses characters of the vocabulary
        w.add_chat_template(CHAT_TEMPLATE)
        for tname in sorted(tensors, key=_tensor_order):
            arr = tensors[tname]
            if c.dtype == "f16" and arr.ndim == 2:
                arr = arr.astype(np.float16)
            w.add_tensor(tname, arr)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _tensor_order(name: str):
    if name.startswith("blk."):
        _, i, rest = name.split(".", 2)
        return (1, int(i), rest)
    return (0 if name == "token_embd.weight" else 2, 0, name)


def write_pair(directory: str | os.PathLike | None = None, seed: int = 0,
               config: GGUFConfig | None = None) -> tuple[Path, Path]:
    """Write (or find cached) a target and a draft GGUF model; return (target_path, draft_path).

    ``directory`` defaults to the cache (``cache_dir()``); files are named by a hash of the config,
    the seed and FORMAT_VERSION, so an existing pair is returned without writing anything.
    """
    config = config or GGUFConfig()
    out = Path(directory) if directory is not None else cache_dir()
    key = config.key(seed)
    target_path = out / f"target-{key}.gguf"
    draft_path = out / f"draft-{key}.gguf"
    if target_path.is_file() and draft_path.is_file():
        return target_path, draft_path
    target, draft = _weights(config, seed)
    _write(target_path, config, target, config.n_layer, f"exactcheck-target-{key}")
    _write(draft_path, config, draft, config.draft_layers, f"exactcheck-draft-{key}")
    return target_path, draft_path


def write_target(directory: str | os.PathLike | None = None, seed: int = 0,
                 config: GGUFConfig | None = None) -> Path:
    """The target model of ``write_pair`` alone."""
    return write_pair(directory, seed, config)[0]


__all__ = ["GGUFConfig", "write_pair", "write_target", "vocabulary", "cache_dir",
           "UNK_ID", "BOS_ID", "EOS_ID", "NEWLINE_ID", "SPACE_ID", "FIRST_WORD_ID", "FORMAT_VERSION"]
