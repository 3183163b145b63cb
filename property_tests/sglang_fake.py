"""A fake of SGLang's native server over the toy served model (``toy_models.served_lm``), exact by
construction, on 127.0.0.1: ``GET /health`` (200, empty body), ``/get_model_info``,
``/get_server_info`` (``speculative_*`` server arguments), and ``POST /generate`` as
``exactcheck.endpoints.sglang_api`` reads SGLang (``input_ids``, ``sampling_params`` with
``sampling_seed``, ``return_logprob``/``top_logprobs_num``; ``output_ids``, ``meta_info`` with
``output_token_logprobs`` / ``output_top_logprobs`` as ``[logprob, token_id, None]`` and the
speculation counters per request, only on a request that drafted). As SGLang does, it applies the
temperature before top-k / top-p / min-p, and reports ``log softmax(logits / T)`` before truncation
(raw at temperature 1 and greedy). Unknown paths answer FastAPI's 404 ``{"detail": "Not Found"}``.
``hotter``: it samples at 1.3 times the temperature asked (a defect the audit must find);
``original_logprob``: it reports raw log-probabilities at every temperature, as SGLang started with
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` does."""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from exactcheck.contracts.loopback import LoopbackServer
from toy_models.served_lm import ToyServedModel, sampler_chain

DRAFT_TOKENS = 4  # speculative_num_draft_tokens: draft_max + 1


class SGLangToy(ToyServedModel):
    """The toy's tables with SGLang's order: temperature, then the truncations."""

    def law(self, context, sampling, history=None, position=None):
        row = self.row(self.target, context)
        t = sampling["temperature"]
        if t <= 0:
            return sampler_chain(row, 0.0)
        return sampler_chain(sampler_chain(row, t), 1.0, sampling["top_k"], sampling["top_p"], sampling["min_p"])


def _generate(model: SGLangToy, body: dict, hotter: bool, original: bool = False) -> tuple[int, dict]:
    prompt = body.get("input_ids")
    if not (isinstance(prompt, list) and all(isinstance(t, int) and 0 <= t < model.vocab for t in prompt)):
        return 400, {"error": {"message": "input_ids must be token ids"}}
    params = body.get("sampling_params") or {}
    t = float(params.get("temperature", 1.0))
    top_k = int(params.get("top_k", -1))
    sampling = {"temperature": t * (1.3 if hotter else 1.0), "top_k": 0 if top_k < 0 else top_k,
                "top_p": float(params.get("top_p", 1.0)), "min_p": float(params.get("min_p", 0.0))}
    n = max(0, min(int(params.get("max_new_tokens", 128)), 256))
    tokens, drafted, accepted = model.complete(prompt, n, sampling, int(params.get("sampling_seed") or 0))
    meta = {"id": "toy", "prompt_tokens": len(prompt), "completion_tokens": len(tokens),
            "finish_reason": {"type": "length", "length": n}}
    if drafted:  # tokenizer_manager.py: written only where spec_verify_ct > 0
        verify = max(1, math.ceil(drafted / (DRAFT_TOKENS - 1)))
        meta.update(spec_verify_ct=verify, spec_draft_token_num=drafted, spec_accept_token_num=accepted,
                    spec_accept_length=len(tokens) / verify, spec_accept_rate=accepted / drafted)
    if body.get("return_logprob"):
        top_n, rows, tops, context = int(body.get("top_logprobs_num") or 0), [], [], list(prompt)
        for token in tokens:
            row = model.row(model.target, context)
            reported = row if t <= 0 or t == 1 or original else sampler_chain(row, t)  # tempered, untruncated
            with np.errstate(divide="ignore"):
                logp = np.log(reported)
            rows.append([float(np.float32(logp[token])), int(token), None])
            order = np.lexsort((np.arange(row.size), -reported))[:top_n]
            tops.append([[float(np.float32(logp[i])), int(i), None] for i in order] if top_n else None)
            context.append(token)
        meta.update(output_token_logprobs=rows, input_token_logprobs=[])
        if top_n:
            meta["output_top_logprobs"] = tops
    return 200, {"text": "", "output_ids": list(tokens), "meta_info": meta}


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _reply(self, status: int, data) -> None:
        payload = b"" if data is None else json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self):
        server = self.server
        if self.path == "/health":
            return self._reply(200, None)
        if self.path == "/get_model_info":
            return self._reply(200, {"model_path": "toy-sglang", "tokenizer_path": "toy-sglang",
                                     "is_generation": True, "preferred_sampling_params": None})
        if self.path == "/get_server_info":
            return self._reply(200, {"model_path": "toy-sglang", **server.server_info})
        self._reply(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path != "/generate":
            return self._reply(404, {"detail": "Not Found"})
        with self.server.lock:
            self.server.requests += 1
        self._reply(*_generate(self.server.model, body, self.server.hotter, self.server.original))


class sglang_server(LoopbackServer):
    """``with sglang_server(SGLangToy(...)) as s: s.url``: the fake on a free port until the block ends."""

    def __init__(self, model: SGLangToy, *, hotter: bool = False, original_logprob: bool = False):
        self.model, self.hotter, self.original = model, hotter, original_logprob

    def __enter__(self) -> "sglang_server":
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True
        server.model, server.hotter, server.original = self.model, self.hotter, self.original
        server.lock, server.requests = threading.Lock(), 0
        server.server_info = ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
                               "speculative_num_draft_tokens": DRAFT_TOKENS, "speculative_eagle_topk": 1,
                               "speculative_accept_threshold_single": 1.0,
                               "speculative_accept_threshold_acc": 1.0}
                              if self.model.speculative else {"speculative_algorithm": None})
        self.serve(server)
        return self

    @property
    def requests(self) -> int:
        return self.server.requests
