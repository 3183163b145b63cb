"""SGLang's native API (``POST /generate``) as a serve-audit ``Endpoint``. What it gives and what it
lacks, each read in SGLang's source (docs/serving.md, "SGLang's native /generate"):

- **prompts as token ids** (``input_ids``) and **ids back** (``output_ids``; where a version does not
  return them, the ids of ``meta_info.output_token_logprobs``, every request then asking
  ``return_logprob``);
- **sampling**: ``sampling_params`` {``temperature``, ``top_p``, ``top_k`` (-1: off), ``min_p``,
  ``max_new_tokens``, ``ignore_eos``, ``sampling_seed``, the three penalties} (sampling_params.py
  ``SamplingParams``); temperature 0 is served as temperature 1 with top-k 1 (``__post_init__``).
  SGLang divides the logits by the temperature *before* it truncates (sampler.py: ``logits.div_``,
  softmax, then ``_sample_from_probs`` with top-k / top-p / min-p), as vLLM does, and cuts top-k and
  top-p on the same probabilities (flashinfer ``filter_apply_order="joint"``; the torch fallback masks
  both on one sorted list), so top-k with top-p is not judged;
- **probabilities**: ``return_logprob`` with ``top_logprobs_num`` gives ``[logprob, token_id, text]``
  lists (tokenizer_manager.py ``detokenize_logprob_tokens``). They are ``log(softmax(logits / T))``:
  after the temperature and the penalties, before top-k / top-p / min-p (sampler.py standard path:
  ``logprobs = torch.log(probs)`` of the tempered softmax); raw where the temperature is 1 or the
  request greedy (``log_softmax(logits)``), and raw at every temperature on a server started with
  ``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` (``original_logprobs``, before the temperature). An
  environment variable is in no server argument, so ``check`` asks one prompt's top list at
  temperatures 1 and 0.5: the same lists mean the server reports original (raw) log-probabilities.
  The reference asks its one-token requests at temperature 1 without truncation (the raw law), or at
  the audited temperature for the probabilities a tempered answer reported (``tempered_kind``);
- **speculation counters per request**: ``meta_info.spec_draft_token_num`` (verify steps times
  ``speculative_num_draft_tokens - 1``) and ``spec_accept_token_num``, written only on a request
  whose ``spec_verify_ct`` is positive (tokenizer_manager.py), so an answer without them drafted
  nothing; ``spec_verify_ct`` alone (older versions) counts as one draft per verify step;
- **settings**: ``/get_server_info`` (the server arguments: ``speculative_*``), the same reading as
  the OpenAI dialect's (``server/declared_settings``);
- **no per-request prompt-cache switch** (the radix cache is server-wide: ``--disable-radix-cache``),
  **no chat audit** through this dialect (its chat endpoint is OpenAI's), **penalties not judged**
  (how its penalisers read prompt and output is not read here).
"""
from __future__ import annotations

import json

import math
from typing import Sequence

from exactcheck.endpoints.client import Client, EndpointError, Exchange
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import POST_SAMPLING, RAW, Completion, Endpoint, Sampling, int_or_none
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw

__all__ = ["SGLangEndpoint", "detect", "GIVES", "PENALTY_FIELDS", "tempered_kind"]

# our penalty names -> SGLang's sampling_params (sampling_params.py); it has no window
PENALTY_FIELDS = {k: k for k in ("repetition_penalty", "presence_penalty", "frequency_penalty")}
GIVES = dict(prompts="token ids (input_ids)", ids="output_ids (else meta_info.output_token_logprobs ids)",
             probabilities="log softmax(logits / T): tempered, before top-k/top-p/min-p (raw at T = 1 and greedy); "
                           "top_logprobs_num top lists",
             counters="per request (meta_info.spec_draft_token_num, spec_accept_token_num)",
             settings="/get_server_info (speculative_*)",
             cache_switch="none (the radix cache is server-wide)")
_TEMPERED = "tempered at T="


def tempered_kind(temperature: float) -> str:
    """The kind of the probabilities SGLang reports at ``temperature``: raw at 1 (and greedy, served at 1)."""
    return RAW if temperature <= 0 or temperature == 1 else f"{_TEMPERED}{temperature!r}"


def detect(client: Client, base: str) -> bool:
    """Whether ``base`` is SGLang's server: ``GET /get_model_info`` answers an object with
    ``model_path`` (http_server.py ``get_model_info``; the endpoint launch_server polls until ready)."""
    try:
        info = client.get(base, "/get_model_info")
    except EndpointError:
        return False
    return isinstance(info, dict) and "model_path" in info


class SGLangEndpoint(Endpoint):
    api = "SGLang /generate"
    kind = RAW
    cache_switch = False
    path = "/generate"
    chat_dialect = None
    gives = GIVES

    def __init__(self, base: str, client: Client, *, model: str | None = None, reference_kind: str | None = None):
        if reference_kind not in (None, RAW):
            raise EndpointError("SGLang reports tempered probabilities before truncation (sampler.py), never the "
                                "post-sampling law: --reference-probabilities post-sampling does not apply to it")
        super().__init__(base, client, model=model)
        self.ids_through_logprobs = False
        self.original_logprobs = False  # SGLANG_RETURN_ORIGINAL_LOGPROB: raw at every temperature

    def describe(self) -> str:
        how = "token ids from output_token_logprobs" if self.ids_through_logprobs else "token ids from output_ids"
        kind = "raw probabilities (SGLANG_RETURN_ORIGINAL_LOGPROB)" if self.original_logprobs else \
            "tempered probabilities before truncation"
        return f"{self.base} ({self.api}, model {self.model}, {how}, {kind}, speculation counters per request)"

    def check(self) -> dict:
        """The server's facts (``/get_model_info``), or an ``EndpointError`` saying it is down or not SGLang."""
        self.client.get_text(self.base, "/health")  # SGLang answers 200 with an empty body
        info = self.client.get(self.base, "/get_model_info")
        if not isinstance(info, dict) or "model_path" not in info:
            raise EndpointError(f"{self.base}/get_model_info answered {str(info)[:80]}: is it SGLang's server?")
        if info.get("is_generation") is False:
            raise EndpointError(f"{self.base} serves {info['model_path']} as an embedding model (is_generation false)")
        self.model = self.model or info["model_path"]
        probe = self.client.post(self.base, self.path, self.body([0], 1, Sampling(), 0, tag="check")).answer
        if _ids(_answer(probe).get("output_ids")) is None:
            self.ids_through_logprobs = True
            answer = self.client.post(self.base, self.path, self.body([0], 1, Sampling(), 0, tag="check")).answer
            if _logprob_ids(_answer(answer)) is None:
                raise EndpointError(f"{self.base}/generate returns no token ids (output_ids, or the ids in "
                                    f"meta_info.output_token_logprobs): is it SGLang's /generate?")
        plain, hot = (self.listed_next_token(self.client.post(self.base, self.path, self.body(
            [0], 1, Sampling(temperature=t), 0, n_probs=20, tag=f"check-logprobs-{t:g}")))
            or {} for t in (1.0, 0.5))
        self.original_logprobs = bool(plain) and max(abs(plain.get(k, 0.0) - hot.get(k, 0.0))
                                                     for k in set(plain) | set(hot)) < 1e-3
        return info

    def reported_kind(self, temperature: float) -> str:
        """The kind of the probabilities an answer at ``temperature`` reports (``tempered_kind``; raw
        at every temperature on a server reporting original log-probabilities)."""
        return RAW if self.original_logprobs else tempered_kind(temperature)

    def body(self, prompt: Sequence[int], n_predict: int, sampling: Sampling, seed: int, *, n_probs: int = 0,
             cache: bool = True, tag: str | None = None) -> dict:
        # ignore_eos: every answer has exactly n_predict tokens; sampling_seed: SamplingParams' seed field
        params = {"max_new_tokens": n_predict, "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "top_k": sampling.top_k or -1, "min_p": sampling.min_p, "ignore_eos": sampling.ignore_eos,
                  "sampling_seed": int(seed), **sampling.penalty_fields(PENALTY_FIELDS)}
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.constraint is not None:
            params.update(self.constraint_fields(sampling.constraint))
        body = {"input_ids": list(prompt), "sampling_params": params, "stream": False}
        if n_probs or self.ids_through_logprobs:
            body.update(return_logprob=True, logprob_start_len=-1, top_logprobs_num=int(n_probs))
        if tag is not None:
            body["exactcheck_tag"] = tag  # in the journal's key only: the client does not send it
        return body

    def constraint_fields(self, constraint) -> dict:
        """SGLang's ``sampling_params`` (srt/sampling/sampling_params.py): ``regex`` (a choice as the regex
        of its alternatives), ``json_schema`` (a string), ``ebnf`` (its grammar backend's EBNF)."""
        if constraint.kind == "json_schema":
            return {"json_schema": json.dumps(constraint.schema)}
        if constraint.kind == "grammar":
            return {"ebnf": constraint.value}
        return {"regex": constraint.regex()}

    def several(self, body: dict, k: int) -> dict:
        raise NotDeterminable("SGLang's answer to sampling_params n (a list) is not read yet: the audit has had no "
                              "SGLang server to check its shape against")

    def read(self, exchange: Exchange) -> Completion:
        answer = _answer(exchange.answer)
        tokens = _ids(answer.get("output_ids")) or _logprob_ids(answer)
        if tokens is None:
            raise EndpointError(f"{self.base}/generate answered no token ids: {str(answer)[:80]}")
        meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
        probabilities = None
        if exchange.body.get("top_logprobs_num"):  # asked for probabilities (not only for ids)
            entries = meta.get("output_token_logprobs")
            if not isinstance(entries, list) or len(entries) < len(tokens):
                raise EndpointError(f"{self.base}/generate gave no output_token_logprobs for return_logprob")
            probabilities = tuple(_probability(self.base, e) for e in entries[:len(tokens)])
        drafted = int_or_none(meta.get("spec_draft_token_num"))
        if drafted is None:
            drafted = int_or_none(meta.get("spec_verify_ct"))
        reason = meta.get("finish_reason")
        stopped = isinstance(reason, dict) and reason.get("type") == "stop"
        temperature = float(exchange.body.get("sampling_params", {}).get("temperature", 1.0))
        return Completion(tuple(tokens), probabilities, drafted, int_or_none(meta.get("spec_accept_token_num")),
                          stopped, self.reported_kind(temperature))

    def listed_next_token(self, exchange: Exchange) -> dict[int, float] | None:
        meta = _answer(exchange.answer).get("meta_info") or {}
        top = meta.get("output_top_logprobs")
        if not isinstance(top, list):
            raise EndpointError(f"{self.base}/generate gave no output_top_logprobs for top_logprobs_num="
                                f"{exchange.body.get('top_logprobs_num')}")
        if not top or not top[0]:
            return None  # nothing generated: the prompt already ends the text
        listed: dict[int, float] = {}
        for entry in top[0]:
            if not isinstance(entry, list) or len(entry) < 2 or isinstance(entry[1], bool) \
                    or not isinstance(entry[1], int):
                raise EndpointError(f"{self.base}: an output_top_logprobs entry is not [logprob, token_id, text]: "
                                    f"{str(entry)[:60]}")
            listed[entry[1]] = listed.get(entry[1], 0.0) + _probability(self.base, entry)
        return listed

    def next_token_laws(self, prompt: Sequence[int], prefixes: list[tuple[int, ...]], sampling: Sampling,
                        n_probs: int, kind: str = POST_SAMPLING) -> list[NextTokenLaw]:
        """Raw: asked at temperature 1 without truncation. Tempered (what a request at temperature T
        reported): asked at T without truncation (SGLang reports before truncating). Post-sampling:
        the raw law through ``sampling_law_from_raw`` at temperature 1 or greedy; at another
        temperature, the tempered law truncated (SGLang truncates after the temperature)."""
        if kind == POST_SAMPLING and sampling.penalized:
            raise NotDeterminable(f"{self.api}: how its penalisers read prompt and output is not known to the audit")
        if kind == POST_SAMPLING and sampling.top_k and sampling.top_p < 1:
            raise NotDeterminable("top-k with top-p: SGLang cuts both on the same probabilities (flashinfer "
                                  "filter_apply_order joint), which the derivation from a top list does not follow")
        if kind == RAW or (kind == POST_SAMPLING and tempered_kind(sampling.temperature) == RAW):
            temperature = 1.0
        elif kind == POST_SAMPLING:
            temperature = sampling.temperature
        elif kind.startswith(_TEMPERED):
            temperature = float(kind[len(_TEMPERED):])
        else:
            raise NotDeterminable(f"{self.api} reports no probabilities of the kind {kind!r}")
        asked = Sampling(temperature=temperature)
        bodies = [self.body(list(prompt) + list(prefix), 1, asked, seed=0, n_probs=n_probs) for prefix in prefixes]
        laws = []
        for exchange in self.client.post_many(self.base, self.path, bodies):
            listed = self.listed_next_token(exchange)
            if listed is None:
                laws.append(NextTokenLaw({}, 0.0))
                continue
            law = NextTokenLaw.normalised(listed, listed_all=sum(listed.values()) >= 1 - 1e-6)
            if kind == POST_SAMPLING:
                truncation = sampling if temperature == 1.0 else Sampling(
                    temperature=1.0, top_k=sampling.top_k, top_p=sampling.top_p, min_p=sampling.min_p)
                law = sampling_law_from_raw(law, truncation)  # NotDeterminable says why not
            laws.append(law)
        return laws

    def speculation_settings(self) -> dict[str, object]:
        """``/get_server_info``'s ``speculative_*`` server arguments (as the OpenAI dialect reads SGLang's)."""
        try:
            info = self.client.get(self.base, "/get_server_info")
        except EndpointError:
            return {}
        return {k: v for k, v in info.items() if k.startswith("speculative_")} if isinstance(info, dict) else {}


def _answer(answer) -> dict:
    """One request's answer (``/generate`` answers a list for a batch; the audit sends one prompt)."""
    if isinstance(answer, list) and answer and isinstance(answer[0], dict):
        return answer[0]
    return answer if isinstance(answer, dict) else {}


def _ids(values) -> list[int] | None:
    if isinstance(values, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in values):
        return list(values)
    return None


def _logprob_ids(answer: dict) -> list[int] | None:
    entries = (answer.get("meta_info") or {}).get("output_token_logprobs")
    if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) >= 2 for e in entries):
        return None
    return _ids([e[1] for e in entries])


def _probability(base: str, entry) -> float:
    value = entry[0] if isinstance(entry, list) and entry else None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise EndpointError(f"{base}: a logprob entry is not [logprob, token_id, text]: {str(entry)[:60]}")
    return math.exp(float(value)) if value > -1e8 else 0.0  # SGLang writes -inf as -999999999.0
