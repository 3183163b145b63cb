"""What an endpoint must answer, and how its answers are read: the serve audit's contract.

An ``Endpoint`` is one API of one server, as the audit uses it: request bodies built from a
prompt (token ids), a length, the ``Sampling`` settings and a seed; answers read into
``Completion``s; the next-token law after a prefix (``next_token_laws``) in the kind asked for
("post-sampling": what the sampler chain leaves; "raw": the model's softmax). Two APIs implement it:

- llama.cpp's native ``POST /completion`` (``exactcheck.endpoints.llama_cpp_api``): token ids, ``n_probs``
  with ``post_sampling_probs``, the server's speculation counters per request in ``timings``;
- OpenAI's ``POST /v1/completions`` (``exactcheck.endpoints.openai_api``), as vLLM, SGLang and
  llama.cpp serve it: token-id prompts, ids back (vLLM ``return_token_ids``; llama.cpp through
  ``logprobs``), ``logprobs`` top lists, speculation counters from ``/metrics`` where the server
  has them.

``exactcheck.endpoints.apis.open_endpoint`` picks one. Anything an endpoint cannot use is an ``EndpointError`` naming the field (one line, exit 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from urllib.parse import quote, unquote
from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.constraints import Constraint, split_spec
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw

__all__ = ["Sampling", "Completion", "Endpoint", "GREEDY_SAMPLING", "POST_SAMPLING", "RAW", "probability_of",
           "complete_mixed"]

POST_SAMPLING, RAW = "post-sampling", "raw"


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a request carries, as the server's API names them (llama.cpp's
    sampler chain applies them in its own order: the law is the engine's, read from its reference).
    The penalties (``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, and
    ``repeat_last_n``: the window of llama.cpp's and mlx-lm's penalties, None for the server's
    default) go out under each dialect's own field names (``penalty_fields``); which of them the
    audit can judge, and how, is each dialect's ``Endpoint.penalised`` (docs/serving.md, "Penalties
    in the serve law")."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_last_n: int | None = None  # None: the server's default window
    # stop strings: the server ends an answer at the first token whose text completes one (the law
    # of such answers: ``exactcheck.serve.stop_law``)
    stop: tuple[str, ...] = ()
    # True (the default): every answer has exactly the asked number of tokens (end-of-generation tokens
    # masked); False: an answer ends where the server samples one, and its law ends there too
    ignore_eos: bool = True
    # vLLM's min_tokens: end-of-generation tokens masked for an answer's first tokens (with ignore_eos False)
    min_tokens: int = 0
    # structured output (``exactcheck.endpoints.constraints``): each dialect writes it in its own field
    # (``Endpoint.constraint_fields``); its answers end where the constraint ends (ignore_eos off)
    constraint: Constraint | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty)

    def fields(self) -> dict:
        """The truncation and temperature settings and the stop strings where set (every dialect's
        names); penalties: ``penalty_fields``; the end of generation: ``ignore_eos`` and ``min_tokens``
        (each dialect writes them its own way)."""
        fields = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}
        if self.stop:
            fields["stop"] = list(self.stop)
        return fields

    @property
    def finishes(self) -> bool:
        """Whether an answer may end on an end-of-generation token (``ignore_eos`` off)."""
        return not self.ignore_eos

    def penalty_fields(self, names: dict[str, str]) -> dict:
        """The penalties that are set, under a dialect's ``names`` (our name -> its field; a penalty
        the dialect has no field for is refused: ``EndpointError``)."""
        values = {"repetition_penalty": self.repetition_penalty if self.repetition_penalty != 1.0 else None,
                  "presence_penalty": self.presence_penalty or None,
                  "frequency_penalty": self.frequency_penalty or None,
                  "repeat_last_n": self.repeat_last_n if self.penalized else None}
        out = {}
        for key, value in values.items():
            if value is None:
                continue
            if key not in names:
                raise EndpointError(f"sampling {self.spec()!r}: this API has no {key} (its penalties: "
                                    f"{', '.join(sorted(names))})")
            out[names[key]] = value
        return out

    def describe(self) -> str:
        if self.greedy:
            words = "greedy (temperature 0)"
        else:
            parts = [f"temperature {self.temperature:g}"]
            if self.top_k:
                parts.append(f"top-k {self.top_k}")
            if self.top_p < 1:
                parts.append(f"top-p {self.top_p:g}")
            if self.min_p > 0:
                parts.append(f"min-p {self.min_p:g}")
            words = ", ".join(parts)
        for key, value in (("repetition penalty", self.repetition_penalty if self.repetition_penalty != 1 else 0),
                           ("presence penalty", self.presence_penalty), ("frequency penalty", self.frequency_penalty)):
            if value:
                words += f", {key} {value:g}"
        if self.penalized and self.repeat_last_n is not None:
            words += f" over the last {self.repeat_last_n} tokens"
        if self.stop:
            words += ", stop at " + " or ".join(map(repr, self.stop))
        if self.constraint is not None:
            words += ", " + self.constraint.describe()
        if self.finishes:
            words += ", ending at an end-of-generation token" + (
                f" (masked for the first {self.min_tokens} tokens: min_tokens)" if self.min_tokens else "")
        return words

    def spec(self) -> str:
        values = {**{k: v for k, v in self.fields().items() if k != "stop"},
                  "repetition_penalty": self.repetition_penalty, "presence_penalty": self.presence_penalty,
                  "frequency_penalty": self.frequency_penalty, "repeat_last_n": self.repeat_last_n}
        parts = [f"{k}={v:g}" for k, v in values.items() if v is not None and v != getattr(Sampling(), k)]
        parts += ["ignore_eos=0"] if self.finishes and self.constraint is None else []
        parts += [f"min_tokens={self.min_tokens}"] if self.min_tokens else []
        parts += [f"stop={quote(s, safe='')}" for s in self.stop]
        return ",".join(parts + ([self.constraint.spec()] if self.constraint is not None else []))

    @classmethod
    def parse(cls, spec: str) -> "Sampling":
        """'temperature=0.7,top_k=2' -> Sampling(0.7, 2); 'greedy' -> temperature 0; penalties:
        'repetition_penalty=1.3', 'presence_penalty=0.5', 'frequency_penalty=0.5', 'repeat_last_n=64';
        stop strings, percent-encoded, one key each: 'stop=%0A,stop=ab' (a newline, or "ab"); a
        constraint last, its value running to the end of the spec: 'choice=yes|no', 'regex=[ab]{1,3}',
        'json_schema=@schema.json', 'grammar=@file.gbnf' (``constraints.Constraint``)."""
        if spec.strip() == "greedy":
            return GREEDY_SAMPLING
        head, constraint = split_spec(spec)
        if constraint is not None:
            return _constrained(cls.parse(head) if head.strip() else cls(), constraint, spec)
        kinds = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float,
                 "presence_penalty": float, "frequency_penalty": float, "repeat_last_n": int,
                 "ignore_eos": _switch, "min_tokens": int}
        values, stops = {}, []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if key in UNJUDGED_FIELDS:
                raise ValueError(f"sampling {spec!r}: {key} is not judged: {UNJUDGED_FIELDS[key]}")
            if sep and key == "stop" and unquote(value):
                stops.append(unquote(value))
                continue
            if not sep or key not in kinds:
                raise ValueError(f"sampling {spec!r}: expected KEY=VALUE with KEY in {sorted([*kinds, 'stop'])}")
            values[key] = kinds[key](value)
        sampling = cls(**values, stop=tuple(stops))
        if not (sampling.temperature >= 0 and sampling.top_k >= 0 and 0 < sampling.top_p <= 1
                and 0 <= sampling.min_p < 1):
            raise ValueError(f"sampling {spec!r}: temperature >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1)")
        if not (sampling.repetition_penalty > 0 and math.isfinite(sampling.repetition_penalty)
                and math.isfinite(sampling.presence_penalty) and math.isfinite(sampling.frequency_penalty)
                and (sampling.repeat_last_n is None or sampling.repeat_last_n >= -1)):
            raise ValueError(f"sampling {spec!r}: repetition_penalty > 0, presence and frequency penalties finite, "
                             f"repeat_last_n >= -1 (-1: the whole context, llama.cpp)")
        if sampling.min_tokens < 0 or (sampling.min_tokens and sampling.ignore_eos):
            raise ValueError(f"sampling {spec!r}: min_tokens >= 0, and only with ignore_eos=0 (with ignore_eos every "
                             f"answer has the asked length and min_tokens says nothing)")
        return sampling


GREEDY_SAMPLING = Sampling(temperature=0.0)
# settings a request can carry that the serve audit does not judge, and why (``Sampling.parse`` refuses them)
UNJUDGED_FIELDS = {
    "n": "every world's independent_samples check asks n (--samples-per-request)",
}


def _constrained(sampling: Sampling, constraint: Constraint, spec: str) -> Sampling:
    """``sampling`` with ``constraint``: its answers end where the constraint ends, so end-of-generation
    tokens are not masked (with ignore_eos an engine may unmask every token once its grammar has ended)."""
    if sampling.stop or sampling.min_tokens or sampling.penalized:
        raise ValueError(f"sampling {spec!r}: a constraint with stop strings, min_tokens or penalties is not judged")
    if "ignore_eos" in spec.partition(constraint.kind + "=")[0] and sampling.ignore_eos:
        raise ValueError(f"sampling {spec!r}: a constraint's answers end where it ends: ignore_eos is not taken")
    return replace(sampling, ignore_eos=False, constraint=constraint)


def _switch(value: str) -> bool:
    words = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
    if value.strip().lower() not in words:
        raise ValueError(f"{value!r} is not 0 or 1")
    return words[value.strip().lower()]


@dataclass(frozen=True)
class Completion:
    """One answer: the generated token ids (an end-of-generation token included when the server
    stopped on one), the probability the server reported for each (None when not asked) and of
    which kind (``POST_SAMPLING`` or ``RAW``), its speculation counters (None: not reported
    per request) and its text (where the API returns it)."""

    tokens: tuple[int, ...]
    probabilities: tuple[float, ...] | None
    draft_n: int | None
    draft_accepted: int | None
    stopped_on_eog: bool
    probability_kind: str = POST_SAMPLING
    text: str | None = None  # the answer's text as the server returned it (cut before a stop string it found)
    # when the request was in flight (``time.monotonic``): None for an answer taken from the journal
    sent_at: float | None = None
    answered_at: float | None = None
    # a streamed answer (``Endpoint.read_stream``): the token ids each event carried (in order), and the
    # completion tokens its usage (or final event) counted, None where it reports none
    events: tuple[int, ...] | None = None
    usage_tokens: int | None = None


class Endpoint:
    """One API of the server at ``base`` (``http://127.0.0.1:8080``), read through ``client``.
    Subclasses say how a request is written (``body``) and an answer read (``read``,
    ``listed_next_token``); what the audit asks of either is here."""

    api = "?"
    kind = POST_SAMPLING  # the kind of the probabilities this endpoint lists
    cache_switch = False  # whether a request can turn the server's prompt (prefix) cache off
    path = "/completion"
    chat_dialect: str | None = None  # its chat endpoint's dialect (``serve.chat.CHAT_DIALECTS``); None: not audited
    min_tokens = False  # whether a request can carry ``min_tokens`` (vLLM's)
    takes_ignore_eos = True  # whether a request can carry ``ignore_eos`` (else answers end where the model ends them)

    def __init__(self, base: str, client: Client, *, model: str | None = None):
        self.base, self.client, self.model = base, client, model
        self.vocab_size: int | None = None

    def describe(self) -> str:
        return f"{self.base} ({self.api})"

    def check(self) -> dict:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        raise EndpointError(f"{self.describe()} cannot tokenize text: give prompts as token ids (--prompt-ids)")

    # server settings no answer shows, which an operator may declare (--server-setting NAME=VALUE): name ->
    # {value: what it means}; ``declared``: what was declared (``apis.open_endpoint`` checks and sets it)
    declarable: dict = {}
    declared: dict = {}

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """A prompt of token ids this API can send (a text-prompt dialect: one whose text reads back as
        them); ``EndpointError`` before the audit starts where it cannot."""

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:  # pragma: no cover
        raise NotImplementedError

    def read(self, exchange: Exchange) -> Completion:  # pragma: no cover
        raise NotImplementedError

    def end_of_generation(self) -> frozenset[int]:
        """The token ids that end an answer (``Sampling.ignore_eos`` off), as the server names them;
        ``NotDeterminable`` with the reason where the audit cannot read them (``--eos-ids`` declares them)."""
        raise NotDeterminable(f"{self.api}: its end-of-generation ids are not read by the audit (declare them with "
                              f"--eos-ids)")

    def streamed(self, body: dict) -> dict:
        """``body`` asking its answer as a stream of events (``read_stream`` reassembles it); a
        dialect whose stream the audit does not read: ``NotDeterminable`` with the reason."""
        raise NotDeterminable(f"{self.api}: its streamed answers are not read by the audit")

    def read_stream(self, exchange: Exchange) -> Completion:  # pragma: no cover - where ``streamed`` is
        raise NotImplementedError

    def unseeded(self, body: dict, tag: str) -> dict:
        """``body`` without its seed (the server draws its own random numbers, as for most users'
        requests), told apart from its twins in the journal by ``tag`` (identical bodies would
        otherwise share one journalled answer)."""
        body = {k: v for k, v in body.items() if k != "seed"}
        params = body.get("sampling_params")
        if isinstance(params, dict):
            body["sampling_params"] = {k: v for k, v in params.items() if k != "seed"}
        body["exactcheck_tag"] = f"{body['exactcheck_tag']}/{tag}" if body.get("exactcheck_tag") else tag
        return body

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:  # pragma: no cover
        """The probabilities the answer to a one-token request lists for its first position (None:
        the prompt already ends the text)."""
        raise NotImplementedError

    def several(self, body: dict, k: int) -> dict:
        """``body`` (one request's) asking ``k`` samples of it at once (OpenAI's ``n``); an API
        that has no such field: ``NotDeterminable`` with the reason (the check is not judged)."""
        raise NotDeterminable(f"{self.api} takes no field for several samples of one request")

    def read_several(self, exchange: Exchange) -> list[Completion]:  # pragma: no cover - where ``several`` is
        raise NotImplementedError

    def complete_several(self, bodies: list[dict]) -> list[list[Completion]]:
        """Each answer to a ``several`` body: its samples, in the order the server gave them."""
        return [self.read_several(exchange) for exchange in self.client.post_many(self.base, self.path, bodies)]

    def continuation_texts(self, prompt: Sequence[int], continuations: list[tuple[int, ...]]) -> list[str]:
        """The text the server searches for stop strings after ``prompt`` has been continued by
        each of ``continuations`` (``exactcheck.serve.stop_law``); ``NotDeterminable`` where the
        audit cannot know it."""
        raise NotDeterminable(f"{self.api}: the text its stop strings are searched in is not read by the audit")

    def constraint_pieces(self, prompt: Sequence[int], tokens: list[int]) -> list[str]:
        """Each token's text right after ``prompt`` as a constraint's mask reads it
        (``serve.constraint_law``): like ``continuation_texts``, except that a piece ending inside a
        UTF-8 character keeps ``constraints.INCOMPLETE`` for its bytes, where the stop-string search's
        text drops it (a dialect that drops it overrides this)."""
        return self.continuation_texts(prompt, [(t,) for t in tokens])

    def penalised(self, law: NextTokenLaw, sampling: Sampling, prefix: tuple[int, ...]) -> NextTokenLaw:
        """The law a one-token request listed (``self.kind``), turned into the one the audited request
        has after the continuation ``prefix`` under ``sampling``'s penalties: a one-token request reads
        ``prefix`` as prompt, the audited request as output, and a penalty's history may tell them
        apart. Each dialect says what it can derive; here, none (``NotDeterminable`` where a penalty is on)."""
        if sampling.penalized:
            raise NotDeterminable(f"{self.api}: how its penalties read prompt and output is not known to the audit")
        return law

    # how the engine applies a constraint's mask with its sampler chain: "mask-first" (the mask on the
    # logits, then the chain: vLLM, SGLang) or "check-then-resample" (llama.cpp's common_sampler_sample: the
    # chain samples, and a token the grammar rejects is sampled again with the mask applied first)
    constraint_order = "mask-first"

    def constraint_fields(self, constraint) -> dict:
        """The request fields that carry ``constraint`` (``exactcheck.endpoints.constraints``) in this
        dialect; ``NotDeterminable`` with the reason where it has none the audit sends."""
        raise NotDeterminable(f"{self.api}: the audit sends no structured-output field to this API")

    def speculation_totals(self) -> tuple[int, int] | None:
        """(tokens drafted, drafts accepted) counted by the server since it started, where it counts
        them server-wide (vLLM's ``/metrics``); None where it reports them per request or not at all."""
        return None

    def speculation_settings(self) -> dict[str, object]:
        """The speculation settings the server exposes (name -> value); empty where it exposes none."""
        return {}

    def complete_many(self, bodies: list[dict]) -> list[Completion]:
        return complete_mixed([(self, body) for body in bodies])

    def next_token_laws(self, prompt: Sequence[int], prefixes: list[tuple[int, ...]], sampling: Sampling,
                        n_probs: int, kind: str = POST_SAMPLING) -> list[NextTokenLaw]:
        """The law of the token after each prefix (one-token requests: the target alone), of ``kind``:
        ``POST_SAMPLING``, the law ``sampling`` gives (the engine's own sampler chain where the server
        reports it, else derived from the raw probabilities where that is determinable:
        ``exactcheck.endpoints.sampler_law``); ``RAW``, the model's softmax (asked at temperature 1, no
        truncation, where the server reports post-sampling probabilities)."""
        if kind not in (POST_SAMPLING, RAW):  # another dialect's kind (SGLang's tempered probabilities)
            raise NotDeterminable(f"{self.api} reports no probabilities of the kind {kind!r}")
        # one token's law: a stop string ends answers, it does not change a next-token law; a constraint's
        # mask is the audit's own (``serve.constraint_law``), from the unconstrained law
        asked = replace(sampling, stop=(), constraint=None) if kind == self.kind or self.kind == RAW else \
            Sampling(ignore_eos=sampling.ignore_eos)
        bodies = [self.body(list(prompt) + list(prefix), 1, asked, seed=0, n_probs=n_probs) for prefix in prefixes]
        laws = []
        for prefix, exchange in zip(prefixes, self.client.post_many(self.base, self.path, bodies)):
            listed = self.listed_next_token(exchange)
            if listed is None:
                laws.append(NextTokenLaw({}, 0.0))  # the prompt already ends the text
                continue
            complete = self.vocab_size is not None and n_probs >= self.vocab_size
            law = NextTokenLaw.normalised(listed, listed_all=complete or sum(listed.values()) >= 1 - 1e-6)
            if kind == POST_SAMPLING:
                law = self.penalised(law, sampling, tuple(prefix))  # NotDeterminable says why not
            if kind == POST_SAMPLING and self.kind == RAW:
                law = sampling_law_from_raw(law, sampling)  # NotDeterminable says why not
            laws.append(law)
        return laws


def probability_of(item: dict) -> float | None:
    if isinstance(item.get("prob"), (int, float)) and not isinstance(item.get("prob"), bool):
        return float(item["prob"])
    if isinstance(item.get("logprob"), (int, float)) and not isinstance(item.get("logprob"), bool):
        return math.exp(float(item["logprob"]))
    return None


def int_or_none(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def complete_mixed(requests: list[tuple["Endpoint", dict]], concurrency: int | None = None) -> list[Completion]:
    """Each (endpoint, body) sent in the order given, in one stream through the endpoints' shared
    client (at most ``concurrency``, default the client's, in flight, whichever endpoint each goes to:
    mixed traffic), and read by its endpoint; each answer with the time its request was in flight."""
    if not requests:
        return []
    client = requests[0][0].client
    exchanges = client.post_mixed([(endpoint.base, endpoint.path, body) for endpoint, body in requests], concurrency)
    return [replace(endpoint.read_stream(exchange) if body.get("stream") else endpoint.read(exchange),
                    sent_at=exchange.sent_at, answered_at=exchange.answered_at)
            for (endpoint, body), exchange in zip(requests, exchanges)]
