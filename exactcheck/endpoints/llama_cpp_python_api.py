"""llama-cpp-python's OpenAI server (``python -m llama_cpp.server``, 0.3.36) as a serve-audit
``Endpoint``: ``POST /v1/completions`` with text prompts. Each fact read in its source
(``llama_cpp/server/app.py``, ``server/types.py``, ``llama.py``; docs/serving.md,
"llama-cpp-python's server"):

- **prompts are text only**: ``CreateCompletionRequest.prompt`` is ``Union[str, List[str]]``, and
  ``create_completion`` takes the first string; ``Llama._create_completion`` tokenizes it
  (``tokenize(prompt.encode("utf-8"), add_bos=False, special=True)``, then the BOS where the model
  adds one). As for mlx-lm (``exactcheck.endpoints.text_prompts``), each prompt and each prefix of a
  law is written as the text the model directory's tokenizer (``--model DIR``: the Hugging Face
  directory the GGUF was made from) decodes it to, where that text reads back as the same ids, and
  checked against the server at the start: its ``/extras/tokenize`` must give the same ids, and its
  logprob strings over the whole vocabulary the same texts;
- **no token ids back**: only ``logprobs`` (``Llama._create_completion``): ``tokens`` holds each
  generated token's text (``detokenize([token])`` decoded as UTF-8, undecodable bytes dropped) and
  ``top_logprobs`` a dict from that text to a log-probability over the ``logprobs`` most probable
  ids. Ids are read back through the directory's tokenizer (``TextPrompts.ids_of_string``): a text
  of one id is that id; a text several ids share (every lone byte of a multi-byte character and every
  special token render as ``""``) is one merged cell, stated as such, never guessed; so every
  request asks ``logprobs`` (0 where only the ids are read);
- **probabilities**: raw (``Llama.logits_to_logprobs(self._scores)``: the model's softmax, before
  the sampler), any number of them (``logprobs`` has no upper bound). In the dict, ids sharing a
  text overwrite each other (the comprehension keeps the last, least probable one, then the
  generated token's is written over it), so only texts of one id give an id's probability; the mass
  of the shared texts stays in the unlisted cell (``NextTokenLaw.unlisted_at_most``: such a token
  may outweigh a listed one, so truncation and greedy margins there are not judged). A probed
  token's reported probability is compared up to the first one whose text is shared;
- **sampling**: llama.cpp's sampler chain built per request (``Llama._init_sampler``): penalties,
  top-k, typical-p, top-p, min-p, temperature, then the draw seeded by the request's ``seed``; the
  server's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, ``repeat_penalty`` 1.1) are
  never left to act: every request states them all. Penalties are fed only what the chain sampled
  (the output, last ``last_n_tokens_size`` = 64): presence and frequency are applied by the audit to
  the raw law over the continuation (``sampler_law.with_output_penalties``); the repetition penalty is
  sign-dependent and not judged; no per-request window (``repeat_last_n`` refused);
- **end of text**: no ``ignore_eos``; an end-of-generation token ends the answer and is not returned
  (``finish_reason: "stop"``): the answer is its tokens, then a token whose text is ``""`` (the end
  token renders as nothing, so it is in that text's cell). An answer whose text ends inside a
  multi-byte character runs past ``max_tokens`` (``_create_completion``'s ``multibyte_fix`` ``continue``
  skips the length check): its first ``max_tokens`` tokens are read, the law being of those;
- **speculation**: ``--draft_model`` makes ``LlamaPromptLookupDecoding`` (prompt lookup,
  ``llama_speculative.py``), verified by sample-and-match (``Llama.generate``: the chain samples every
  drafted position, the draft kept while equal); no counters (``speculation_ran`` not judged), no
  settings endpoint, ``n`` dropped (``create_completion`` excludes it: ``independent_samples`` not
  judged), no per-request prompt-cache switch.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import POST_SAMPLING, RAW, Completion, Endpoint, Sampling
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw, with_output_penalties
from exactcheck.endpoints.text_prompts import Inexpressible, TextPrompts

__all__ = ["LlamaCppPythonEndpoint", "detect", "GIVES", "TITLE"]

TITLE = "llama.cpp Python API"  # FastAPI's title (app.py create_app), served in /openapi.json
PENALTY_FIELDS = {"repetition_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
                  "frequency_penalty": "frequency_penalty"}
GIVES = dict(prompts="text (ids written through the model directory's tokenizer, checked to round-trip)",
             ids="logprobs.tokens (texts) read as ids through the model directory's tokenizer; a text several "
                 "ids share: one merged cell",
             probabilities="raw, any number, keyed by text (logprobs=N)", counters="none (speculation_ran not judged)",
             settings="none (declared_settings not judged)", cache_switch="none")


def detect(client: Client, base: str) -> bool:
    """Whether ``base`` is llama-cpp-python's server: its ``/openapi.json`` (FastAPI) is titled
    "🦙 llama.cpp Python API"."""
    try:
        spec = client.get(base, "/openapi.json")
    except EndpointError:
        return False
    info = spec.get("info") if isinstance(spec, dict) else None
    return isinstance(info, dict) and TITLE in str(info.get("title", ""))


class LlamaCppPythonEndpoint(Endpoint):
    api = "llama-cpp-python /v1/completions"
    takes_ignore_eos = False  # no ignore_eos field: answers end where the model ends them
    kind = RAW
    cache_switch = False
    path = "/v1/completions"
    gives = GIVES

    def __init__(self, base: str, client: Client, *, model: str | None = None, reference_kind: str | None = None):
        if reference_kind not in (None, RAW):
            raise EndpointError("llama-cpp-python's server reports raw probabilities (llama.py: logits_to_logprobs of "
                                "the logits, before the sampler); --reference-probabilities post-sampling does not "
                                "apply to it")
        super().__init__(base, client, model=model)
        self.directory: Path | None = None
        self.prompts: TextPrompts | None = None
        self.specials = 0  # tokens the server adds to a prompt (its BOS)
        self.version = "?"
        self._shared: dict[str, int] = {}  # a text several ids share -> its marker (a negative id)

    def describe(self) -> str:
        shared = self.prompts.shared_strings() if self.prompts is not None else 0
        return (f"{self.base} ({self.api} {self.version}, prompts as text through the tokenizer of {self.directory}, "
                f"token ids read from logprob texts ({shared} ids share their text with another: merged cells), raw "
                f"probabilities, no speculation counters)")

    def several(self, body: dict, k: int) -> dict:
        raise NotDeterminable("llama-cpp-python's server drops n (app.py create_completion: exclude={'n', ...}): "
                              "one sample per request")

    # --- the server and its tokenizer

    def check(self) -> dict:
        spec = self.client.get(self.base, "/openapi.json")
        info = spec.get("info", {}) if isinstance(spec, dict) else {}
        if TITLE not in str(info.get("title", "")):
            raise EndpointError(f"{self.base}/openapi.json is not llama-cpp-python's ({str(info)[:80]})")
        self.version = str(info.get("version", "?"))
        if self.model is None:
            raise EndpointError(f"{self.base} takes text prompts and answers token texts, not ids: name the Hugging "
                                f"Face model directory of the model it serves, whose tokenizer writes and reads "
                                f"them, with --model DIR")
        path = Path(self.model).expanduser()
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raise EndpointError(f"--model {self.model}: not a local model directory with a tokenizer (tokenizer.json)")
        self.directory = path.resolve()
        self.prompts = TextPrompts(self.directory)
        self.vocab_size = self.prompts.vocab_size
        probe_text = "Once upon a time"
        ids = self.prompts.encode(probe_text)
        served = self.client.post(self.base, "/extras/tokenize", {"input": probe_text}).answer
        tokens = served.get("tokens") if isinstance(served, dict) else None
        if not isinstance(tokens, list) or tokens[len(tokens) - len(ids):] != ids or len(tokens) - len(ids) > 2:
            raise EndpointError(f"{self.base} tokenizes {probe_text!r} as {str(tokens)[:60]}, the tokenizer of "
                                f"{self.directory} as {ids}: --model DIR must be the served model's directory")
        self.specials = len(tokens) - len(ids)
        answer = self.client.post(self.base, self.path, self.body(ids, 1, Sampling(), 0, n_probs=self.vocab_size,
                                                                  tag="check")).answer
        top = _choice(answer).get("logprobs", {}) or {}
        listed = (top.get("top_logprobs") or [None])[0]
        expected = {self.prompts.string(t) for t in range(self.vocab_size)}
        if not isinstance(listed, dict) or set(listed) != expected:
            raise EndpointError(f"{self.base}'s logprob texts over the whole vocabulary are not the token texts of "
                                f"{self.directory} ({len(listed or {})} texts, {len(expected)} expected): --model DIR "
                                f"must be the served model's directory")
        return {"model_directory": str(self.directory), "specials": self.specials,
                "ids_sharing_a_text": self.prompts.shared_strings()}

    def tokenize(self, text: str) -> list[int]:
        ids = self.prompts.encode(text)
        if self.prompts.text(ids) is None:
            raise EndpointError(f"the text {text[:40]!r} tokenizes to {ids[:8]} whose text does not read back as the "
                                f"same ids: give another prompt")
        return list(ids)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if self.prompts.text(prompt) is None:
            raise EndpointError(f"the prompt {list(prompt)[:12]} has no text that {self.directory}'s tokenizer reads "
                                f"back as the same ids, and llama-cpp-python's server takes text prompts only: give "
                                f"another prompt (--prompt TEXT is always one)")

    # --- requests and answers

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:
        text = self.prompts.require(prompt)  # Inexpressible: the caller pools or stops (never a usage error)
        if sampling.repeat_last_n is not None and sampling.penalized:
            raise EndpointError(f"sampling {sampling.spec()!r}: llama-cpp-python has no per-request penalty window "
                                f"(its server's last_n_tokens_size)")
        # every field the server would otherwise default (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05,
        # repeat_penalty 1.1) is stated; logprobs always: the only way ids come back
        body = {"prompt": text, "max_tokens": n_predict, "stream": False, "seed": int(seed), **sampling.fields(),
                "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                **sampling.penalty_fields(PENALTY_FIELDS), "logprobs": int(n_probs),
                "exactcheck_prompt_length": len(prompt)}
        if n_probs:
            body["exactcheck_probed"] = True
        if tag is not None:
            body["exactcheck_tag"] = tag
        return body

    def _id(self, text: str) -> int:
        """The id of a token text, or the merged cell's marker (a negative id) where several ids share it."""
        ids = self.prompts.ids_of_string(text)
        if len(ids) == 1:
            return next(iter(ids))
        if not ids:
            raise EndpointError(f"{self.base} answered a token text {text!r} no token of {self.directory} has")
        return self._shared.setdefault(text, -1 - len(self._shared))

    def read(self, exchange: Exchange) -> Completion:
        answer = exchange.answer
        choice = _choice(answer)
        logprobs = choice.get("logprobs")
        texts = logprobs.get("tokens") if isinstance(logprobs, dict) else None
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise EndpointError(f"{self.base}{self.path} answered no logprobs.tokens ({str(answer)[:80]})")
        expected = exchange.body.get("exactcheck_prompt_length")
        usage = answer.get("usage") or {}
        if expected is not None and usage.get("prompt_tokens") != expected + self.specials:
            raise EndpointError(f"{self.base} read a prompt of {expected} token ids as {usage.get('prompt_tokens')} "
                                f"tokens (expected {expected + self.specials}): its tokenizer is not {self.directory}'s")
        tokens = [self._id(t) for t in texts]
        n = exchange.body.get("max_tokens")
        # an answer runs past max_tokens while its text ends inside a multi-byte character (llama.py: the
        # multibyte_fix `continue` skips the max_tokens check): its first max_tokens tokens are the ones judged
        stopped = choice.get("finish_reason") == "stop" and len(tokens) < n
        tokens = tokens[:n]
        if stopped:
            tokens.append(self._id(""))  # the end-of-generation token renders as nothing: that text's cell
        elif len(tokens) != n:
            raise EndpointError(f"{self.base} answered {len(tokens)} tokens for max_tokens {n} without stopping")
        probabilities = None
        if exchange.body.get("exactcheck_probed"):
            reported = logprobs.get("token_logprobs") or []
            first = next((t for t, token in enumerate(tokens) if token < 0), len(tokens))
            depth = self.prompts.expressible_depth(self.prompts.encode(exchange.body["prompt"]), tokens[:first])
            kept = []
            for t, token in enumerate(tokens[:len(texts)]):
                if token < 0 or t > depth or not isinstance(reported[t], (int, float)):
                    break  # a merged cell's token, or after a context the reference cannot be sent
                kept.append(math.exp(float(reported[t])))
            probabilities = tuple(kept)
        return Completion(tuple(tokens), probabilities, None, None, stopped, RAW, text=choice.get("text"))

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        known, _ = self._listed(exchange)
        return known

    def _listed(self, exchange: Exchange) -> tuple[dict[int, float], bool]:
        """(the ids of one text each with their probabilities, whether a text several ids share was listed)."""
        logprobs = _choice(exchange.answer).get("logprobs")
        tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(tops, list) or not tops or not isinstance(tops[0], dict):
            raise EndpointError(f"{self.base}{self.path} gave no top_logprobs for logprobs={exchange.body.get('logprobs')}")
        known, shared = {}, False
        for text, logprob in tops[0].items():
            ids = self.prompts.ids_of_string(text)
            if len(ids) == 1 and isinstance(logprob, (int, float)) and not isinstance(logprob, bool):
                known[next(iter(ids))] = math.exp(float(logprob))
            else:
                shared = True
        return known, shared

    def next_token_laws(self, prompt: Sequence[int], prefixes: list[tuple[int, ...]], sampling: Sampling,
                        n_probs: int, kind: str = POST_SAMPLING) -> list[NextTokenLaw]:
        """As ``Endpoint.next_token_laws``, from the raw list keyed by text: the ids of one text each,
        the rest (shared texts, unlisted ids) one cell; a prefix holding a merged cell or with no
        text that reads back as it is ``Inexpressible`` (``continuation_law.expand`` pools it)."""
        if kind not in (POST_SAMPLING, RAW):
            raise NotDeterminable(f"{self.api} reports no probabilities of the kind {kind!r}")
        if kind == POST_SAMPLING and sampling.repetition_penalty != 1.0:
            raise NotDeterminable(f"repetition penalty {sampling.repetition_penalty:g}: llama.cpp's divides a positive "
                                  f"logit and multiplies a negative one, and raw log-probabilities do not keep the sign")
        asked = Sampling(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                         min_p=sampling.min_p)  # the one-token request's output is empty: no penalty reads it
        n = max(int(n_probs), 1)
        bodies = []
        for prefix in prefixes:
            if any(t < 0 for t in prefix):  # a merged cell's token: which id it was is not known
                raise Inexpressible(list(prompt) + list(prefix), self.directory)
            bodies.append(self.body(list(prompt) + list(prefix), 1, asked, 0, n_probs=n))
        laws = []
        for prefix, exchange in zip(prefixes, self.client.post_many(self.base, self.path, bodies)):
            known, shared = self._listed(exchange)
            complete = self.vocab_size is not None and n >= self.vocab_size
            if not known:
                raise NotDeterminable(f"after {list(prefix)} every listed token's text is shared by several ids")
            law = NextTokenLaw.normalised(known, listed_all=complete and not shared)
            if shared:  # a merged text's ids may outweigh a listed one: not a top-N list
                law = NextTokenLaw(law.probabilities, law.other, unlisted_at_most=law.other)
            if kind == POST_SAMPLING:
                law = with_output_penalties(law, sampling, tuple(prefix))  # presence, frequency over the output
                law = sampling_law_from_raw(law, sampling)  # NotDeterminable says why not
            laws.append(law)
        return laws


def _choice(answer) -> dict:
    choices = answer.get("choices") if isinstance(answer, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if choice is None:
        raise EndpointError(f"an answer with no choices: {json.dumps(answer)[:80]}")
    return choice
