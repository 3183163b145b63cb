"""OpenAI's ``POST /v1/completions`` as a serve-audit ``Endpoint``, as vLLM, SGLang and
llama.cpp serve it.

- **prompts** are token ids (``"prompt": [ids]``: the completions API takes them; a chat API does not);
- **token ids back**: vLLM (>= 0.10.2) returns ``choices[0].token_ids`` with ``return_token_ids``;
  llama.cpp returns them only inside ``logprobs.content[*].id``, and vLLM inside ``logprobs.tokens``
  as ``"token_id:N"`` with ``return_tokens_as_token_ids``. ``check`` finds which the server does; where
  ids come only with logprobs, every request asks ``logprobs=1`` and the report says so;
- **probabilities**: ``logprobs=N`` top lists. llama.cpp honours ``post_sampling_probs`` here too (the
  law the sampler chain leaves); vLLM reports raw probabilities unless started with
  ``--logprobs-mode processed_logprobs`` (``reference_kind``), and the law of a setting is then
  derived where determinable (``exactcheck.endpoints.sampler_law``);
- **sampling settings**: ``temperature``, ``top_p``, ``seed`` as OpenAI names them; ``top_k``, ``min_p``
  and ``ignore_eos`` as vLLM, SGLang and llama.cpp take them, sent only when set;
- **speculation counters**: llama.cpp's ``timings`` per request; vLLM's ``/metrics`` counters
  (``vllm:spec_decode_num_draft_tokens``, ``vllm:spec_decode_num_accepted_tokens``) server-wide;
- **settings**: SGLang's ``/get_server_info`` (``speculative_*``), llama.cpp's ``/slots``.
"""
from __future__ import annotations

from dataclasses import replace

import re
from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.endpoint import POST_SAMPLING, RAW, Completion, Endpoint, Sampling, int_or_none, probability_of
from exactcheck.endpoints.llama_cpp_api import PENALTY_FIELDS as LLAMA_PENALTY_FIELDS
from exactcheck.endpoints.llama_cpp_api import llama_cpp_constraint_fields
from exactcheck.endpoints.llama_cpp_api import (LlamaCppEndpoint, is_llama_cpp, listed_top, llama_cpp_end_of_generation,
                                               llama_cpp_texts)
from exactcheck.endpoints.sampler_law import NotDeterminable, with_output_penalties

__all__ = ["OpenAICompletionsEndpoint", "parse_metrics", "openai_sampling_body"]

_TOKEN_ID = "token_id:"
# vLLM's SamplingParams fields (sampling_params.py); it has no window: repeat_last_n is refused
VLLM_PENALTY_FIELDS = {k: k for k in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
DRAFTED_METRIC, ACCEPTED_METRIC = "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"



def openai_sampling_body(n_predict: int, sampling: Sampling, seed: int) -> dict:
    """The fields an OpenAI-style request (completions or chat) carries for one sample of
    ``n_predict`` tokens: length, seed, temperature and truncation (top-k and min-p only when set)."""
    body = {"max_tokens": n_predict, "n": 1, "stream": False, "seed": int(seed), "temperature": sampling.temperature,
            "top_p": sampling.top_p, "ignore_eos": sampling.ignore_eos, "return_token_ids": True}
    if sampling.min_tokens:
        body["min_tokens"] = sampling.min_tokens
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.min_p:
        body["min_p"] = sampling.min_p
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    return body

class OpenAICompletionsEndpoint(Endpoint):
    api = "OpenAI /v1/completions"
    path = "/v1/completions"

    def __init__(self, base: str, client: Client, *, model: str | None = None, reference_kind: str | None = None):
        super().__init__(base, client, model=model)
        self.llama_cpp = False
        self.ids_through_logprobs = False
        self.kind = reference_kind or RAW
        self._declared_kind = reference_kind

    @property
    def chat_dialect(self) -> str:
        """Its /v1/chat/completions: llama.cpp's where the server is llama.cpp, else vLLM's."""
        return "llama.cpp" if self.llama_cpp else "vllm"

    def describe(self) -> str:
        how = "token ids read from logprobs (every request asks logprobs=1)" if self.ids_through_logprobs else \
            "token ids from return_token_ids"
        return f"{self.base} ({self.api}, model {self.model}, {how}, {self.kind} probabilities)"

    def check(self) -> dict:
        models = self.client.get(self.base, "/v1/models")
        served = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)] \
            if isinstance(models.get("data"), list) else []
        if not served:
            raise EndpointError(f"{self.base}/v1/models lists no model: is it an OpenAI-compatible server?")
        if self.model is None:
            if len(served) > 1:
                raise EndpointError(f"{self.base} serves {len(served)} models ({', '.join(map(str, served[:4]))}): "
                                    f"name one with --model")
            self.model = served[0]
        elif self.model not in served:
            raise EndpointError(f"{self.base} does not serve model {self.model!r} (it serves "
                                f"{', '.join(map(str, served[:4]))})")
        self.llama_cpp = is_llama_cpp(self.client, self.base)
        if self.llama_cpp:
            self.kind, self.cache_switch = self._declared_kind or POST_SAMPLING, True
        probe = self.client.post(self.base, self.path, self.body([0], 1, Sampling(), 0, tag="check")).answer
        if not _choice_token_ids(probe):
            self.ids_through_logprobs = True
            answer = self.client.post(self.base, self.path, self.body([0], 1, Sampling(), 0, tag="check")).answer
            if not _logprob_token_ids(_choice(answer)):
                raise EndpointError(f"{self.base}{self.path} returns no token ids (asked with return_token_ids, and "
                                    f"with logprobs and return_tokens_as_token_ids): the audit needs them (vLLM >= "
                                    f"0.10.2; llama.cpp's /completion with --api llama.cpp)")
        return models

    def penalised(self, law, sampling: Sampling, prefix: tuple[int, ...]):
        """llama.cpp: as listed (``LlamaCppEndpoint.penalised``). vLLM (v1/sample/ops/penalties.py,
        model_executor/layers/utils.py ``apply_penalties``): its repetition penalty reads prompt and
        output as one set (a one-token request's prompt + continuation is the same set), its presence
        and frequency penalties the output only (the continuation, which a one-token request sends as
        prompt). Raw log-probabilities (the default ``raw_logprobs``: before every penalty): presence
        and frequency applied here over the continuation (``with_output_penalties``); the repetition
        penalty is not derivable. Post-sampling (``processed_logprobs``): the repetition penalty is
        in them with the same set; presence and frequency are missing and cannot be added back to a
        law already tempered and truncated."""
        if self.llama_cpp or not sampling.penalized:
            return law
        if self.kind == RAW:
            return with_output_penalties(law, sampling, prefix)
        if sampling.presence_penalty or sampling.frequency_penalty:
            raise NotDeterminable("presence/frequency penalty with a reference reporting processed log-probabilities: "
                                  "vLLM counts them over the output only, which a one-token request's continuation "
                                  "is not (it is sent as prompt), and a tempered, truncated law cannot take them back")
        return law

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's ``/tokenize`` (``content``) or vLLM's (``model``, ``prompt``; no special tokens added)."""
        body = {"content": text} if self.llama_cpp else {"model": self.model, "prompt": text, "add_special_tokens": False}
        answer = self.client.post(self.base, "/tokenize", body).answer
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise EndpointError(f"{self.base}/tokenize answered {str(answer)[:80]}, not token ids: give prompts as "
                                f"token ids (--prompt-ids)")
        return tokens

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:
        body = {"model": self.model, "prompt": list(prompt), **openai_sampling_body(n_predict, sampling, seed)}
        body.update(sampling.penalty_fields(LLAMA_PENALTY_FIELDS if self.llama_cpp else VLLM_PENALTY_FIELDS))
        if sampling.constraint is not None:
            body.update(self.constraint_fields(sampling.constraint))
        logprobs = max(n_probs, 1 if self.ids_through_logprobs else 0)
        if logprobs:
            body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
            if self.llama_cpp:
                body["post_sampling_probs"] = self.kind == POST_SAMPLING
        if self.llama_cpp:
            body["cache_prompt"] = bool(cache)
        if tag is not None:
            body["exactcheck_tag"] = tag  # in the journal's key only: the client does not send it
        return body

    def read(self, exchange: Exchange) -> Completion:
        answer = exchange.answer
        choice = _choice(answer)
        if choice is None:
            raise EndpointError(f"{self.base}{self.path} answered no choices: {str(answer)[:80]}")
        tokens = _choice_token_ids(answer) or _logprob_token_ids(choice)
        if tokens is None:
            raise EndpointError(f"{self.base}{self.path} answered no token ids (choices[0]: {str(choice)[:80]})")
        probabilities = _token_probabilities(choice) if exchange.body.get("logprobs") else None
        timings = answer.get("timings") or {}
        text = choice.get("text")
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        return Completion(tuple(tokens), probabilities, int_or_none(timings.get("draft_n")),
                          int_or_none(timings.get("draft_n_accepted")), choice.get("finish_reason") == "stop",
                          self.kind, text if isinstance(text, str) else None,
                          usage_tokens=int_or_none(usage.get("completion_tokens")))

    @property
    def min_tokens(self) -> bool:
        """vLLM takes ``min_tokens``; llama.cpp's OpenAI route has none."""
        return not self.llama_cpp

    def end_of_generation(self) -> frozenset[int]:
        if self.llama_cpp:
            return llama_cpp_end_of_generation(self.client, self.base)
        return super().end_of_generation()

    def streamed(self, body: dict) -> dict:
        """``stream: true`` with the usage in a last chunk (``stream_options.include_usage``): chunks of
        ``choices[0]`` deltas (``text``, vLLM's ``token_ids``, ``logprobs``), the last with its
        ``finish_reason``."""
        return {**body, "stream": True, "stream_options": {"include_usage": True}}

    def read_stream(self, exchange: Exchange) -> Completion:
        """The chunks reassembled into the answer ``read`` reads: the deltas of ``choices[0]`` joined in
        order (text, token ids, the logprobs' lists), the last finish reason and timings; with the
        token ids each chunk carried and the usage's completion tokens."""
        events = [e for e in exchange.answer.get("events") or () if isinstance(e, dict)]
        failed = next((e["error"] for e in events if e.get("error")), None)
        if failed is not None:  # the server failed the request mid-answer (vLLM: an error chunk, then the end)
            message = failed.get("message") if isinstance(failed, dict) else failed
            raise EndpointError(f"{exchange.base.rstrip('/')}{exchange.path}: the stream ended with the server's error "
                                f"after {sum(1 for e in events if _choice(e) is not None)} chunks: {str(message)[:200]}",
                                server_fault=True, requests=((exchange.base.rstrip("/") + exchange.path, exchange.body),))
        text, ids, carried, finish, timings, usage = "", [], [], None, None, None
        logprobs: dict = {}
        any_ids = False
        for event in events:
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
            choice = _choice(event)
            if choice is None:
                continue
            text += choice.get("text") if isinstance(choice.get("text"), str) else ""
            delta = choice.get("token_ids")
            if isinstance(delta, list):
                any_ids = True
                ids += delta
            chunk_logprobs = choice.get("logprobs")
            if isinstance(chunk_logprobs, dict):
                for key, value in chunk_logprobs.items():
                    if isinstance(value, list):
                        logprobs.setdefault(key, []).extend(value)
            carried_here = len(delta) if isinstance(delta, list) else len((chunk_logprobs or {}).get("tokens") or
                                                                           (chunk_logprobs or {}).get("content") or [])
            if carried_here:
                carried.append(carried_here)
            if choice.get("finish_reason") is not None:
                finish = choice.get("finish_reason")
        merged_choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs or None}
        if any_ids:
            merged_choice["token_ids"] = ids
        merged = {"choices": [merged_choice], "usage": usage}
        if timings is not None:
            merged["timings"] = timings
        completion = self.read(Exchange(exchange.base, exchange.path, exchange.body, merged, exchange.seconds))
        return replace(completion, events=tuple(carried))

    def continuation_texts(self, prompt: Sequence[int], continuations: list[tuple[int, ...]]) -> list[str]:
        """llama.cpp: its pieces (``llama_cpp_texts``). vLLM searches the text its incremental
        detokenizer emits (v1/engine/detokenizer.py: ``DecodeStream`` with the prompt as context,
        holding back text that ends in an incomplete character): here the decoded prompt +
        continuation past the decoded prompt (``POST /detokenize``), its trailing U+FFFD dropped.
        Where the decoded prompt is not a prefix of that: ``NotDeterminable``. (/detokenize renders
        special tokens, which the stop search skips: an answer that ends where these texts say it
        cannot is then not judged, ``serve.stop_law.ends_disagreeing``.)"""
        if self.llama_cpp:
            return llama_cpp_texts(self.client, self.base, continuations)
        return [text.rstrip("\ufffd") for text in self._detokenized(prompt, continuations)]

    def constraint_pieces(self, prompt: Sequence[int], tokens: list[int]) -> list[str]:
        """The pieces a constraint's mask reads: ``/detokenize``'s, a trailing U+FFFD kept (a byte-level
        token ending inside a character: ``constraints.allowed_tokens`` decides on it)."""
        if self.llama_cpp:
            return llama_cpp_texts(self.client, self.base, [(t,) for t in tokens])
        return self._detokenized(prompt, [(t,) for t in tokens])

    def _detokenized(self, prompt: Sequence[int], continuations: list[tuple[int, ...]]) -> list[str]:
        """``/detokenize`` of prompt + each continuation, past the decoded prompt (``NotDeterminable``
        where the decoded prompt is not a prefix of it)."""
        bodies = [{"model": self.model, "tokens": list(prompt) + list(c)} for c in [(), *continuations]]
        texts = []
        for exchange in self.client.post_many(self.base, "/detokenize", bodies):
            text = exchange.answer.get("prompt")
            if not isinstance(text, str):
                raise NotDeterminable(f"{self.base}/detokenize answered {str(exchange.answer)[:60]}, not text")
            texts.append(text)
        head, out = texts[0], []
        for c, text in zip(continuations, texts[1:]):
            if not text.startswith(head):
                raise NotDeterminable(f"the decoded prompt is not a prefix of the decoded prompt + {list(c)[:4]}: "
                                      f"the text vLLM's incremental detokenizer emits is not determined here")
            out.append(text[len(head):])
        return out

    @property
    def constraint_order(self) -> str:
        return "check-then-resample" if self.llama_cpp else "mask-first"

    def constraint_fields(self, constraint) -> dict:
        """llama.cpp's (``llama_cpp_constraint_fields``: its /v1/completions reads the same fields), else
        vLLM's ``structured_outputs`` (vllm/sampling_params.py ``StructuredOutputsParams``: ``choice``,
        ``regex``, ``json``, ``grammar``)."""
        if self.llama_cpp:
            return llama_cpp_constraint_fields(constraint)
        key = {"choice": "choice", "regex": "regex", "json_schema": "json", "grammar": "grammar"}[constraint.kind]
        value = list(constraint.value) if constraint.kind == "choice" else \
            constraint.schema if constraint.kind == "json_schema" else constraint.value
        return {"structured_outputs": {key: value}}

    def several(self, body: dict, k: int) -> dict:
        """OpenAI's ``n`` (vLLM: child requests seeded seed + index, v1/engine/parallel_sampling.py;
        llama.cpp: its ``n_cmpl``): ``k`` choices in one answer."""
        return {**body, "n": int(k)}

    def read_several(self, exchange: Exchange) -> list[Completion]:
        choices = exchange.answer.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise EndpointError(f"{self.base}{self.path} answered no choices: {str(exchange.answer)[:80]}")
        choices = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c.get("index"), int) else 0)
        return [self.read(Exchange(exchange.base, exchange.path, exchange.body, {**exchange.answer, "choices": [c]},
                                   exchange.seconds)) for c in choices]

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        choice = _choice(exchange.answer) or {}
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            if choice.get("finish_reason") == "stop" and not (_choice_token_ids(exchange.answer) or []):
                return None
            raise EndpointError(f"{self.base}{self.path} gave no logprobs for logprobs="
                                f"{exchange.body.get('logprobs')}")
        content = logprobs.get("content")
        if isinstance(content, list):  # llama.cpp: entries with ids
            return listed_top(self.base, content[0]) if content else None
        top = logprobs.get("top_logprobs")
        if not isinstance(top, list):
            raise EndpointError(f"{self.base}{self.path}: logprobs without top_logprobs")
        if not top:
            return None
        listed: dict[int, float] = {}
        for key, value in (top[0] or {}).items():
            token = _token_id(key)
            if token is None:
                raise EndpointError(f"{self.base}{self.path}: top_logprobs keyed by text ({key!r}), not by token id: "
                                    f"the server ignored return_tokens_as_token_ids")
            p = probability_of({"logprob": value})
            if p is not None:
                listed[token] = listed.get(token, 0.0) + p
        return listed

    def speculation_totals(self) -> tuple[int, int] | None:
        if self.llama_cpp:
            return None  # per request, in timings
        try:
            text = self.client.get_text(self.base, "/metrics")
        except EndpointError:
            return None
        metrics = parse_metrics(text)
        if DRAFTED_METRIC not in metrics:
            return None
        return int(metrics[DRAFTED_METRIC]), int(metrics.get(ACCEPTED_METRIC, 0))

    def speculation_settings(self) -> dict[str, object]:
        if self.llama_cpp:
            return LlamaCppEndpoint(self.base, self.client).speculation_settings()
        try:
            info = self.client.get(self.base, "/get_server_info")  # SGLang
        except EndpointError:
            return {}
        return {k: v for k, v in info.items() if k.startswith("speculative_")}


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: each metric's value summed over its labels (``_total`` names folded onto
    the bare name; ``_created`` samples skipped)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1).endswith("_created"):
            continue
        name = match.group(1)
        name = name[:-len("_total")] if name.endswith("_total") else name
        try:
            totals[name] = totals.get(name, 0.0) + float(match.group(2))
        except ValueError:
            continue
    return totals


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


def _choice(answer: dict) -> dict | None:
    choices = answer.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


def _ids(values) -> list[int] | None:
    if isinstance(values, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in values):
        return list(values)
    return None


def _choice_token_ids(answer: dict) -> list[int] | None:
    choice = _choice(answer) or {}
    return _ids(choice.get("token_ids"))


def _token_id(text) -> int | None:
    if isinstance(text, str) and text.startswith(_TOKEN_ID):
        try:
            return int(text[len(_TOKEN_ID):])
        except ValueError:
            return None
    return None


def _logprob_token_ids(choice: dict | None) -> list[int] | None:
    logprobs = (choice or {}).get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):  # llama.cpp
        return _ids([entry.get("id") for entry in content if isinstance(entry, dict)])
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list):  # vLLM with return_tokens_as_token_ids
        ids = [_token_id(t) for t in tokens]
        return ids if all(i is not None for i in ids) else None
    return None


def _token_probabilities(choice: dict) -> tuple[float, ...] | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):
        values = [probability_of(entry) for entry in content]  # every entry: one past the answer's tokens is
    else:                                                          # the finish check's finding
        values = [probability_of({"logprob": v}) for v in (logprobs.get("token_logprobs") or [])]
    if any(v is None for v in values):
        raise EndpointError(f"a logprobs entry has no probability: {str(logprobs)[:80]}")
    return tuple(values)
