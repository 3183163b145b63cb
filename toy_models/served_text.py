"""The toy served model's text-prompt dialects (``ToyServedModel(api=...)``, ``toy_models.served_lm``):
mlx-lm's server and llama-cpp-python's, as far as the audit reads them. Both take text prompts, read
into ids by the tokenizer of ``tokenizer_dir`` (a model directory: the word-level tokenizer of
``toy_models.hf_served_models.write_llama`` or the byte-level BPE of ``toy_models.bpe_models``; the
toy's ``vocab`` is that tokenizer's size), and sample with llama.cpp's order (top-k, top-p, min-p,
then temperature).

``api="mlx-lm"`` (mlx_lm/server.py 0.32.2: ``APIHandler``, ``validate_model_parameters``,
``generate_response``, ``_format_top_logprobs``): ``logprobs`` a bool (``logprobs: 1`` is a 400 before
anything is generated), ids back only as ``logprobs.content[*].id``, log-probabilities after the
penalties and before the sampler, ``top_logprobs`` <= 11 whose entries are the first of each unsorted
top list, no ``ignore_eos`` (an answer stops on the directory's end-of-text ids, included), no
counters, ``usage.prompt_tokens_details.cached_tokens`` (0: the toy has no prompt cache), ``GET
/v1/models`` listing the directory, ``Not Found`` as a plain 404 body. Penalties as mlx-lm's
processors apply them (``sample_utils.make_logits_processors``): each reads the last
``*_context_size`` (default 20) of the tokens it was handed, the repetition penalty sign-aware, the
presence penalty once per token present, the frequency penalty once per occurrence; the toy hands
them the whole prompt and the output (mlx-lm with ``--prompt-cache-size 0``).
``penalty_mutant="last_prompt_token"`` with a draft model hands them only the prompt's last token and
the output: what mlx-lm's ``speculative_generate_step`` does (its ``_prefill`` leaves one prompt token,
and the processors' ``prev_tokens`` start there), so a penalty over the prompt is lost under speculation.

``api="llama-cpp-python"`` (llama_cpp/server/app.py, llama.py 0.3.36): ``POST /v1/completions`` with
a text prompt (a list of ids is refused: pydantic's validation error comes back as HTTP 500), the
server's defaults for every field not sent (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
``repeat_penalty`` 1.1), ``<s>`` before the prompt, an answer
that stops on ``</s>`` without it (``finish_reason: "stop"``), and ``logprobs: N`` as
``Llama._create_completion`` writes it: raw log-probabilities (log-softmax of the logits, before the
sampler), ``tokens`` each token's text, ``top_logprobs`` a dict from text to log-probability over the
N most probable ids, where ids that share a text overwrite each other (the last, least probable one
wins) and the generated token's entry is written last; penalties over the output only (the sampler
chain is made per request and fed only what it samples). ``/openapi.json`` names the server ("🦙
llama.cpp Python API"); ``/extras/tokenize``; FastAPI's ``{"detail": "Not Found"}`` 404. Its
speculation is prompt-lookup (``drafter="ngram"``).
"""
from __future__ import annotations

import functools
import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["text_respond", "TEXT_APIS", "TextPenalties", "LCP_TITLE"]

TEXT_APIS = ("mlx-lm", "llama-cpp-python")
LCP_TITLE = "\U0001f999 llama.cpp Python API"
LCP_VERSION = "0.3.36"


@functools.lru_cache(maxsize=4)
def _tokenizer(directory: str):
    """The directory's tokenizer (``AutoTokenizer``) and its end-of-text ids (config.json's
    ``eos_token_id``, generation_config.json's when set, and the tokenizer's)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(directory)
    configs = [json.loads(f.read_text()) for f in (Path(directory) / "config.json",
                                                   Path(directory) / "generation_config.json") if f.is_file()]
    eos = next((c["eos_token_id"] for c in reversed(configs) if c.get("eos_token_id") is not None), None)
    ids = set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    if isinstance(tokenizer.eos_token_id, int):
        ids.add(tokenizer.eos_token_id)
    return tokenizer, frozenset(ids)


@functools.lru_cache(maxsize=4096)
def _encode(directory: str, text: str) -> tuple[int, ...]:
    return tuple(_tokenizer(directory)[0].encode(text))  # with the tokens the tokenizer adds (a BOS)


@functools.lru_cache(maxsize=4096)
def _decode(directory: str, ids: tuple[int, ...]) -> str:
    return _tokenizer(directory)[0].decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


@functools.lru_cache(maxsize=4)
def _token_texts(directory: str) -> tuple[str, ...]:
    """Each id's text as llama.cpp renders one token (``detokenize([id])``, special tokens as
    nothing) decoded as UTF-8 with the bytes that do not decode dropped: GPT-2's byte alphabet
    undone for a byte-level BPE."""
    tokenizer = _tokenizer(directory)[0]
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, n = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + n)] = b
            n += 1
    special = set(tokenizer.all_special_ids)
    texts = []
    for token in range(len(tokenizer)):
        name = tokenizer.convert_ids_to_tokens(token)
        if token in special or name is None:
            texts.append("")
        elif all(c in table for c in name):
            texts.append(bytes(table[c] for c in name).decode("utf-8", errors="ignore"))
        else:
            texts.append(name)
    return tuple(texts)


@dataclass(frozen=True)
class TextPenalties:
    """A request's penalties on a text-prompt server, applied to the target's logits before the
    sampler (float64, on logits of both signs as ``served_lm.Penalties`` does): each reads the last
    ``window`` tokens of its history, which is the context from ``start`` on (mlx-lm: the whole
    prompt, 0; under the ``last_prompt_token`` mutant the prompt's last token; llama-cpp-python: the
    output only, the prompt's length)."""

    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    windows: tuple[int, int, int] = (20, 20, 20)  # repetition, presence, frequency
    start: int = 0

    @property
    def on(self) -> bool:
        return self.repetition not in (0.0, 1.0) or bool(self.presence) or bool(self.frequency)

    def apply(self, p: np.ndarray, context: list[int]) -> np.ndarray:
        history = list(context)[self.start:]
        p = np.asarray(p, dtype=np.float64)
        with np.errstate(divide="ignore"):
            x = np.log(p)
        x = x - x[p > 0].mean()  # logits of both signs, as a model's are (served_lm.Penalties does the same)
        if self.repetition not in (0.0, 1.0):
            for t in set(history[len(history) - self.windows[0]:] if self.windows[0] else []):
                x[t] = x[t] * self.repetition if x[t] < 0 else x[t] / self.repetition
        if self.presence:
            for t in set(history[len(history) - self.windows[1]:] if self.windows[1] else []):
                x[t] -= self.presence
        if self.frequency:
            for t in (history[len(history) - self.windows[2]:] if self.windows[2] else []):
                x[t] -= self.frequency
        e = np.exp(x - x.max())
        return e / e.sum()


def text_respond(model, path: str, body: dict | None):
    """A GET or POST as ``model.api``'s server answers it."""
    if model.tokenizer_dir is None:
        raise ValueError(f"api={model.api!r} needs tokenizer_dir: a model directory whose tokenizer reads the text "
                         f"prompts")
    directory = str(Path(model.tokenizer_dir).resolve())
    tokenizer, eos = _tokenizer(directory)
    if len(tokenizer) != model.vocab:
        raise ValueError(f"the tokenizer of {directory} has {len(tokenizer)} tokens, the toy's vocab is {model.vocab}")
    if model.api == "mlx-lm":
        return _mlx_respond(model, directory, path, body)
    return _lcp_respond(model, directory, path, body)


def _raw_rows(model, prompt: list[int], tokens: list[int], penalties) -> list[np.ndarray]:
    """The log-probabilities a server reports for each generated token's position: the target's
    law after the context so far, after ``penalties`` where given (mlx-lm), float32."""
    rows, context = [], list(prompt)
    for token in tokens:
        row = model.row(model.target, context)
        if penalties is not None:
            row = penalties.apply(row, context)
        with np.errstate(divide="ignore"):
            rows.append(np.log(row).astype(np.float32))
        context.append(token)
    return rows


# --- mlx-lm's dialect

_MLX_POSTS = ("/v1/completions", "/v1/chat/completions", "/chat/completions")
# validate_model_parameters, in its order: (field, types, min, max, whitelist); bool is an int, as there
_MLX_CHECKS = (("stream", (bool,), None, None, ()), ("max_tokens", (int,), 1, None, ()),
               ("temperature", (float, int), 0, None, ()), ("top_p", (float, int), 0, 1, ()),
               ("top_k", (int,), 0, None, ()), ("min_p", (float, int), 0, 1, ()),
               ("repetition_penalty", (float, int), 0, None, ()), ("repetition_context_size", (int,), 0, None, ()),
               ("presence_penalty", (float, int), None, None, ()), ("presence_context_size", (int,), 0, None, ()),
               ("frequency_penalty", (float, int), None, None, ()), ("frequency_context_size", (int,), 0, None, ()),
               ("logprobs", (bool,), None, None, ()), ("top_logprobs", (int,), 0, 11, (-1,)),
               ("model", (str,), None, None, ()), ("seed", (int, type(None)), None, None, ()))
# the server's defaults (its command line's: --temp 0, --top-p 1, --top-k 0, --min-p 0, --max-tokens 512)
_MLX_DEFAULTS = dict(stream=False, max_tokens=512, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0,
                     repetition_penalty=0.0, repetition_context_size=20, presence_penalty=0.0, presence_context_size=20,
                     frequency_penalty=0.0, frequency_context_size=20, logprobs=False, top_logprobs=-1,
                     model="default_model", seed=None)


def _mlx_respond(model, directory: str, path: str, body: dict | None):
    if body is None:
        if path.startswith("/v1/models"):
            return 200, {"object": "list", "data": [{"id": directory, "object": "model", "created": 0}]}
        if path == "/health":
            return 200, {"status": "ok"}
        return 404, "Not Found"
    if path not in _MLX_POSTS:
        return 404, "Not Found"
    args = {name: body.get(name, default) for name, default in _MLX_DEFAULTS.items()}
    args["max_tokens"] = body.get("max_completion_tokens", args["max_tokens"])
    for name, types, low, high, allowed in _MLX_CHECKS:
        value = args[name]
        if not isinstance(value, types):
            shown = types[0].__name__ if len(types) == 1 else tuple(t.__name__ for t in types if t is not type(None))
            return 400, {"error": f"{'requested_model' if name == 'model' else name} must be of type {shown}"}
        if value is None or value in allowed:
            continue
        if low is not None and value < low:
            return 400, {"error": f"{name} must be at least {low}"}
        if high is not None and value > high:
            return 400, {"error": f"{name} must be at most {high}"}
    if path != "/v1/completions":
        return 404, {"error": "the toy serves mlx-lm's text completions only"}
    if "prompt" not in body:
        return 400, {"error": "Request did not contain a prompt"}
    tokenizer, eos = _tokenizer(directory)
    if args["model"] not in ("default_model", directory):  # the server would load that path
        return 404, {"error": f"Repository Not Found for url: {args['model']}"}
    if not isinstance(body["prompt"], str):  # tokenizer.encode refuses it inside generate: a 404
        return 404, {"error": "TextEncodeInput must be Union[TextInputSequence, Tuple[InputSequence, InputSequence]]"}
    prompt = list(_encode(directory, body["prompt"]))
    if not prompt:
        return 404, {"error": "[generate_step] the prompt is empty"}
    top_p = float(args["top_p"]) if 0 < args["top_p"] < 1 else 1.0  # make_sampler: top-p only inside (0, 1)
    penalties = TextPenalties(float(args["repetition_penalty"]), float(args["presence_penalty"]),
                              float(args["frequency_penalty"]), (args["repetition_context_size"],
                                                                 args["presence_context_size"],
                                                                 args["frequency_context_size"]),
                              # speculative_generate_step hands its processors the prompt's last token and the output
                              start=len(prompt) - 1 if model.penalty_mutant == "last_prompt_token"
                              and model.speculative else 0)
    penalties = penalties if penalties.on else None
    sampling = {"temperature": float(args["temperature"]), "top_k": int(args["top_k"]), "top_p": top_p,
                "min_p": float(args["min_p"])}
    if penalties is not None:
        sampling["penalties"] = penalties
    seed = args["seed"] if args["seed"] is not None else int(np.random.default_rng().integers(2 ** 31))
    tokens, _, _ = model.complete(prompt, int(args["max_tokens"]), sampling, int(seed))
    stop = next((i for i, t in enumerate(tokens) if t in eos), None)
    if stop is not None:
        tokens = tokens[:stop + 1]  # the end-of-text token is in the ids, not in the text
    choice = {"index": 0, "finish_reason": "length" if stop is None else "stop"}
    top_n = int(args["top_logprobs"])
    raws = _raw_rows(model, prompt, tokens, penalties)  # after the processors, before the sampler
    if top_n > 0:
        tops = []
        for raw in raws:  # _format_top_logprobs: argpartition's top top_n, unsorted
            ids = [int(i) for i in np.argpartition(-raw, top_n - 1)[:top_n]]
            names = tokenizer.convert_ids_to_tokens(ids)
            tops.append([{"id": i, "token": s, "logprob": float(raw[i])} for i, s in zip(ids, names)])
        choice["logprobs"] = {"content": [dict(top[0], top_logprobs=top) for top in tops]}
    elif args["logprobs"]:
        choice["logprobs"] = {"content": [{"id": int(t), "logprob": float(raw[t])} for t, raw in zip(tokens, raws)]}
    choice["text"] = _decode(directory, tuple(tokens[:stop] if stop is not None else tokens))
    return 200, {"id": f"cmpl-{uuid.uuid4()}", "system_fingerprint": "toy", "object": "text_completion",
                 "model": args["model"], "created": 0, "choices": [choice],
                 "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens),
                           "total_tokens": len(prompt) + len(tokens), "prompt_tokens_details": {"cached_tokens": 0}}}


# --- llama-cpp-python's dialect

# CreateCompletionRequest's defaults (llama_cpp/server/types.py) for the fields the toy reads
_LCP_DEFAULTS = dict(max_tokens=16, temperature=0.8, top_p=0.95, min_p=0.05, top_k=40, repeat_penalty=1.1,
                     presence_penalty=0.0, frequency_penalty=0.0, seed=None, logprobs=None, stream=False)
_LCP_LAST_N = 64  # the server's last_n_tokens_size


def _lcp_respond(model, directory: str, path: str, body: dict | None):
    tokenizer, eos = _tokenizer(directory)
    if body is None:
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": f"toy-{Path(directory).name}", "object": "model",
                                                     "owned_by": "me", "permissions": []}]}
        if path == "/openapi.json":
            return 200, {"openapi": "3.1.0", "info": {"title": LCP_TITLE, "version": LCP_VERSION},
                         "paths": {p: {} for p in ("/v1/completions", "/v1/chat/completions", "/v1/models",
                                                   "/extras/tokenize", "/extras/detokenize")}}
        return 404, {"detail": "Not Found"}
    if path == "/extras/tokenize":
        return 200, {"tokens": list(_encode(directory, str(body.get("input", ""))))}
    if path == "/extras/detokenize":
        pieces = b"".join(bytes(_token_texts(directory)[t], "utf-8") for t in body.get("tokens") or [])
        return 200, {"text": pieces.decode("utf-8")}
    if path != "/v1/completions":
        return 404, {"detail": "Not Found"}
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt) and len(prompt) <= 1:
        prompt = prompt[0] if prompt else ""
    if not isinstance(prompt, str):  # pydantic refuses it (Union[str, List[str]]), and the server answers 500
        return 500, {"error": {"message": "4 validation errors: {'type': 'string_type', 'loc': ('body', 'prompt', "
                                          "'str'), 'msg': 'Input should be a valid string'}",
                               "type": "internal_server_error", "param": None, "code": None}}
    args = {k: body.get(k, v) if body.get(k) is not None or k in ("seed", "logprobs") else v
            for k, v in _LCP_DEFAULTS.items()}
    ids = list(_encode(directory, prompt)) if prompt else []
    n = max(1, int(args["max_tokens"]))
    history_start = len(ids)  # the sampler chain is fed only what it samples
    penalties = TextPenalties(float(args["repeat_penalty"]), float(args["presence_penalty"]),
                              float(args["frequency_penalty"]), (_LCP_LAST_N,) * 3, start=history_start)
    temperature = float(args["temperature"])
    sampling = {"temperature": max(temperature, 0.0), "top_k": int(args["top_k"]), "top_p": float(args["top_p"]),
                "min_p": float(args["min_p"])}
    if penalties.on:
        sampling["penalties"] = penalties
    seed = args["seed"] if args["seed"] is not None else int(np.random.default_rng().integers(2 ** 31))
    tokens, drafted, accepted = model.complete(ids, n, sampling, int(seed))
    stop = next((i for i, t in enumerate(tokens) if t in eos), None)
    finish = "length"
    if stop is not None:
        tokens, finish = tokens[:stop], "stop"  # the end-of-text token is not returned
    texts = _token_texts(directory)
    choice = {"text": _decode(directory, tuple(tokens)), "index": 0, "logprobs": None, "finish_reason": finish}
    if args["logprobs"] is not None:
        top_n = int(args["logprobs"])
        rows = _raw_rows(model, ids, tokens, None)  # raw: the logits before the sampler
        entries, tops = [], []
        for token, raw in zip(tokens, rows):
            order = sorted(zip(raw.tolist(), range(raw.size)), reverse=True)[:top_n]
            top = {texts[i]: lp for lp, i in order}  # ids sharing a text overwrite each other
            top.update({texts[token]: float(raw[token])})
            entries.append(float(raw[token]))
            tops.append(top)
        choice["logprobs"] = {"tokens": [texts[t] for t in tokens], "text_offset": [len(prompt)] * len(tokens),
                              "token_logprobs": entries, "top_logprobs": tops}
    return 200, {"id": f"cmpl-{uuid.uuid4()}", "object": "text_completion", "created": 0,
                 "model": f"toy-{Path(directory).name}", "choices": [choice],
                 "usage": {"prompt_tokens": len(ids), "completion_tokens": len(tokens),
                           "total_tokens": len(ids) + len(tokens)}}
