"""What an endpoint must answer, and how its answers are read: the serve audit's contract.

A served model is reached through llama.cpp's native API (``POST /completion``: token-id prompts,
``n_probs`` with ``post_sampling_probs``, the server's own speculation counters in ``timings``),
which gives the audit everything it needs. ``Completion`` is one answer as the audit uses it;
anything else is an ``EndpointError`` naming the field (one line, exit 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from exactcheck.serve.client import Client, EndpointError, Exchange
from exactcheck.serve.continuation_law import NextTokenLaw

__all__ = ["Sampling", "Completion", "Endpoint", "GREEDY_SAMPLING"]


@dataclass(frozen=True)
class Sampling:
    """The sampling settings a request carries, as the server's API names them (llama.cpp's
    sampler chain applies them in its own order: the law is the engine's, read from its reference)."""

    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    min_p: float = 0.0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def fields(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p}

    def describe(self) -> str:
        if self.greedy:
            return "greedy (temperature 0)"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        if self.min_p > 0:
            parts.append(f"min-p {self.min_p:g}")
        return ", ".join(parts)

    def spec(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.fields().items() if v != getattr(Sampling(), k))

    @classmethod
    def parse(cls, spec: str) -> "Sampling":
        """'temperature=0.7,top_k=2' -> Sampling(0.7, 2); 'greedy' -> temperature 0."""
        if spec.strip() == "greedy":
            return GREEDY_SAMPLING
        kinds = {"temperature": float, "top_k": int, "top_p": float, "min_p": float}
        values = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in kinds:
                raise ValueError(f"sampling {spec!r}: expected KEY=VALUE with KEY in {sorted(kinds)}")
            values[key] = kinds[key](value)
        sampling = cls(**values)
        if not (sampling.temperature >= 0 and sampling.top_k >= 0 and 0 < sampling.top_p <= 1
                and 0 <= sampling.min_p < 1):
            raise ValueError(f"sampling {spec!r}: temperature >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1)")
        return sampling


GREEDY_SAMPLING = Sampling(temperature=0.0)


@dataclass(frozen=True)
class Completion:
    """One answer: the generated token ids (an end-of-generation token included when the server
    stopped on one), the probability the server reported for each (None when not asked), and its
    speculation counters."""

    tokens: tuple[int, ...]
    probabilities: tuple[float, ...] | None
    draft_n: int | None
    draft_accepted: int | None
    stopped_on_eog: bool


@dataclass
class Endpoint:
    """A llama.cpp server at ``base`` (``http://127.0.0.1:8080``), read through ``client``."""

    base: str
    client: Client
    eog: tuple[int, ...] = ()  # end-of-generation token ids, when known
    vocab_size: int | None = None

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

    @staticmethod
    def body(prompt: list[int], n_predict: int, sampling: Sampling, seed: int, n_probs: int = 0,
             post_sampling: bool = True) -> dict:
        # ignore_eos: every answer has exactly n_predict tokens (the end-of-text token masked, in the
        # reference's one-token requests too, so the law stays the engine's own); stop handling is
        # not audited here
        body = {"prompt": list(prompt), "n_predict": n_predict, "seed": int(seed), "return_tokens": True,
                "cache_prompt": True, "stream": False, "ignore_eos": True, **sampling.fields()}
        if n_probs:
            body.update(n_probs=n_probs, post_sampling_probs=post_sampling)
        return body

    def complete_many(self, bodies: list[dict]) -> list[Completion]:
        return [self.read(exchange) for exchange in self.client.post_many(self.base, "/completion", bodies)]

    def read(self, exchange: Exchange) -> Completion:
        answer = exchange.answer
        tokens = answer.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise EndpointError(f"{self.base}/completion answered no token ids (field 'tokens': "
                                f"{str(tokens)[:60]}); exactcheck serve needs llama.cpp's /completion")
        stopped = bool(answer.get("stopped_eos")) or answer.get("stop_type") == "eos"
        probabilities = None
        listed = answer.get("completion_probabilities")
        if exchange.body.get("n_probs") and isinstance(listed, list):
            probabilities = tuple(_token_probability(entry) for entry in listed[:len(tokens)])
        timings = answer.get("timings") or {}
        return Completion(tuple(tokens), probabilities, _int(timings.get("draft_n")),
                          _int(timings.get("draft_n_accepted")), stopped)

    def next_token_laws(self, prompt: list[int], prefixes: list[tuple[int, ...]], sampling: Sampling,
                        n_probs: int) -> list[NextTokenLaw]:
        """The law of the token after each prefix (one-token requests: the target alone), as the
        server's sampler chain leaves it (``post_sampling_probs``)."""
        bodies = [self.body(prompt + list(prefix), 1, sampling, seed=0, n_probs=n_probs) for prefix in prefixes]
        laws = []
        for exchange in self.client.post_many(self.base, "/completion", bodies):
            entries = exchange.answer.get("completion_probabilities")
            if not isinstance(entries, list) or not entries:
                if exchange.answer.get("stop_type") == "eos" or exchange.answer.get("stopped_eos"):
                    laws.append(NextTokenLaw({}, 0.0))  # the prompt already ends the text
                    continue
                raise EndpointError(f"{self.base}/completion gave no completion_probabilities for n_probs="
                                    f"{n_probs}: the reference must report post-sampling probabilities")
            top = entries[0].get("top_probs") or entries[0].get("top_logprobs")
            if not isinstance(top, list):
                raise EndpointError(f"{self.base}/completion: completion_probabilities without top_probs")
            listed = {}
            for item in top:
                token, p = item.get("id"), _probability(item)
                if isinstance(token, int) and p is not None:
                    listed[token] = listed.get(token, 0.0) + p
            complete = self.vocab_size is not None and n_probs >= self.vocab_size
            laws.append(NextTokenLaw.normalised(listed, listed_all=complete or sum(listed.values()) >= 1 - 1e-6))
        return laws


def _probability(item: dict) -> float | None:
    if isinstance(item.get("prob"), (int, float)):
        return float(item["prob"])
    if isinstance(item.get("logprob"), (int, float)):
        return math.exp(float(item["logprob"]))
    return None


def _token_probability(entry: dict) -> float:
    p = _probability(entry)
    if p is None:
        raise EndpointError(f"a completion probability entry has neither prob nor logprob: {str(entry)[:80]}")
    return p


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
