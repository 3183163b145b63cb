"""Answers that finish: where an answer may end on an end-of-generation token (a world whose sampling
has ``ignore_eos=0``), inside a speculation step or not, and what every answer says of its end.

The law of such answers is the chain rule cut where the answer ends: a prefix whose last token ends
generation is a whole output of its own, and nothing follows it (``continuation_law.expand`` with
``ends``), so an answer that runs on past an end-of-generation token falls on an outcome of
probability 0 (a verify step's tokens kept past an end accepted mid-block: transformers #47912,
#48981; SGLang #39826). vLLM's ``min_tokens`` masks the end for an answer's first tokens: its law
takes the end's mass out of the raw probabilities there before the sampler chain
(``reference_next_token``).

The ``finish`` check of every world (deterministic, spends no alpha) reads what each answer says of
its end beside its tokens: an end-of-generation token only as its last; the end the server names
(llama.cpp's ``stop_type`` "eos", OpenAI's ``finish_reason`` "stop") exactly where the answer ends on
one before the cap (the max-tokens cap must not hide an earlier stop: SGLang #31599, #33758; an end
sampled as the cap's own last token may be named either way: SGLang checks the cap first, vLLM and
llama.cpp the end, and both are exact); the completion tokens
its usage counts, the tokens it has (not the tokens drafted: SGLang #39826); its logprobs, where
asked, no more than its tokens (none kept past the end: vLLM #47616).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import RAW, Completion, Endpoint, Sampling
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.serve.check_kinds import ANSWER_END

__all__ = ["parse_ids", "reference_next_token", "as_ended", "finish_verdict"]


def parse_ids(value) -> frozenset[int]:
    """``--eos-ids 2,7`` (or a list of ids) as a set of ids."""
    if isinstance(value, str):
        return frozenset(int(part) for part in value.split(",") if part.strip())
    return frozenset(int(v) for v in value)


def reference_next_token(reference: Endpoint, prompt: Sequence[int], prefix: tuple[int, ...], sampling: Sampling,
                         n_probs: int, eog: frozenset[int]) -> NextTokenLaw:
    """The law of the token after ``prefix`` of an answer under ``sampling``: the reference's one-token
    request, without ``min_tokens`` (its answer has one token); where ``min_tokens`` masks the end at
    this position, the end's mass taken out of the reference's raw probabilities before the sampler
    chain (vLLM's min-tokens processor acts on the logits, ahead of temperature and truncation)."""
    asked = replace(sampling, min_tokens=0)
    if not (sampling.min_tokens and len(prefix) < sampling.min_tokens):
        return reference.next_token_laws(list(prompt), [prefix], asked, n_probs)[0]
    if sampling.penalized:
        raise NotDeterminable("min_tokens with penalties is not judged (the penalised raw law is not read)")
    raw = reference.next_token_laws(list(prompt), [prefix], asked, n_probs, kind=RAW)[0]
    if raw.other > 0 and not eog & set(raw.probabilities):
        raise NotDeterminable("the end-of-generation token is not among the reference's listed probabilities: its "
                              "mass cannot be taken out for min_tokens")
    kept = {t: p for t, p in raw.probabilities.items() if t not in eog}
    total = sum(kept.values()) + raw.other
    return sampling_law_from_raw(NextTokenLaw({t: p / total for t, p in kept.items()}, raw.other / total), asked)


def as_ended(completion: Completion, eog: frozenset[int]) -> Completion | None:
    """The answer as the law reads it: an answer the server says ended on an end-of-generation token
    that its ids do not carry (a dialect that drops it) with the one id added; None where it names
    an end on a token the audit does not know as one (not judged, never a finding)."""
    if not completion.stopped_on_eog or (completion.tokens and completion.tokens[-1] in eog):
        return completion
    if len(eog) == 1 and not (completion.tokens and completion.tokens[-1] in eog):
        return replace(completion, tokens=completion.tokens + tuple(eog))
    return None


def finish_verdict(answers: Sequence[Completion], length: int, sampling: Sampling, eog: frozenset[int] | None,
                   base: dict, condition: str, masks: bool = True) -> Verdict:
    """Every answer's end against its tokens (see the module docstring). ``masks``: the dialect sends
    ``ignore_eos`` (an answer of a world that keeps it cannot end on an end of generation)."""
    check = dict(check=f"{base['world']}/finish", law="finish", condition=f"the end each answer says it has: "
                 f"{condition}", kind=ANSWER_END, samples=len(answers), **base)
    found: dict[str, list[str]] = {}
    stops = bool(sampling.stop)  # OpenAI's finish_reason "stop" names a stop string's end too: not read there
    for i, answer in enumerate(answers):
        tokens = answer.tokens
        if sampling.finishes and eog is not None:
            early = [j for j, t in enumerate(tokens[:-1]) if t in eog]
            if early:
                found.setdefault("past", []).append(f"answer {i}: {list(tokens)[:12]}, an end of generation at "
                                                    f"position {early[0]} and {len(tokens) - 1 - early[0]} tokens after it")
            ends_on_eog = bool(tokens) and tokens[-1] in eog
            if not stops and ends_on_eog and not answer.stopped_on_eog and len(tokens) < length:
                found.setdefault("hidden", []).append(f"answer {i}: {list(tokens)[:12]} ends on an end-of-generation "
                                                      f"token and the server names the length cap as its end")
            if not stops and answer.stopped_on_eog and not ends_on_eog and len(tokens) >= length:
                found.setdefault("named", []).append(f"answer {i}: {list(tokens)[:12]} ends at the length cap and "
                                                     f"the server names an end of generation")
        elif masks and not sampling.finishes and not stops and answer.stopped_on_eog:
            found.setdefault("named", []).append(f"answer {i}: the server names an end of generation for an answer "
                                                 f"whose end-of-generation tokens are masked (ignore_eos)")
        if not stops and answer.probabilities is not None and len(answer.probabilities) > len(tokens):
            # more logprobs than tokens: kept past the end (fewer: a dialect that reads only a prefix's,
            # mlx-lm's and llama-cpp-python's, is no finding); a stop string's answer is not read: llama.cpp
            # cuts its logprobs by the stop string's own token count (server-context.cpp
            # send_final_response), which need not be the tokens cut
            found.setdefault("logprobs", []).append(f"answer {i}: {len(answer.probabilities)} logprobs for "
                                                    f"{len(tokens)} tokens")
        if answer.usage_tokens is not None and answer.usage_tokens != len(tokens):
            found.setdefault("usage", []).append(f"answer {i}: the usage counts {answer.usage_tokens} completion "
                                                 f"tokens for an answer of {len(tokens)}")
    words = {"past": "answers run on past an end-of-generation token (a step's tokens kept past an end accepted "
                     "mid-block)",
             "hidden": "answers end on an end-of-generation token that the server reports as the length cap (the "
                       "cap hides the earlier stop)",
             "named": "answers the server says ended on an end of generation that do not",
             "logprobs": "answers with more logprobs than tokens (kept past the end)",
             "usage": "answers whose usage does not count their tokens (drafted tokens counted?)"}
    if found:
        return Verdict(outcome=Outcome.DEFECT, summary="; ".join(
            f"{len(examples):,} {words[key]} (e.g. {examples[0]})" for key, examples in found.items()),
            evidence=FindingEvidence(pvalue=0.0), **check)
    ended = sum(1 for a in answers if a.tokens and eog is not None and a.tokens[-1] in eog)
    usage = sum(1 for a in answers if a.usage_tokens is not None)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        f"{len(answers):,} answers: " + (f"{ended:,} ended on an end-of-generation token, each said so; "
                                         if sampling.finishes and eog is not None else "")
        + (f"{usage:,} usages each count the answer's tokens" if usage else "no usage reported")), **check)
