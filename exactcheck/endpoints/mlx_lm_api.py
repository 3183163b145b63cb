"""mlx-lm's server (``mlx_lm.server``, 0.32.2) as a serve-audit ``Endpoint``: ``POST /v1/completions``
with text prompts. What it gives and what it lacks, each read in mlx-lm's source
(``mlx_lm/server.py``, ``generate.py``, ``sample_utils.py``; docs/serving.md, "mlx-lm's server"):

- **prompts are text only**: ``handle_text_completions`` passes ``body["prompt"]`` to
  ``tokenizer.encode`` (a list of token ids fails there, and the server answers 404). The audit
  keeps token ids (its worlds and laws are over ids) and writes each prompt as the text the
  model directory's own tokenizer decodes it to, checked to encode back to the same ids (the server
  loads that tokenizer with ``AutoTokenizer.from_pretrained``, as this module does;
  ``exactcheck.endpoints.text_prompts``). A prefix of the law with no such text (a byte-level BPE's
  ``t`` ``he``) is not asked: it stays one pooled cell of its exact mass, and a probed token after
  it is not compared (``Inexpressible``); a prompt with none is refused before the audit starts. The
  directory: ``--model DIR`` (the one ``mlx_lm.server --model DIR`` loaded; never sent: a request's
  ``model`` makes the server load that path), else the local directory its ``/v1/models`` lists
  (which answers an empty body when the Hugging Face cache directory is absent: ``scan_cache_dir``
  raises after the 200 headers are sent). Each answer's ``usage.prompt_tokens`` is checked against
  the ids written, so a different tokenizer is an error, never a wrong law;
- **token ids back**: only through ``logprobs: true`` (a bool), in ``choices[0].logprobs.content``
  as ``{id, logprob}`` per generated token, so every request asks it. With ``top_logprobs`` set the
  entries are not the generated tokens: ``generate_response`` writes ``dict(top[0],
  top_logprobs=top)``, the first of the unsorted ``argpartition`` top list (server.py), so ``top_logprobs``
  is sent only on the reference's one-token requests, whose top list is all that is read;
- **probabilities**: raw (``logits - logsumexp(logits)`` before the sampler: generate.py
  ``generate_step._step``; temperature and truncation are inside the sampler), a top list of at
  most 11 (``top_logprobs`` <= 11, ``validate_model_parameters``). The law of a setting is derived
  from the raw top 11 where every engine agrees (``exactcheck.endpoints.sampler_law``), and top-k with
  top-p is not judged: mlx-lm applies top-p before top-k (``make_sampler``), vLLM and llama.cpp
  after. A probed token's reported probability is compared only where the reference's top 11
  must list it (the request's top-k is at most 10, or the token's probability is above
  1/12 + 0.02: at most 11 tokens can be that probable); the comparison stops at the first token
  that is not;
- **no ``ignore_eos``**: an answer that ends on an end-of-text token (``finish_reason: "stop"``,
  the token included) is the prefix it stopped at; the reference's law after such a prefix is "the
  text ends" (no request). The end-of-text ids are mlx-lm's: ``config.json``'s ``eos_token_id``
  (``generation_config.json``'s when set) and the tokenizer's;
- **no speculation counters** (``speculation_ran`` is not judged) and **no settings endpoint**
  (``declared_settings`` is not judged); **no per-request prompt-cache switch** (the prompt cache
  is shared across requests: ``LRUPromptCache``, ``--prompt-cache-size``). Its penalties read the
  tokens ``generate_step`` was handed: the prompt less what the prompt cache held, then the output
  (``sample_utils.make_logits_processors``: each penalty over the last ``*_context_size``); the
  audit cannot see the cache's size, so penalties are judged only where the operator declares
  ``--server-setting prompt_cache=off`` (``--prompt-cache-size 0``: ``LRUPromptCache.insert_cache``
  evicts every entry at once, so the history is the whole prompt), checked on every answer
  (``usage.prompt_tokens_details.cached_tokens`` must be 0: else the law is not judged). Then the
  one-token request's log-probabilities are the audited request's, penalties included, as they are;
- **seeds**: a request with ``seed`` is served alone (``_is_batchable`` needs ``seed is None``),
  after ``mx.random.seed(seed)`` (``_serve_single``), so every request the audit sends is served
  one at a time.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import POST_SAMPLING, RAW, Completion, Endpoint, Sampling
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw
from exactcheck.endpoints.text_prompts import TextPrompts, load_tokenizer

__all__ = ["MlxLmEndpoint", "detect", "load_tokenizer", "MAX_TOP_LOGPROBS", "GIVES", "DECLARABLE"]

MAX_TOP_LOGPROBS = 11  # server.py validate_model_parameters: top_logprobs in [0, 11] (or -1)
# a token the audited server reports above 1/(n+1) + this is one the reference's top n must list,
# or the gap is beyond the default logprob tolerance (0.02) anyway
LISTED_MARGIN = 0.02
# what the dialect gives (apis.DIALECTS shows it; docs/serving.md)
# our penalty names -> mlx_lm.server's fields (server.py: repetition_penalty, presence_penalty,
# frequency_penalty; repeat_last_n goes out as each one's *_context_size)
PENALTY_FIELDS = {"repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty", "repeat_last_n": "repetition_context_size"}
PENALTIES_NOT_JUDGED = (
    "mlx-lm's penalties read the tokens generate_step was handed (generate.py _step: the processors see "
    "`tokens`, the prompt it was given plus the output), and the server hands it only the part of the prompt "
    "its prompt cache did not hold (server.py: fetch_nearest_cache, then stream_generate(prompt=rest)): the "
    "history depends on what earlier requests left in the cache, which no request can turn off (a server started "
    "with --prompt-cache-size 0 keeps nothing: declare it with --server-setting prompt_cache=off)")
# the settings an operator may declare (--server-setting NAME=VALUE): what no answer of this API shows
DECLARABLE = {"prompt_cache": {"off": "the server runs with --prompt-cache-size 0 (LRUPromptCache.insert_cache evicts "
                                      "every entry at once): every request's penalties read its whole prompt"}}
GIVES = dict(prompts="text (ids written through the model directory's tokenizer, checked to round-trip)",
             ids="logprobs.content[*].id with logprobs: true (no top_logprobs)",
             probabilities="raw, top 11 (top_logprobs <= 11)", counters="none (speculation_ran not judged)",
             settings="none (declared_settings not judged)", cache_switch="none (the prompt cache is shared)")
_NOT_FOUND = "Not Found"  # the body mlx_lm.server's do_GET writes for an unknown path


def detect(client: Client, base: str) -> bool:
    """Whether ``base`` is mlx-lm's server: a GET of an unknown path answers 404 with the plain body
    ``Not Found`` (``APIHandler.do_GET``), and a completion request with ``logprobs: 1`` is refused
    with ``logprobs must be of type bool`` (``validate_model_parameters``: a 400, nothing generated)."""
    try:
        client.get(base, "/props")
        return False  # answered: llama.cpp's, or another server's
    except EndpointError as exc:
        if exc.server_fault or not str(exc).startswith("HTTP 404") or not str(exc).rstrip().endswith(
                ": " + _NOT_FOUND):
            return False
    try:
        client.post(base, "/v1/completions", {"prompt": "", "max_tokens": 1, "logprobs": 1})
    except EndpointError as exc:
        return "logprobs must be of type bool" in str(exc)
    return False


def _eos_ids(directory: Path, tokenizer) -> frozenset[int]:
    """mlx-lm's end-of-text ids: config.json's ``eos_token_id``, generation_config.json's when set
    (``utils.load_config``), and the tokenizer's (``TokenizerWrapper.__init__``)."""
    def read(name: str) -> dict:
        try:
            value = json.loads((directory / name).read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    configured = read("config.json").get("eos_token_id")
    if read("generation_config.json").get("eos_token_id", False):
        configured = read("generation_config.json")["eos_token_id"]
    ids = {v for v in (configured if isinstance(configured, list) else [configured])
           if isinstance(v, int) and not isinstance(v, bool)}
    if isinstance(getattr(tokenizer, "eos_token_id", None), int):
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class MlxLmEndpoint(Endpoint):
    api = "mlx-lm /v1/completions"
    takes_ignore_eos = False  # no ignore_eos field: answers end where the model ends them
    kind = RAW
    cache_switch = False
    path = "/v1/completions"
    gives = GIVES

    def several(self, body: dict, k: int) -> dict:
        raise NotDeterminable("mlx_lm.server 0.32.2 reads no n (server.py 1299-1340: one sample per request)")

    declarable = DECLARABLE
    declared: dict = {}  # set by apis.open_endpoint

    def __init__(self, base: str, client: Client, *, model: str | None = None, reference_kind: str | None = None):
        if reference_kind not in (None, RAW):
            raise EndpointError("mlx-lm's server reports raw probabilities (generate.py: logprobs before the sampler); "
                                "--reference-probabilities post-sampling does not apply to it")
        super().__init__(base, client, model=model)
        self.directory: Path | None = None
        self.eos_ids: frozenset[int] = frozenset()
        self.specials = 0  # tokens the server's encode adds to a prompt (a BOS)
        self.prompts: TextPrompts | None = None
        self.cached: list[str] = []  # answers that reported cached prompt tokens while the cache is declared off

    def describe(self) -> str:
        declared = "".join(f"; declared by the operator: {k}={v}" for k, v in sorted(self.declared.items()))
        return (f"{self.base} ({self.api}, prompts as text through the tokenizer of {self.directory}, token ids from "
                f"logprobs, raw probabilities (top {MAX_TOP_LOGPROBS}), no speculation counters{declared})")

    @property
    def cache_off(self) -> bool:
        return self.declared.get("prompt_cache") == "off"

    # --- the server and its tokenizer

    def check(self) -> dict:
        health = self.client.get(self.base, "/health")
        if not isinstance(health, dict) or health.get("status") != "ok":
            raise EndpointError(f"{self.base}/health says {str(health)[:80]}")
        self.directory = self._model_directory()
        self.prompts = TextPrompts(self.directory)
        tokenizer = self.prompts.tokenizer
        self.eos_ids = _eos_ids(self.directory, tokenizer)
        self.vocab_size = len(tokenizer)
        special = set(tokenizer.all_special_ids)
        probe = next((i for i in range(self.vocab_size) if i not in special and self._text((i,)) is not None), None)
        if probe is None:
            raise EndpointError(f"no token of {self.directory}'s tokenizer decodes to a text that encodes back to it")
        body = self.body([probe], 1, Sampling(temperature=0.0), 0, tag="check")
        body.pop("exactcheck_prompt_length")
        answer = self.client.post(self.base, self.path, body).answer
        usage = answer.get("usage") if isinstance(answer, dict) else None
        prompt_tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if not isinstance(prompt_tokens, int) or _content(answer) is None:
            raise EndpointError(f"{self.base}{self.path} answered no usage.prompt_tokens or no logprobs.content ids "
                                f"({str(answer)[:80]}): is it mlx-lm's server?")
        self.specials = prompt_tokens - 1
        if not 0 <= self.specials <= 2:
            raise EndpointError(f"{self.base} read the text of one token of {self.directory} as {prompt_tokens} "
                                f"tokens: its tokenizer is not that directory's (--model DIR)")
        return {"model_directory": str(self.directory), "eos_ids": sorted(self.eos_ids), "specials": self.specials}

    def _model_directory(self) -> Path:
        if self.model is not None:
            path = Path(self.model).expanduser()
            if not (path / "config.json").is_file():
                raise EndpointError(f"--model {self.model}: not a local model directory (config.json); mlx-lm's "
                                    f"server takes text prompts: name the directory it serves, whose tokenizer "
                                    f"writes them")
            return path.resolve()
        try:
            models = self.client.get(self.base, "/v1/models")
        except EndpointError as exc:
            what = "an empty body" if "(got '')" in str(exc) else str(exc)[:100]
            raise EndpointError(f"{self.base}/v1/models gave no model list ({what}; mlx_lm/server.py "
                                f"handle_models_request: scan_cache_dir raises after the 200 headers when the Hugging "
                                f"Face cache directory is absent): name the model directory the server loaded with "
                                f"--model DIR") from None
        listed = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)] \
            if isinstance(models, dict) and isinstance(models.get("data"), list) else []
        local = [Path(i) for i in listed if isinstance(i, str) and (Path(i) / "config.json").is_file()]
        if len(local) != 1:
            raise EndpointError(f"{self.base}/v1/models lists {len(local)} local model directories ({listed[:4]}): "
                                f"name the one the server loaded with --model DIR")
        return local[0].resolve()

    def _text(self, ids: Sequence[int]) -> str | None:
        """The text the tokenizer decodes ``ids`` to, None where it does not encode back to them."""
        return self.prompts.text(ids)

    def tokenize(self, text: str) -> list[int]:
        ids = self.prompts.encode(text)
        if self._text(ids) is None:
            raise EndpointError(f"the text {text[:40]!r} tokenizes to {ids[:8]} whose text does not read back as the "
                                f"same ids: give prompts as token ids (--prompt-ids)")
        return list(ids)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if self._text(prompt) is None:
            raise EndpointError(f"the prompt {list(prompt)[:12]} has no text that {self.directory}'s tokenizer reads "
                                f"back as the same ids, and mlx-lm's server takes text prompts only: give another "
                                f"prompt (--prompt TEXT is always one)")

    # --- requests and answers

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None, top_logprobs: int = 0) -> dict:
        text = self.prompts.require(prompt)  # Inexpressible: the caller pools or stops (never a usage error)
        # logprobs: the only way ids come back; no "model" (the server would load that path), no
        # ignore_eos (not an mlx-lm field: an answer may end on an end-of-text token)
        body = {"prompt": text, "max_tokens": n_predict, "stream": False, "seed": int(seed), "logprobs": True,
                **sampling.fields(), **sampling.penalty_fields(PENALTY_FIELDS), "exactcheck_prompt_length": len(prompt)}
        if sampling.penalized and sampling.repeat_last_n is not None:  # one window for every penalty
            body.update({f"{k}_context_size": sampling.repeat_last_n for k in ("repetition", "presence", "frequency")})
        if top_logprobs:
            body["top_logprobs"] = min(int(top_logprobs), MAX_TOP_LOGPROBS)
        if n_probs:
            body["exactcheck_probed"] = True  # the probabilities of the generated tokens are read
        if tag is not None:
            body["exactcheck_tag"] = tag  # in the journal's key only: the client does not send it
        return body

    def checked_probabilities(self, exchange: Exchange) -> list[dict]:
        answer = exchange.answer
        content = _content(answer)
        if content is None:
            raise EndpointError(f"{self.base}{self.path} answered no logprobs.content ({str(answer)[:80]})")
        expected = exchange.body.get("exactcheck_prompt_length")
        usage = answer.get("usage") or {}
        if expected is not None and usage.get("prompt_tokens") != expected + self.specials:
            raise EndpointError(f"{self.base} read a prompt of {expected} token ids as {usage.get('prompt_tokens')} "
                                f"tokens (expected {expected + self.specials}): its tokenizer is not {self.directory}'s")
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if self.cache_off and isinstance(cached, int) and cached > 0 and len(self.cached) < 8:
            self.cached.append(f"{self.base} answered a prompt of {usage.get('prompt_tokens')} tokens with {cached} "
                               f"from its prompt cache")
        return content

    def read(self, exchange: Exchange) -> Completion:
        if exchange.body.get("top_logprobs"):
            raise EndpointError("internal: an mlx-lm answer with top_logprobs carries no generated ids")
        content = self.checked_probabilities(exchange)
        tokens = tuple(entry.get("id") for entry in content)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise EndpointError(f"{self.base}{self.path}: logprobs.content without integer ids ({str(content)[:80]})")
        choice = exchange.answer["choices"][0]
        stopped = choice.get("finish_reason") == "stop"
        if stopped and (not tokens or tokens[-1] not in self.eos_ids):
            raise EndpointError(f"{self.base} stopped on token {tokens[-1] if tokens else None}, not an end-of-text "
                                f"token of {self.directory} ({sorted(self.eos_ids)}): the law cannot place the answer")
        if not stopped and len(tokens) != exchange.body.get("max_tokens"):
            raise EndpointError(f"{self.base} answered {len(tokens)} tokens for max_tokens "
                                f"{exchange.body.get('max_tokens')} without stopping")
        probabilities = None
        if exchange.body.get("exactcheck_probed"):
            probabilities = self._listed_prefix(exchange.body, content)
            # a probed token is compared only after a context the reference can be sent as text
            depth = self.prompts.expressible_depth(self.prompts.encode(exchange.body["prompt"]), tokens)
            probabilities = probabilities[:depth + 1]
        return Completion(tokens, probabilities, None, None, stopped, RAW)

    def _listed_prefix(self, body: dict, content: list[dict]) -> tuple[float, ...]:
        """The reported probabilities of the generated tokens up to the first one the reference's
        top list need not hold (see the module's docstring)."""
        top_k, greedy = int(body.get("top_k") or 0), float(body.get("temperature", 1.0)) <= 0
        always = greedy or 0 < top_k < MAX_TOP_LOGPROBS
        floor = 1.0 / (MAX_TOP_LOGPROBS + 1) + LISTED_MARGIN
        kept = []
        for entry in content:
            logprob = entry.get("logprob")
            if not isinstance(logprob, (int, float)) or isinstance(logprob, bool):
                raise EndpointError(f"a logprobs entry has no logprob: {str(entry)[:80]}")
            p = math.exp(float(logprob))
            if not (always or p > floor):
                break
            kept.append(p)
        return tuple(kept)

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        content = self.checked_probabilities(exchange)
        if not content:
            return None
        top = content[0].get("top_logprobs")
        if not isinstance(top, list) or not top:
            raise EndpointError(f"{self.base}{self.path} gave no top_logprobs for top_logprobs="
                                f"{exchange.body.get('top_logprobs')}")
        listed: dict[int, float] = {}
        for item in top:
            token, logprob = item.get("id"), item.get("logprob")
            if isinstance(token, int) and not isinstance(token, bool) and isinstance(logprob, (int, float)):
                listed[token] = listed.get(token, 0.0) + math.exp(float(logprob))
        return listed

    def next_token_laws(self, prompt: Sequence[int], prefixes: list[tuple[int, ...]], sampling: Sampling,
                        n_probs: int, kind: str = POST_SAMPLING) -> list[NextTokenLaw]:
        """As ``Endpoint.next_token_laws``, from the raw top ``min(n_probs, 11)``; a prefix holding an
        end-of-text token ends the text (no request: the server would go on past it)."""
        if sampling.penalized and not self.cache_off:  # its logprobs too are after the penalties: neither kind is known
            raise NotDeterminable(PENALTIES_NOT_JUDGED)
        if sampling.penalized and self.cached:
            raise NotDeterminable(f"the prompt cache was declared off (--server-setting prompt_cache=off), but "
                                  f"{self.cached[0]}: its penalties then read only the rest of the prompt")
        if kind == POST_SAMPLING and sampling.top_k and sampling.top_p < 1 and not sampling.greedy:
            raise NotDeterminable("top-k with top-p: mlx-lm applies top-p before top-k (sample_utils.make_sampler), "
                                  "vLLM and llama.cpp after, so its law is not the one a raw top list gives by the "
                                  "common convention")
        ended = [any(t in self.eos_ids for t in prefix) for prefix in prefixes]
        bodies = []
        for prefix, end in zip(prefixes, ended):
            if end:
                continue
            ids = list(prompt) + list(prefix)
            self.prompts.require(ids)  # Inexpressible: a law expansion pools the prefix (continuation_law.expand)
            bodies.append(self.body(ids, 1, sampling, 0, top_logprobs=max(1, n_probs)))
        answers = iter(self.client.post_many(self.base, self.path, bodies))
        listed_n = min(max(1, n_probs), MAX_TOP_LOGPROBS)
        laws = []
        for end in ended:
            if end:
                laws.append(NextTokenLaw({}, 0.0))
                continue
            listed = self.listed_next_token(next(answers))
            if listed is None:
                laws.append(NextTokenLaw({}, 0.0))
                continue
            complete = self.vocab_size is not None and listed_n >= self.vocab_size
            law = NextTokenLaw.normalised(listed, listed_all=complete or sum(listed.values()) >= 1 - 1e-6)
            if kind == POST_SAMPLING:
                law = sampling_law_from_raw(law, sampling)  # NotDeterminable says why not
            laws.append(law)
        return laws


def _content(answer) -> list[dict] | None:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    logprobs = choice.get("logprobs") if choice else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return None
    return content
