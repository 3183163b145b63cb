"""llama.cpp's native API (``POST /completion``) as a serve-audit ``Endpoint``.

It gives everything the audit needs: token-id prompts and ``tokens`` back (``return_tokens``),
``n_probs`` with ``post_sampling_probs`` (the law the sampler chain leaves), the speculation
counters of each request (``timings.draft_n``, ``draft_n_accepted``), the per-request prompt-cache
switch (``cache_prompt``) and the speculation types each slot runs (``/slots``). See
docs/serving-llama-cpp.md for what each field is in llama.cpp's source.
"""
from __future__ import annotations

from dataclasses import replace

from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.constraints import choice_gbnf, regex_gbnf
from exactcheck.endpoints.endpoint import POST_SAMPLING, Completion, Endpoint, Sampling, int_or_none, probability_of
from exactcheck.endpoints.sampler_law import NotDeterminable

__all__ = ["LlamaCppEndpoint", "is_llama_cpp", "llama_cpp_texts", "PENALTY_FIELDS"]

# our penalty names -> llama.cpp's request fields (server-schema.cpp: repeat_last_n, repeat_penalty,
# frequency_penalty, presence_penalty)
PENALTY_FIELDS = {"repetition_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty", "repeat_last_n": "repeat_last_n"}


def is_llama_cpp(client: Client, base: str) -> bool:
    """Whether ``base`` answers llama.cpp's ``/props`` (a server without it is taken for OpenAI's API)."""
    try:
        props = client.get(base, "/props")
    except EndpointError:
        return False
    return any(key in props for key in ("default_generation_settings", "build_info", "model_path", "n_vocab"))


def llama_cpp_texts(client: Client, base: str, continuations: list[tuple[int, ...]]) -> list[str]:
    """llama.cpp's stop strings are searched in ``generated_text``: each generated token's piece
    (``common_token_to_piece`` with special tokens not rendered, no prompt context, a leading space
    kept), concatenated (server-context.cpp ``process_token``). ``/detokenize`` renders special
    tokens ("<unk>"), so each token's piece is read from the server generating it: a one-token
    greedy ``/completion`` whose logit bias forces that token, its ``content``. A token the bias
    does not force, or a piece that is not whole UTF-8 (llama.cpp waits for the rest before it
    searches), is not determined here: ``NotDeterminable``."""
    tokens = sorted({t for c in continuations for t in c})
    bodies = [{"prompt": [t], "n_predict": 1, "temperature": 0.0, "logit_bias": [[t, 1e4]], "return_tokens": True,
               "cache_prompt": False, "stream": False, "ignore_eos": True, "exactcheck_tag": "piece"}
              for t in tokens]
    pieces = {}
    for token, exchange in zip(tokens, client.post_many(base, "/completion", bodies)):
        piece, forced = exchange.answer.get("content"), exchange.answer.get("tokens")
        if not isinstance(piece, str) or forced != [token]:
            raise NotDeterminable(f"token {token}'s text could not be read (a one-token request forcing it answered "
                                  f"{str(exchange.answer)[:60]})")
        if "\ufffd" in piece:
            raise NotDeterminable(f"token {token}'s piece is not whole UTF-8 ({piece!r}): where llama.cpp finds a "
                                  f"stop string across it is not determined here")
        pieces[token] = piece
    return ["".join(pieces[t] for t in c) for c in continuations]


def llama_cpp_constraint_fields(constraint) -> dict:
    """llama.cpp's structured-output fields (server-common.cpp ``params_from_json_cmpl``): ``json_schema``
    (converted to a grammar by the server) or ``grammar`` (GBNF); a choice and a regex go as GBNF written
    here (``constraints.choice_gbnf``, ``regex_gbnf``: ``NotDeterminable`` for a regex it cannot write)."""
    if constraint.kind == "json_schema":
        return {"json_schema": constraint.schema}
    if constraint.kind == "grammar":
        return {"grammar": constraint.value}
    if constraint.kind == "choice":
        return {"grammar": choice_gbnf(constraint.value)}
    return {"grammar": regex_gbnf(constraint.value)}


class LlamaCppEndpoint(Endpoint):
    api = "llama.cpp /completion"
    kind = POST_SAMPLING
    cache_switch = True
    path = "/completion"
    chat_dialect = "llama.cpp"

    def check(self) -> dict:
        """The server's facts (``/props``), or an ``EndpointError`` saying it is down or not llama.cpp."""
        health = self.client.get(self.base, "/health")
        if health.get("status") not in (None, "ok"):
            raise EndpointError(f"{self.base}/health says {health}")
        return self.client.get(self.base, "/props")

    def tokenize(self, text: str) -> list[int]:
        answer = self.client.post(self.base, "/tokenize", {"content": text}).answer
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EndpointError(f"{self.base}/tokenize answered {str(answer)[:80]}, not token ids")
        return tokens

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:
        # ignore_eos: every answer has exactly n_predict tokens (the end-of-text token masked, in the
        # reference's one-token requests too, so the law stays the engine's own); stop handling is
        # not audited here
        body = {"prompt": list(prompt), "n_predict": n_predict, "seed": int(seed), "return_tokens": True,
                "cache_prompt": bool(cache), "stream": False, "ignore_eos": sampling.ignore_eos, **sampling.fields()}
        body.update(sampling.penalty_fields(PENALTY_FIELDS))
        if sampling.constraint is not None:
            body.update(self.constraint_fields(sampling.constraint))
        if n_probs:
            body.update(n_probs=n_probs, post_sampling_probs=True)
        if tag is not None:
            body["exactcheck_tag"] = tag  # in the journal's key only: the client does not send it
        return body

    def continuation_texts(self, prompt: Sequence[int], continuations: list[tuple[int, ...]]) -> list[str]:
        return llama_cpp_texts(self.client, self.base, continuations)

    constraint_order = "check-then-resample"

    def constraint_fields(self, constraint) -> dict:
        return llama_cpp_constraint_fields(constraint)

    def several(self, body: dict, k: int) -> dict:
        """``n_cmpl`` (server-schema.cpp; at most the server's slots, ``-np``): children of the request
        share its prompt state and take seeds seed + 1, seed + 2, ... (server-task.h ``add_child``);
        the answer is a JSON list of ``k`` results."""
        return {**body, "n_cmpl": int(k), "exactcheck_listing": True}

    def read_several(self, exchange: Exchange) -> list[Completion]:
        results = exchange.answer.get("results", [exchange.answer])
        if not all(isinstance(r, dict) for r in results):
            raise EndpointError(f"{self.base}/completion answered {str(results)[:80]} for n_cmpl, not results")
        results = sorted(results, key=lambda r: r.get("index", 0) if isinstance(r.get("index"), int) else 0)
        return [self.read(Exchange(exchange.base, exchange.path, exchange.body, r, exchange.seconds))
                for r in results]

    def penalised(self, law, sampling: Sampling, prefix: tuple[int, ...]):
        """As listed: llama.cpp's probabilities are post-sampling (its penalties included), and its
        penalties read the same history in a one-token request as at the audited position: the
        sampler takes every prompt token before the first sample (server-context.cpp
        ``init_sampler``: ``common_sampler_accept(smpl, id, false)`` for each prompt token, which
        feeds the penalties' window: sampling.cpp ``llama_sampler_accept(gsmpl->chain, token)``), so
        the window is the last ``repeat_last_n`` tokens of prompt + continuation either way."""
        return law

    def end_of_generation(self) -> frozenset[int]:
        return llama_cpp_end_of_generation(self.client, self.base)

    def streamed(self, body: dict) -> dict:
        """``stream: true``: the answer as events, each with its ``content`` and ``tokens`` (and its
        ``completion_probabilities`` where asked); the last, ``stop: true``, carries ``stop_type``,
        ``timings`` and ``tokens_predicted`` (llama.cpp's server sends one per token it emits)."""
        return {**body, "stream": True}

    def read_stream(self, exchange: Exchange) -> Completion:
        """The events reassembled into the answer ``read`` reads: every event's tokens, text and
        probabilities joined in order, the final event's stop and timings; with the tokens each event
        carried and the count the final event gives (``tokens_predicted``)."""
        events = [e for e in exchange.answer.get("events") or () if isinstance(e, dict)]
        if not events:
            raise EndpointError(f"{self.base}/completion streamed no events")
        tokens, content, probabilities, carried = [], "", [], []
        for event in events:
            ids = event.get("tokens") or []
            if not isinstance(ids, list):
                raise EndpointError(f"{self.base}/completion streamed tokens {str(ids)[:60]}, not a list")
            tokens += ids
            piece = event.get("content")
            content += piece if isinstance(piece, str) else ""
            probabilities += event.get("completion_probabilities") or []
            if ids:
                carried.append(len(ids))
        final = events[-1]
        merged = {k: v for k, v in final.items() if k not in ("tokens", "content", "completion_probabilities")}
        merged.update(tokens=tokens, content=content, completion_probabilities=probabilities)
        completion = self.read(Exchange(exchange.base, exchange.path, exchange.body, merged, exchange.seconds))
        return replace(completion, events=tuple(carried), usage_tokens=int_or_none(final.get("tokens_predicted")))

    def read(self, exchange: Exchange) -> Completion:
        answer = exchange.answer
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise EndpointError(f"{self.base}/completion answered no token ids (field 'tokens': "
                                f"{str(tokens)[:60]}); --api llama.cpp needs llama.cpp's /completion")
        stopped = bool(answer.get("stopped_eos")) or answer.get("stop_type") == "eos"
        probabilities = None
        listed = answer.get("completion_probabilities")
        if exchange.body.get("n_probs") and isinstance(listed, list):
            # every entry read (an entry past the answer's tokens is the finish check's finding)
            probabilities = tuple(_token_probability(entry) for entry in listed)
        timings = answer.get("timings") or {}
        content = answer.get("content")
        return Completion(tuple(tokens), probabilities, int_or_none(timings.get("draft_n")),
                          int_or_none(timings.get("draft_n_accepted")), stopped, POST_SAMPLING,
                          content if isinstance(content, str) else None,
                          usage_tokens=int_or_none(answer.get("tokens_predicted")))

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        entries = exchange.answer.get("completion_probabilities")
        if not isinstance(entries, list) or not entries:
            if exchange.answer.get("stop_type") == "eos" or exchange.answer.get("stopped_eos"):
                return None
            raise EndpointError(f"{self.base}/completion gave no completion_probabilities for n_probs="
                                f"{exchange.body.get('n_probs')}: the reference must report post-sampling probabilities")
        return listed_top(self.base, entries[0])

    def speculation_settings(self) -> dict[str, object]:
        try:
            slots = self.client.get(self.base, "/slots", listing=True)
        except EndpointError:
            return {}
        if isinstance(slots, dict):
            slots = slots.get("slots", [])
        settings = {}
        for slot in slots if isinstance(slots, list) else []:
            params = slot.get("params") if isinstance(slot, dict) else None
            for key, value in (params or {}).items():
                if "spec" in key or "draft" in key:
                    settings[key] = value
            if isinstance(slot, dict) and "speculative" in slot:
                settings["speculative"] = slot["speculative"]
        return settings


def listed_top(base: str, entry: dict) -> dict[int, float]:
    """The top list of one llama.cpp probability entry (``top_probs`` or ``top_logprobs``), by id."""
    top = entry.get("top_probs") or entry.get("top_logprobs")
    if not isinstance(top, list):
        raise EndpointError(f"{base}: a probability entry without top_probs or top_logprobs")
    listed: dict[int, float] = {}
    for item in top:
        token, p = item.get("id"), probability_of(item)
        if isinstance(token, int) and not isinstance(token, bool) and p is not None:
            listed[token] = listed.get(token, 0.0) + p
    return listed


def _token_probability(entry: dict) -> float:
    p = probability_of(entry)
    if p is None:
        raise EndpointError(f"a completion probability entry has neither prob nor logprob: {str(entry)[:80]}")
    return p


def llama_cpp_end_of_generation(client: Client, base: str) -> frozenset[int]:
    """llama.cpp's end-of-generation id: the ``eos_token`` its ``/props`` names, tokenized with
    ``parse_special`` (one id); ``NotDeterminable`` where it names none or it is not one token. (An
    answer that ends on another end-of-generation token, a model's end-of-turn, is then not judged:
    the runner checks every answer's end against these ids.)"""
    props = client.get(base, "/props")
    token = props.get("eos_token") if isinstance(props, dict) else None
    if not isinstance(token, str) or not token:
        raise NotDeterminable(f"{base}/props names no eos_token (declare the model's end-of-generation ids with "
                              f"--eos-ids)")
    answer = client.post(base, "/tokenize", {"content": token, "add_special": False, "parse_special": True}).answer
    ids = answer.get("tokens")
    if not (isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], int) and not isinstance(ids[0], bool)):
        raise NotDeterminable(f"{base}/tokenize gave {str(ids)[:40]} for the eos_token {token!r}, not one id "
                              f"(declare the model's end-of-generation ids with --eos-ids)")
    return frozenset(ids)
