"""A prompt given as messages: the chat endpoint (``POST /v1/chat/completions``) as a serve-audit world.

A chat world is a world like any other (``runner.ServeWorld``): its law is the reference's law of the
first L tokens after a prompt of token ids, computed from the reference's completions endpoint by
the same one-token requests (``continuation_law``); only the audited requests differ: they go to the
chat endpoint with the messages, and the ids of the answer are read from what the chat answer
returns. Two things must be known, and neither is ever guessed:

- **the tokens the template made** (``template_tokens``): where the server says (llama.cpp:
  ``POST /apply-template`` renders the messages by the same function its chat handler calls,
  ``oaicompat_chat_params_parse``, and ``POST /tokenize`` with ``add_special`` and ``parse_special``
  tokenises that text as the chat handler does, ``tokenize_input_prompts(..., true, true)``; vLLM:
  ``POST /tokenize`` with ``messages`` goes through the same ``preprocess_chat`` as a chat request, with
  the chat request's defaults ``add_generation_prompt=True``, ``add_special_tokens=False``), or through a
  tokenizer the user names (``--chat-template-tokenizer DIR``: transformers' ``apply_chat_template``).
  Every answer is checked against them: vLLM returns the prompt's ids (``prompt_token_ids`` with
  ``return_token_ids``), llama.cpp their number (``usage.prompt_tokens``);
- **the tokens of the answer** (``CHAT_DIALECTS``): llama.cpp's chat answer carries them only inside
  ``logprobs.content[*].id`` (``logprobs: true`` with ``top_logprobs`` >= 1: ``top_logprobs`` is its
  ``n_probs``), vLLM's in ``choices[0].token_ids`` (``return_token_ids``; a reasoning parser drops them
  unless ``include_reasoning``) or as ``"token_id:N"`` in ``logprobs.content``. An answer with text only is
  not re-tokenised (a text has several tokenisations): the world is not judged, with the reason.

``ChatRequests`` is the audited endpoint seen through one conversation: an ``Endpoint`` whose requests
go to the chat path, so the runner's checks read it as they read any endpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from exactcheck.endpoints.client import EndpointError, Exchange
from exactcheck.endpoints.endpoint import POST_SAMPLING, Completion, Endpoint, Sampling, int_or_none, probability_of
from exactcheck.endpoints.llama_cpp_api import PENALTY_FIELDS as LLAMA_PENALTY_FIELDS
from exactcheck.endpoints.sampler_law import NotDeterminable

__all__ = ["ChatPrompt", "ChatDialect", "ChatAnswer", "ChatRequests", "CHAT_DIALECTS", "CHAT_PATH", "DEFAULT_CHAT",
           "reproduce_flags", "template_tokens"]

CHAT_PATH = "/v1/chat/completions"
_TOKEN_ID = "token_id:"


@dataclass(frozen=True)
class ChatPrompt:
    """A prompt given as messages ((role, content) pairs); ``ids``: the tokens the chat template made
    of them, and ``source``: who made them (both empty until ``template_tokens`` resolves them)."""

    messages: tuple[tuple[str, str], ...]
    ids: tuple[int, ...] = ()
    source: str = ""

    @classmethod
    def parse(cls, specs: Sequence[str]) -> "ChatPrompt":
        """``["system:be brief", "user:abc"]`` -> a conversation (``ROLE:TEXT`` each, the text may hold ':')."""
        messages = []
        for spec in specs:
            role, sep, text = spec.partition(":")
            if not sep or not role.strip() or not role.strip().isidentifier():
                raise ValueError(f"--message {spec!r}: expected ROLE:TEXT, e.g. user:Once upon a time")
            messages.append((role.strip(), text))
        if not messages:
            raise ValueError("a chat prompt needs at least one message")
        return cls(tuple(messages))

    def as_json(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def describe(self) -> str:
        return "[" + ", ".join(f"{role}: {content!r}" for role, content in self.messages) + "]"

    def specs(self) -> list[str]:
        return [f"{role}:{content}" for role, content in self.messages]


DEFAULT_CHAT = ChatPrompt((("user", "Once upon a time"),))


def reproduce_flags(prompt: ChatPrompt, tokenizer: str | None = None) -> str:
    """The command-line flags that give ``prompt`` (and the tokenizer whose template made its ids)."""
    import shlex
    flags = "".join(f" --message {shlex.quote(spec)}" for spec in prompt.specs())
    return flags + (f" --chat-template-tokenizer {shlex.quote(tokenizer)}" if tokenizer else "")


@dataclass(frozen=True)
class ChatAnswer:
    """What a chat answer says: its token ids (None: it carries none, ``missing`` says why), the
    probability reported for each (None: none), the prompt's ids or their number where the answer
    gives them, the speculation counters, and whether it stopped (``finish_reason`` "stop")."""

    tokens: tuple[int, ...] | None
    missing: str = ""
    probabilities: tuple[float, ...] | None = None
    prompt_ids: tuple[int, ...] | None = None
    prompt_count: int | None = None
    draft_n: int | None = None
    draft_accepted: int | None = None
    stopped: bool = False


@dataclass(frozen=True)
class ChatDialect:
    """How one server family renders a conversation (``template``: the template's token ids), writes a
    chat request (``body``) and reads its answer (``read``); ``gives``: the words for the report."""

    name: str
    template: Callable[[Endpoint, list[dict]], list[int]]
    template_words: str
    body: Callable[..., dict]  # (endpoint, messages, n_predict, sampling, seed, n_probs, cache) -> dict
    read: Callable[[Endpoint, Exchange], ChatAnswer]
    gives: str
    cache_switch: bool


# --- llama.cpp (tools/server, release 11434) -------------------------------------------------------

def _llama_template(endpoint: Endpoint, messages: list[dict]) -> list[int]:
    rendered = endpoint.client.post(endpoint.base, "/apply-template", {"messages": messages}).answer.get("prompt")
    if not isinstance(rendered, str):
        raise EndpointError(f"{endpoint.base}/apply-template answered no prompt text")
    # the chat handler tokenises the rendered text with add_special and parse_special both true
    answer = endpoint.client.post(endpoint.base, "/tokenize", {"content": rendered, "add_special": True,
                                                               "parse_special": True}).answer
    return _id_list(answer.get("tokens"), f"{endpoint.base}/tokenize")


def _llama_body(endpoint: Endpoint, messages: list[dict], n_predict: int, sampling: Sampling, seed: int,
                n_probs: int, cache: bool) -> dict:
    # ids come back only inside logprobs.content, so every request asks logprobs (top_logprobs is
    # llama.cpp's n_probs: 0 would give no entries at all); post_sampling_probs and ignore_eos and
    # cache_prompt are passed through to the completion as on /completion
    return {"messages": messages, "max_tokens": n_predict, "stream": False, "seed": int(seed), **sampling.fields(),
            "ignore_eos": True, "logprobs": True, "top_logprobs": max(int(n_probs), 1),
            "post_sampling_probs": endpoint.kind == POST_SAMPLING, "cache_prompt": bool(cache),
            **sampling.penalty_fields(LLAMA_PENALTY_FIELDS)}


def _llama_read(endpoint: Endpoint, exchange: Exchange) -> ChatAnswer:
    answer, choice = exchange.answer, _choice(exchange.answer)
    usage, timings = answer.get("usage") or {}, answer.get("timings") or {}
    common = dict(prompt_count=int_or_none(usage.get("prompt_tokens")), draft_n=int_or_none(timings.get("draft_n")),
                  draft_accepted=int_or_none(timings.get("draft_n_accepted")),
                  stopped=(choice or {}).get("finish_reason") == "stop")
    content = ((choice or {}).get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return ChatAnswer(None, "the chat answer carries no logprobs.content (llama.cpp returns the generated ids "
                                "only there, with logprobs: true and top_logprobs >= 1): only message.content text",
                          **common)
    ids = _id_list([e.get("id") if isinstance(e, dict) else None for e in content], None)
    if ids is None:
        return ChatAnswer(None, "logprobs.content entries without integer ids", **common)
    return ChatAnswer(tuple(ids), probabilities=_probabilities(content), **common)


# --- vLLM (vllm/entrypoints/openai/chat_completion, serve/tokenize; 0.32) ---------------------------

def _vllm_template(endpoint: Endpoint, messages: list[dict]) -> list[int]:
    # /tokenize with messages: the chat request's own defaults (add_generation_prompt true,
    # add_special_tokens false), through the same preprocess_chat
    answer = endpoint.client.post(endpoint.base, "/tokenize", {"model": endpoint.model, "messages": messages,
                                                               "add_generation_prompt": True,
                                                               "add_special_tokens": False}).answer
    return _id_list(answer.get("tokens"), f"{endpoint.base}/tokenize")


def _vllm_body(endpoint: Endpoint, messages: list[dict], n_predict: int, sampling: Sampling, seed: int,
               n_probs: int, cache: bool) -> dict:
    from exactcheck.endpoints.openai_api import VLLM_PENALTY_FIELDS, openai_sampling_body
    body = {"model": endpoint.model, "messages": messages, **openai_sampling_body(n_predict, sampling, seed),
            **sampling.penalty_fields(VLLM_PENALTY_FIELDS)}
    if n_probs:
        body.update(logprobs=True, top_logprobs=int(n_probs), return_tokens_as_token_ids=True)
    return body


def _vllm_read(endpoint: Endpoint, exchange: Exchange) -> ChatAnswer:
    answer, choice = exchange.answer, _choice(exchange.answer) or {}
    usage = answer.get("usage") or {}
    prompt_ids = _id_list(answer.get("prompt_token_ids"), None)
    common = dict(prompt_ids=tuple(prompt_ids) if prompt_ids is not None else None,
                  prompt_count=int_or_none(usage.get("prompt_tokens")), stopped=choice.get("finish_reason") == "stop")
    content = (choice.get("logprobs") or {}).get("content")
    probabilities = _probabilities(content) if isinstance(content, list) and exchange.body.get("logprobs") else None
    ids = _id_list(choice.get("token_ids"), None)
    if ids is None and isinstance(content, list):
        ids = _id_list([_entry_id(e) for e in content], None)
    if ids is None:
        return ChatAnswer(None, "the chat answer carries no choices[0].token_ids (vLLM >= 0.10.2 returns them with "
                                "return_token_ids; a reasoning parser drops them unless include_reasoning) and no "
                                "token ids in its logprobs: only message.content text", **common)
    return ChatAnswer(tuple(ids), probabilities=probabilities, **common)


CHAT_DIALECTS: dict[str, ChatDialect] = {d.name: d for d in (
    ChatDialect("llama.cpp", _llama_template, "the server's template (POST /apply-template, then /tokenize with "
                                              "add_special and parse_special, as its chat handler tokenises)",
                _llama_body, _llama_read, "ids from logprobs.content[*].id (every request asks logprobs: true, "
                                          "top_logprobs >= 1); the prompt's size from usage.prompt_tokens",
                cache_switch=True),
    ChatDialect("vllm", _vllm_template, "the server's template (POST /tokenize with messages, "
                                        "add_generation_prompt true, add_special_tokens false: a chat request's "
                                        "defaults)",
                _vllm_body, _vllm_read, "ids from choices[0].token_ids (return_token_ids); the prompt's ids from "
                                        "prompt_token_ids", cache_switch=False),
)}


def _dialect(endpoint: Endpoint) -> ChatDialect:
    name = getattr(endpoint, "chat_dialect", None)
    if name not in CHAT_DIALECTS:
        raise EndpointError(f"{endpoint.describe()}: chat worlds are audited on llama.cpp's and vLLM's "
                            f"/v1/chat/completions only")
    return CHAT_DIALECTS[name]


def template_tokens(endpoint: Endpoint, prompt: ChatPrompt, tokenizer: str | None = None) -> ChatPrompt:
    """``prompt`` with the token ids its chat template makes, from the server (``CHAT_DIALECTS``) or,
    with ``tokenizer``, from that model directory's chat template (transformers). A server that
    cannot render them (no chat template) or a tokenizer without one: an ``EndpointError`` (one line)."""
    dialect = _dialect(endpoint)
    if tokenizer is not None:
        ids = _tokenizer_template(tokenizer, prompt.as_json())
        return replace(prompt, ids=tuple(ids), source=f"the chat template of {tokenizer} (transformers "
                                                      f"apply_chat_template, add_generation_prompt)")
    try:
        ids = dialect.template(endpoint, prompt.as_json())
    except EndpointError as exc:
        raise EndpointError(f"{endpoint.base} cannot render {prompt.describe()} with a chat template ({exc}): start "
                            f"the server with one (llama.cpp --chat-template-file, vLLM --chat-template) or name "
                            f"a tokenizer with --chat-template-tokenizer DIR") from None
    if not ids:
        raise EndpointError(f"{endpoint.base}'s chat template made no tokens of {prompt.describe()}")
    return replace(prompt, ids=tuple(ids), source=dialect.template_words)


def _tokenizer_template(directory: str, messages: list[dict]) -> list[int]:
    from exactcheck.endpoints.mlx_lm_api import load_tokenizer
    tokenizer = load_tokenizer(directory)
    if not getattr(tokenizer, "chat_template", None):
        raise EndpointError(f"the tokenizer of {directory} has no chat template (--chat-template-tokenizer)")
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # noqa: BLE001 - a template that fails on these messages is the user's
        raise EndpointError(f"the chat template of {directory} fails on these messages: "
                            f"{str(exc).splitlines()[0][:160]}") from None
    if hasattr(ids, "keys") and "input_ids" in ids:  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    ids = _id_list(list(ids), f"the chat template of {directory}")
    return ids


class ChatRequests(Endpoint):
    """The audited endpoint seen through one conversation (``prompt``, resolved by
    ``template_tokens``): requests for ``prompt.ids`` go to the chat path with the messages; answers
    are read into ``Completion``s, each checked to continue exactly those ids."""

    path = CHAT_PATH

    def __init__(self, endpoint: Endpoint, prompt: ChatPrompt):
        super().__init__(endpoint.base, endpoint.client, model=endpoint.model)
        self.endpoint, self.prompt, self.dialect = endpoint, prompt, _dialect(endpoint)
        self.kind = endpoint.kind
        self.cache_switch = endpoint.cache_switch and self.dialect.cache_switch
        self.api = f"{self.dialect.name} {CHAT_PATH}"
        self.vocab_size = endpoint.vocab_size

    def describe(self) -> str:
        return f"{self.base} ({self.api}: {self.dialect.gives})"

    def check(self) -> dict:
        return self.endpoint.check()

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:
        if tuple(prompt) != self.prompt.ids:
            raise ValueError(f"a chat request for {list(prompt)[:8]}..., not for the template's tokens")
        body = self.dialect.body(self.endpoint, self.prompt.as_json(), n_predict, sampling, seed, n_probs, cache)
        if tag is not None:
            body["exactcheck_tag"] = tag  # in the journal's key only: the client does not send it
        return body

    def several(self, body: dict, k: int) -> dict:
        raise NotDeterminable("a chat world: several samples of one request are audited through the completions "
                              "worlds (a chat answer is read one choice at a time here)")

    def answer(self, exchange: Exchange) -> ChatAnswer:
        return self.dialect.read(self.endpoint, exchange)

    def unjudged(self, answer: ChatAnswer) -> str | None:
        """Why an answer's tokens are not known to continue the template's ids (None: they are)."""
        if answer.tokens is None:
            return answer.missing + "; re-tokenising text is not unambiguous, so it is not done"
        if answer.prompt_ids is not None and answer.prompt_ids != self.prompt.ids:
            return (f"the server's chat prompt ({len(answer.prompt_ids)} tokens, prompt_token_ids) is not the "
                    f"{len(self.prompt.ids)} tokens of {self.prompt.source}")
        if answer.prompt_count is not None and answer.prompt_count != len(self.prompt.ids):
            return (f"the server's chat prompt has {answer.prompt_count} tokens (usage.prompt_tokens), "
                    f"{self.prompt.source} makes {len(self.prompt.ids)}")
        if answer.prompt_ids is None and answer.prompt_count is None:
            return "the chat answer says nothing of its prompt (no prompt_token_ids, no usage.prompt_tokens)"
        return None

    def read(self, exchange: Exchange) -> Completion:
        answer = self.answer(exchange)
        why = self.unjudged(answer)
        if why is not None:
            raise EndpointError(f"{self.base}{CHAT_PATH}: {why}")
        return Completion(answer.tokens, answer.probabilities, answer.draft_n, answer.draft_accepted, answer.stopped,
                          self.kind)

    def probe(self, length: int) -> str | None:
        """One chat request (temperature 1, one probability asked): None where its answer's tokens
        are known to continue the template's ids, else why the conversation cannot be judged."""
        body = self.body(self.prompt.ids, length, Sampling(), 0, n_probs=1, tag="chat-probe")
        return self.unjudged(self.answer(self.client.post(self.base, self.path, body)))

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        raise EndpointError("a chat endpoint is never a reference: the law comes from the completions endpoint")

    def speculation_totals(self) -> tuple[int, int] | None:
        return self.endpoint.speculation_totals()

    def speculation_settings(self) -> dict[str, object]:
        return self.endpoint.speculation_settings()


def _choice(answer: dict) -> dict | None:
    choices = answer.get("choices")
    return choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None


def _id_list(values, where: str | None) -> list[int] | None:
    if isinstance(values, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in values):
        return list(values)
    if where is None:
        return None
    raise EndpointError(f"{where} answered {str(values)[:80]}, not token ids")


def _entry_id(entry) -> int | None:
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("id"), int) and not isinstance(entry.get("id"), bool):
        return entry["id"]
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(_TOKEN_ID):
        try:
            return int(token[len(_TOKEN_ID):])
        except ValueError:
            return None
    return None


def _probabilities(content: list) -> tuple[float, ...] | None:
    values = [probability_of(e) if isinstance(e, dict) else None for e in content]
    if any(v is None or math.isnan(v) for v in values):
        return None
    return tuple(values)
