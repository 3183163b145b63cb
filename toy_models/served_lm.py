"""A served toy language model with exact laws: a llama.cpp-shaped HTTP server on 127.0.0.1.

The serve audit's own world: what a served model looks like from outside (``/health``, ``/props``,
``/tokenize``, ``POST /completion`` with token-id prompts, ``n_probs`` and
``post_sampling_probs``, ``timings.draft_n``), over a context toy LM whose next-token law is a
table we own, so every law the audit derives from it is known exactly. It samples with
llama.cpp's sampler order (top-k, top-p, min-p, then temperature) and, when ``speculative``,
drafts ``draft_max`` tokens from a draft table and verifies them by rejection sampling with the
exact residual (lossless), reporting its drafts as llama.cpp does. Randomness comes from the
request's seed only. Every request is counted per path (``requests``), so a test can count what
reached the server.

It speaks three APIs (``api``): ``"llama.cpp"`` (the native ``/completion`` and llama.cpp's
``/v1/completions``: ids only inside ``logprobs.content``, ``post_sampling_probs`` honoured,
``timings`` per request), and ``"vllm"`` (``/v1/models``, ``/v1/completions`` only: ``token_ids`` with
``return_token_ids``, raw logprobs in the legacy format keyed ``"token_id:N"`` with
``return_tokens_as_token_ids``, speculation counters server-wide in ``/metrics``, no ``/props``),
as vLLM documents them; ``server_info`` adds SGLang's ``/get_server_info``.

For tests and measurements only: it listens on 127.0.0.1, serves until stopped, and each request
is bounded by its ``n_predict``.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

__all__ = ["ToyServedModel", "served_model", "sampler_chain", "respond"]


def sampler_chain(probs: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0) -> np.ndarray:
    """llama.cpp's order: top-k, top-p, min-p on the raw probabilities, then temperature on what
    is left (float64); temperature 0 is the argmax (lowest id on a tie)."""
    p = np.asarray(probs, dtype=np.float64)
    keep = p > 0
    order = np.lexsort((np.arange(p.size), -p))  # descending probability, then id
    if top_k and top_k < p.size:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        sorted_p = np.where(keep[order], p[order], 0.0)
        cumulative = np.cumsum(sorted_p) / sorted_p.sum()
        cut = int(np.searchsorted(cumulative, top_p)) + 1  # the token that crosses top_p is kept
        keep[order[cut:]] = False
    if min_p > 0:
        keep &= p >= min_p * p[keep].max()
    if temperature <= 0:
        out = np.zeros_like(p)
        out[order[np.argmax(keep[order])]] = 1.0
        return out
    logits = np.where(keep, np.log(np.where(keep, p, 1.0)) / temperature, -np.inf)
    logits -= logits[keep].max()
    out = np.where(keep, np.exp(logits), 0.0)
    return out / out.sum()


@dataclass
class ToyServedModel:
    """Next-token laws that depend on the last token (a bigram table, ``vocab`` x ``vocab``, row
    ``vocab`` for the empty context), peaked by ``sharpness``; a draft table near it."""

    vocab: int = 12
    seed: int = 0
    sharpness: float = 2.0
    draft_noise: float = 0.6
    speculative: bool = True
    draft_max: int = 3
    api: str = "llama.cpp"  # or "vllm"
    server_info: dict | None = None  # SGLang's /get_server_info, when set
    # "model": drafts from the draft table at every step; "ngram": prompt lookup, drafting only
    # where the last ``ngram`` tokens occurred earlier in the context (the tokens that followed
    # them, as a deterministic proposal: rarely on contexts that do not repeat)
    drafter: str = "model"
    ngram: int = 2
    target: np.ndarray = field(init=False, repr=False)
    draft: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        logits = rng.normal(size=(self.vocab + 1, self.vocab)) * self.sharpness
        self.target = _softmax(logits)
        self.draft = _softmax(logits + rng.normal(size=logits.shape) * self.draft_noise)
        self.totals = [0, 0]  # drafted, accepted: vLLM's /metrics counters
        self.lock = threading.Lock()

    def as_draft(self) -> "ToyServedModel":
        """The draft model served on its own: its table as the target, no speculation."""
        other = self.as_plain()
        other.target = self.draft
        return other

    def as_plain(self) -> "ToyServedModel":
        """The same target without speculation."""
        return ToyServedModel(self.vocab, self.seed, self.sharpness, self.draft_noise, speculative=False, api=self.api,
                              drafter=self.drafter, ngram=self.ngram)

    def row(self, table: np.ndarray, context: list[int]) -> np.ndarray:
        return table[context[-1] if context else self.vocab]

    def law(self, context: list[int], sampling: dict) -> np.ndarray:
        return sampler_chain(self.row(self.target, context), **sampling)

    def _propose(self, context: list[int], k: int, sampling: dict, rng) -> tuple[list[int], list[np.ndarray]]:
        """Up to ``k`` draft tokens and the law each was drawn from (one-hot for prompt lookup)."""
        if self.drafter == "ngram":
            n = self.ngram
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # the latest earlier occurrence
                if context[start:start + n] == tail:
                    proposal = context[start + n:start + n + k]
                    return proposal, [np.eye(self.vocab)[x] for x in proposal]
            return [], []
        proposal, q_rows, draft_context = [], [], list(context)
        for _ in range(k):
            q = sampler_chain(self.row(self.draft, draft_context), **sampling)
            x = _sample(q, rng)
            proposal.append(x)
            q_rows.append(q)
            draft_context.append(x)
        return proposal, q_rows

    def complete(self, prompt: list[int], n_predict: int, sampling: dict, seed: int) -> tuple[list[int], int, int]:
        """(tokens, drafts proposed, drafts accepted): the first token from the target, the rest by
        speculation when ``speculative`` (exact), else from the target one by one."""
        rng = np.random.default_rng(seed)
        context, out, drafted, accepted = list(prompt), [], 0, 0
        while len(out) < n_predict:
            if not self.speculative or not out or sampling["temperature"] <= 0:
                token = _sample(self.law(context, sampling), rng)
                out.append(token)
                context.append(token)
                continue
            k = min(self.draft_max, n_predict - len(out))
            proposal, q_rows = self._propose(context, k, sampling, rng)
            if not proposal:  # nothing to draft here (n-gram: the context does not repeat)
                token = _sample(self.law(context, sampling), rng)
                out.append(token)
                context.append(token)
                continue
            drafted += len(proposal)
            for x, q in zip(proposal, q_rows):
                p = self.law(context, sampling)
                if rng.random() < min(1.0, p[x] / q[x]):
                    accepted += 1
                    out.append(x)
                    context.append(x)
                    continue
                residual = np.maximum(p - q, 0.0)
                token = _sample(residual / residual.sum(), rng)
                out.append(token)
                context.append(token)
                break
            else:  # every draft accepted: the bonus token
                if len(out) < n_predict:
                    token = _sample(self.law(context, sampling), rng)
                    out.append(token)
                    context.append(token)
        with self.lock:
            self.totals[0] += drafted
            self.totals[1] += accepted
        return out[:n_predict], drafted, accepted


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sample(p: np.ndarray, rng: np.random.Generator) -> int:
    return int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right"), p.size - 1))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    model: ToyServedModel
    requests: Counter


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, data) -> None:
        text = isinstance(data, str)
        body = (data if text else json.dumps(data)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4" if text else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.server.requests[self.path] += 1
        self._reply(*respond(self.server.model, self.path, None))

    def do_POST(self):
        self.server.requests[self.path] += 1
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except ValueError:
            return self._reply(400, {"error": "not JSON"})
        self._reply(*respond(self.server.model, self.path, body))


def respond(model: ToyServedModel, path: str, body: dict | None) -> tuple[int, dict | list | str]:
    """(HTTP status, answer) of the served model to a GET (``body`` None) or a POST: JSON, or text
    (a ``str``: vLLM's ``/metrics``)."""
    if body is None:
        if path == "/health":
            return 200, {"status": "ok"}
        if path == "/get_server_info" and model.server_info is not None:
            return 200, dict(model.server_info)
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": _model_name(model), "object": "model"}]}
        if model.api == "vllm":
            if path == "/metrics":
                return 200, _metrics(model)  # Prometheus text, not JSON
            return 404, {"error": "not found"}
        if path == "/props":
            return 200, {"model_path": _model_name(model), "n_vocab": model.vocab, "speculative": model.speculative}
        if path == "/slots":
            return 200, [{"id": 0, "speculative": model.speculative,
                          "params": {"speculative.types": "none,draft-simple" if model.speculative else "none"}}]
        return 404, {"error": "not found"}
    if path == "/v1/completions":
        return _openai_completion(model, body)
    if model.api == "vllm":
        return 404, {"error": "not found"}
    if path == "/tokenize":
        return 200, {"tokens": [ord(c) % model.vocab for c in str(body.get("content", ""))]}
    if path != "/completion":
        return 404, {"error": "not found"}
    prompt = body.get("prompt")
    if not _token_ids(model, prompt):
        return 400, {"error": "prompt must be token ids"}
    sampling = _sampling(body)
    n_predict = max(0, min(int(body.get("n_predict", 16)), 256))
    tokens, drafted, accepted = model.complete(prompt, n_predict, sampling, int(body.get("seed", 0)))
    answer = {"tokens": tokens, "content": "", "stop_type": "limit", "timings": _timings(tokens, drafted, accepted)}
    n_probs = int(body.get("n_probs", 0) or 0)
    if n_probs:
        answer["completion_probabilities"] = _llama_entries(model, prompt, tokens, sampling, n_probs,
                                                            bool(body.get("post_sampling_probs")))
    return 200, answer


def _timings(tokens: list[int], drafted: int, accepted: int) -> dict:
    """llama.cpp's ``timings``: the draft counters only on a request that drafted (server-task.cpp,
    ``if (draft_n > 0)``)."""
    timings = {"predicted_n": len(tokens)}
    if drafted > 0:
        timings.update(draft_n=drafted, draft_n_accepted=accepted)
    return timings


def _model_name(model: ToyServedModel) -> str:
    return f"toy-served-v{model.vocab}-seed{model.seed}"


def _metrics(model: ToyServedModel) -> str:
    with model.lock:
        drafted, accepted = model.totals
    return (f"# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{_model_name(model)}"}} {drafted:.1f}\n'
            f"# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{_model_name(model)}"}} {accepted:.1f}\n')


def _token_ids(model: ToyServedModel, prompt) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < model.vocab for t in prompt)


def _sampling(body: dict) -> dict:
    return {"temperature": float(body.get("temperature", 0.8)), "top_k": int(body.get("top_k", 40) or 0),
            "top_p": float(body.get("top_p", 0.95)), "min_p": float(body.get("min_p", 0.05))}


def _llama_entries(model, prompt, tokens, sampling, n_probs, post_sampling: bool) -> list[dict]:
    entries, context = [], list(prompt)
    for token in tokens:
        law = model.law(context, sampling) if post_sampling else model.row(model.target, context)
        order = np.lexsort((np.arange(law.size), -law))[:n_probs]
        if post_sampling:
            entries.append({"id": token, "prob": float(np.float32(law[token])),
                            "top_probs": [{"id": int(i), "prob": float(np.float32(law[i]))} for i in order if law[i] > 0]})
        else:
            entries.append({"id": token, "logprob": float(np.float32(np.log(law[token]))),
                            "top_logprobs": [{"id": int(i), "logprob": float(np.float32(np.log(law[i])))}
                                             for i in order if law[i] > 0]})
        context.append(token)
    return entries


def _openai_completion(model: ToyServedModel, body: dict) -> tuple[int, dict]:
    """``/v1/completions`` as llama.cpp (``api="llama.cpp"``) or vLLM (``"vllm"``) answers it."""
    prompt = body.get("prompt")
    if body.get("model") not in (None, _model_name(model)):
        return 404, {"error": {"message": f"the model {body.get('model')} does not exist", "code": 404}}
    if not _token_ids(model, prompt):
        return 400, {"error": {"message": "prompt must be token ids", "code": 400}}
    # the OpenAI defaults: temperature 1, top_p 1, no top-k or min-p unless asked
    sampling = {"temperature": float(body.get("temperature", 1.0)), "top_k": int(body.get("top_k", 0) or 0),
                "top_p": float(body.get("top_p", 1.0)), "min_p": float(body.get("min_p", 0.0))}
    n = max(0, min(int(body.get("max_tokens", 16)), 256))
    tokens, drafted, accepted = model.complete(prompt, n, sampling, int(body.get("seed", 0)))
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
    answer = {"object": "text_completion", "model": _model_name(model), "choices": [choice],
              "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(tokens)}}
    logprobs = body.get("logprobs")
    if model.api == "llama.cpp":
        answer["timings"] = _timings(tokens, drafted, accepted)
        if logprobs is not None and int(logprobs) > 0:
            choice["logprobs"] = {"content": _llama_entries(model, prompt, tokens, sampling, int(logprobs),
                                                            bool(body.get("post_sampling_probs")))}
        return 200, answer
    if body.get("return_token_ids"):
        choice["token_ids"] = list(tokens)
    if logprobs is not None:
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        name = (lambda i: f"token_id:{i}") if as_ids else (lambda i: chr(97 + int(i) % 26))
        rows, context = [], list(prompt)
        for token in tokens:
            raw = model.row(model.target, context)  # vLLM's default logprobs_mode: raw_logprobs
            order = np.lexsort((np.arange(raw.size), -raw))[:int(logprobs)]
            rows.append((token, float(np.float32(np.log(raw[token]))),
                         {name(i): float(np.float32(np.log(raw[i]))) for i in order if raw[i] > 0}))
            context.append(token)
        choice["logprobs"] = {"tokens": [name(t) for t, _, _ in rows], "token_logprobs": [lp for _, lp, _ in rows],
                              "top_logprobs": [top for _, _, top in rows], "text_offset": [0] * len(rows)}
    return 200, answer


class served_model:
    """``with served_model(ToyServedModel(...)) as server: server.url, server.requests``: the model
    served on 127.0.0.1 (a free port) until the block ends."""

    def __init__(self, model: ToyServedModel):
        self.model = model

    def __enter__(self) -> "served_model":
        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.model = self.model
        self.server.requests = Counter()
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    @property
    def requests(self) -> Counter:
        return self.server.requests

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
