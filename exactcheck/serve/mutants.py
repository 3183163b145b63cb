"""Mutants of a served system: HTTP proxies that break what a user receives, one bug class each.

The serve audit's power is shown on these, as the step audit's is on ``exactcheck.step.mutants``:
each sits between the client and a correct server (llama.cpp's ``llama-server``, or the toy
served model of ``toy_models.served_lm``) and does one thing a real serving stack has been seen
to do (field notes section 6). Every one must be found through the HTTP path, with its cause named.

For tests and measurements: a proxy listens on 127.0.0.1 only and forwards to the URLs it is given.
"""
from __future__ import annotations

import json
import math
import threading
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from exactcheck.endpoints.client import Client
from exactcheck.endpoints.llama_cpp_api import llama_cpp_texts
from exactcheck.contracts.loopback import LoopbackServer

__all__ = ["ProxyMutant", "PROXY_MUTANTS", "proxy"]


@dataclass(frozen=True)
class ProxyMutant:
    name: str
    defect: str
    needs: str = ""  # "draft": a server of the draft model; "plain": the target without speculation
    caught_by: str = ""  # the check expected to find it


PROXY_MUTANTS = {m.name: m for m in (
    ProxyMutant("hotter", "serves temperature x 1.3 of what the request asks (sampling settings not applied "
                          "as set: vLLM #9834)", caught_by="continuation"),
    ProxyMutant("zero_logprobs", "reports every token's logprob as 0.0 (llama.cpp #27972, vLLM #17876)",
                caught_by="logprob_fidelity"),
    ProxyMutant("draft_logprobs", "reports the draft model's probabilities for the tokens (a speculative "
                                  "server returning q instead of p)", needs="draft", caught_by="logprob_fidelity"),
    ProxyMutant("speculation_off_for_logprobs", "answers every request that asks for probabilities from the "
                                                "target alone, without speculation (vLLM #34497)",
                needs="plain", caught_by="speculation_ran"),
    ProxyMutant("seed_cache", "answers a request from a cache keyed without its seed: every seed gets the first "
                              "answer", caught_by="continuation"),
    ProxyMutant("copied_samples", "answers a request for several samples (n, n_cmpl) with one sample copied: the "
                                  "children of a request seeded alike (llama.cpp PR #18700's review: each child "
                                  "takes seed + i)", caught_by="independent_samples"),
    ProxyMutant("stop_one_late", "answers a request with stop strings with one token more than the one that "
                                 "completed the stop (a verify step's accepted tokens not cut at the stop); "
                                 "llama.cpp's /completion", caught_by="continuation"),
    ProxyMutant("stream_drops_token", "streams an event of several tokens without its last one (its id, text and "
                                      "probability): what a streaming user receives loses a token the answer has "
                                      "(vLLM #52469: streamed text dropped words under MTP)", caught_by="streamed"),
    ProxyMutant("stream_repeats_last", "repeats the last token of a stream in its final event (a finish event that "
                                       "re-sends what was already streamed)", caught_by="streamed"),
    ProxyMutant("stream_past_stop", "streams the text past a stop string that the answer ends at (the stop searched "
                                    "only when the answer is assembled, vLLM #47616's class)", caught_by="streamed"),
    ProxyMutant("chat_hotter", "serves the chat endpoint's answers at temperature x 1.3 of what the request asks, "
                               "the completions endpoints as asked (a chat handler that maps the sampling fields "
                               "its own way)", caught_by="continuation"),
)}
_COMPLETIONS = ("/completion", "/v1/completions")
# the mutants that rewrite a whole (non-streamed) answer; a streamed request passes them unchanged
_ANSWER_MUTANTS = ("zero_logprobs", "draft_logprobs", "copied_samples", "stop_one_late", "seed_cache")
_CHAT = "/v1/chat/completions"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    mutant: ProxyMutant
    upstream: str
    draft: str | None
    plain: str | None
    cache: dict
    lock: threading.Lock
    requests: Counter


def _forward(base: str, path: str, body: dict | None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base.rstrip("/") + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read()
            try:
                return response.status, json.loads(text)
            except ValueError:  # Prometheus /metrics: passed on as text
                return response.status, text.decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode("utf-8", "replace")[:200]}


def _draft_probabilities(server: _Server, path: str, body: dict, answer: dict) -> None:
    """Replace each reported probability with the draft model's for that token after that prefix."""
    prompt = list(body["prompt"])
    if path == "/completion":
        tokens, entries = answer.get("tokens", []), answer.get("completion_probabilities", [])
    else:
        choice = answer["choices"][0]
        logprobs = choice.get("logprobs") or {}
        entries = logprobs.get("content")
        tokens = choice.get("token_ids") or [e.get("id") for e in entries or []]
    for t, token in enumerate(tokens):
        context = prompt + list(tokens[:t])
        if path == "/completion":
            probe = dict(body, prompt=context, n_predict=1, n_probs=64, post_sampling_probs=True)
            _, draft = _forward(server.draft, path, probe)
            listed = (draft.get("completion_probabilities") or [{}])[0].get("top_probs", [])
            p = next((item.get("prob", 0.0) for item in listed if item.get("id") == token), 0.0)
        else:
            _, draft = _forward(server.draft, path, dict(body, prompt=context, max_tokens=1, logprobs=64,
                                                         return_tokens_as_token_ids=True))
            drafted = (draft["choices"][0].get("logprobs") or {})
            if drafted.get("content"):
                listed = drafted["content"][0].get("top_probs") or drafted["content"][0].get("top_logprobs") or []
                p = next((item["prob"] if "prob" in item else math.exp(item["logprob"]) for item in listed
                          if item.get("id") == token), 0.0)
            else:
                top = (drafted.get("top_logprobs") or [{}])[0]
                p = math.exp(top[f"token_id:{token}"]) if f"token_id:{token}" in top else 0.0
        if entries is not None and t < len(entries):
            entry = entries[t]
            if "prob" in entry:
                entry["prob"] = p
            if "logprob" in entry:
                entry["logprob"] = math.log(p) if p > 0 else -1e30
        elif path != "/completion" and t < len(logprobs.get("token_logprobs") or []):
            logprobs["token_logprobs"][t] = math.log(p) if p > 0 else -1e30


def _zero(answer: dict | list) -> None:
    """Every reported probability 1 (logprob 0.0), in either API's answer (llama.cpp's list of
    results to a request for several samples: each)."""
    if isinstance(answer, list):
        for one in answer:
            _zero(one)
        return
    entries = list(answer.get("completion_probabilities") or [])
    for choice in answer.get("choices") or []:
        logprobs = choice.get("logprobs") or {}
        entries += logprobs.get("content") or []
        if logprobs.get("token_logprobs"):
            logprobs["token_logprobs"] = [0.0] * len(logprobs["token_logprobs"])
            logprobs["top_logprobs"] = [{k: 0.0 for k in top} for top in logprobs.get("top_logprobs") or []]
    for entry in entries:
        for item in [entry, *entry.get("top_probs", []), *entry.get("top_logprobs", [])]:
            if "prob" in item:
                item["prob"] = 1.0
            if "logprob" in item:
                item["logprob"] = 0.0


def _copied(upstream: str, path: str, body: dict, k: int) -> tuple[int, dict | list]:
    """One sample asked upstream, answered as ``k``: llama.cpp's /completion as a list of results,
    /v1/completions as ``k`` choices."""
    status, answer = _forward(upstream, path, {key: v for key, v in body.items() if key not in ("n", "n_cmpl")})
    if status != 200:
        return status, answer
    if path == "/completion":
        return status, [dict(answer, index=j) for j in range(k)]
    return status, dict(answer, choices=[dict(answer["choices"][0], index=j) for j in range(k)])


def _one_late(server: _Server, body: dict) -> tuple[int, dict]:
    """The answer asked without its stop strings, cut one token after the one whose piece completes
    a stop (llama.cpp's /completion: ``tokens``, ``content``, ``stop_type``, ``stopping_word``)."""
    status, answer = _forward(server.upstream, "/completion", {k: v for k, v in body.items() if k != "stop"})
    if status != 200:
        return status, answer
    if isinstance(answer, list):  # several samples (n_cmpl): each cut
        return status, [_cut_one_late(server, body["stop"], one) for one in answer]
    return status, _cut_one_late(server, body["stop"], answer)


def _cut_one_late(server: _Server, stops: list[str], answer: dict) -> dict:
    tokens = list(answer.get("tokens") or [])
    prefixes = [tuple(tokens[:j]) for j in range(1, len(tokens) + 1)]
    with Client() as client:  # the text llama.cpp searches, as the audit reads it
        texts = llama_cpp_texts(client, server.upstream, prefixes) if prefixes else []
    for j, text in enumerate(texts, start=1):
        found = next((s for s in stops if s in text), None)
        if found is not None:
            return dict(answer, tokens=tokens[:j + 1], content=text[:text.find(found)], stop_type="word",
                        stopping_word=found)
    return answer


def _forward_events(base: str, path: str, body: dict) -> tuple[int, list[dict] | dict]:
    """A streamed request passed on: the upstream's events, parsed."""
    from exactcheck.endpoints.client import read_events
    data = json.dumps(body).encode()
    request = urllib.request.Request(base.rstrip("/") + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, read_events(response.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode("utf-8", "replace")[:200]}


def _carried(event: dict) -> tuple[dict, str]:
    """The part of an event that carries tokens (llama.cpp's event itself, or OpenAI's ``choices[0]``)
    and the key of its token ids there."""
    if "choices" in event:
        return (event["choices"][0] if event["choices"] else {}), "token_ids"
    return event, "tokens"


def _cut_last(part: dict, key: str) -> None:
    """The last token of an event's part removed: its id, its text (one character a token here, the
    toy's; a real server's last piece otherwise unknown: its whole text kept but for one character)
    and its probability entries."""
    part[key] = part[key][:-1]
    for text_key in ("content", "text"):
        if isinstance(part.get(text_key), str) and part[text_key]:
            part[text_key] = part[text_key][:-1]
    if isinstance(part.get("completion_probabilities"), list):
        part["completion_probabilities"] = part["completion_probabilities"][:-1]
    if isinstance(part.get("logprobs"), dict):
        part["logprobs"] = {k: (v[:-1] if isinstance(v, list) else v) for k, v in part["logprobs"].items()}


def _stream_mutant(server: "_Server", path: str, body: dict) -> tuple[int, list[dict] | dict]:
    """The stream mutants: the upstream's events, one thing broken."""
    name = server.mutant.name
    asked = {k: v for k, v in body.items() if k != "stop"} if name == "stream_past_stop" else body
    status, events = _forward_events(server.upstream, path, asked)
    if status != 200 or not isinstance(events, list):
        return status, events
    if name == "stream_drops_token":
        for event in events:
            part, key = _carried(event)
            if isinstance(part.get(key), list) and len(part[key]) > 1:
                _cut_last(part, key)
                break
    elif name == "stream_repeats_last":
        parts = [_carried(event) for event in events if "choices" not in event or event["choices"]]
        carrying = [(part, key) for part, key in parts if isinstance(part.get(key), list) and part[key]]
        if carrying and parts:
            (part, key), (final, final_key) = carrying[-1], parts[-1]
            final[final_key] = list(final.get(final_key) or []) + [part[key][-1]]
            for text_key in ("content", "text"):
                if isinstance(part.get(text_key), str) and part[text_key]:
                    final[text_key] = (final.get(text_key) or "") + part[text_key][-1]
    elif name == "stream_past_stop" and body.get("stop"):  # asked without its stop: the whole text streamed,
        part, _ = [_carried(event) for event in events if "choices" not in event or event["choices"]][-1]
        if "stop_type" in part:  # and the end said to be the stop's
            part["stop_type"], part["stopping_word"] = "word", body["stop"][0]
        elif "finish_reason" in part:
            part["finish_reason"] = "stop"
    return status, events


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args):
        pass

    def _reply(self, status: int, data) -> None:
        plain = isinstance(data, str)
        text = (data if plain else json.dumps(data)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if plain else "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def _stream(self, events: list[dict]) -> None:
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + \
            ("data: [DONE]\n\n" if self.path != "/completion" else "")
        data = text.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.requests[self.path] += 1
        self._reply(*_forward(self.server.upstream, self.path, None))

    def do_POST(self):
        server = self.server
        server.requests[self.path] += 1
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        name = server.mutant.name
        if self.path not in (*_COMPLETIONS, _CHAT) or (self.path == _CHAT) != name.startswith("chat_"):
            return self._reply(*_forward(server.upstream, self.path, body))
        upstream = server.upstream
        if name.startswith("stream_") and body.get("stream") and self.path in _COMPLETIONS:
            status, events = _stream_mutant(server, self.path, body)
            return self._stream(events) if status == 200 else self._reply(status, events)
        if body.get("stream") and name in _ANSWER_MUTANTS:  # their defect is in a whole answer: a stream passes
            return self._reply(*_forward(upstream, self.path, body))
        if name in ("hotter", "chat_hotter") and float(body.get("temperature", 1.0)) > 0:
            body = dict(body, temperature=float(body["temperature"]) * 1.3)
        if name == "speculation_off_for_logprobs" and (body.get("n_probs") or body.get("logprobs")):
            upstream = server.plain
        if name == "seed_cache":
            key = json.dumps({k: v for k, v in body.items() if k != "seed"}, sort_keys=True)
            with server.lock:
                held = server.cache.get(key)
            if held is not None:
                return self._reply(200, held)
        several = int(body.get("n_cmpl", body.get("n", 1)) or 1) if self.path == "/completion" \
            else int(body.get("n", 1) or 1)
        if name == "copied_samples" and several > 1:
            return self._reply(*_copied(upstream, self.path, body, several))
        if name == "stop_one_late" and self.path == "/completion" and body.get("stop"):
            return self._reply(*_one_late(server, body))
        status, answer = _forward(upstream, self.path, body)
        if status == 200 and name == "zero_logprobs":
            _zero(answer)
        if status == 200 and name == "draft_logprobs" and (body.get("n_probs") or body.get("logprobs")):
            _draft_probabilities(server, self.path, body, answer)
        if status == 200 and name == "seed_cache":
            with server.lock:
                server.cache.setdefault(key, answer)
        self._reply(status, answer)


class proxy(LoopbackServer):
    """``with proxy("hotter", upstream_url) as p: p.url``: the mutant served on 127.0.0.1 (a free
    port) in front of ``upstream`` until the block ends; ``draft`` / ``plain``: the other servers
    a mutant needs (``ProxyMutant.needs``)."""

    def __init__(self, name: str, upstream: str, draft: str | None = None, plain: str | None = None):
        self.mutant = PROXY_MUTANTS[name]
        if self.mutant.needs == "draft" and not draft or self.mutant.needs == "plain" and not plain:
            raise ValueError(f"proxy mutant {name} needs a {self.mutant.needs} server URL")
        self.upstream, self.draft, self.plain = upstream, draft, plain

    def __enter__(self) -> "proxy":
        server = _Server(("127.0.0.1", 0), _Handler)
        server.mutant, server.upstream, server.draft, server.plain = self.mutant, self.upstream, self.draft, self.plain
        server.cache, server.lock, server.requests = {}, threading.Lock(), Counter()
        self.serve(server)
        return self
