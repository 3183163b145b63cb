"""transformers' own ``generate`` loop as end-to-end generators (``exactcheck.contracts.generator``).

- ``AssistedGeneration``: ``target.generate(assistant_model=draft)``, greedy or sampling. The
  drafting settings are set where transformers reads them, on ``draft.generation_config``
  (``num_assistant_tokens`` = ``draft_length``, a constant schedule, confidence threshold 0 so
  every step drafts ``draft_length`` tokens), and restored afterwards. ``ensemble_weight`` sets
  ``assistant_ensemble_weight``; a weight in (0, 1) targets a mixture of p and q on purpose, so
  the generator declares itself lossy.
- ``AssistedDifferentTokenizers``: the same with a draft of another vocabulary
  (``tokenizer=``, ``assistant_tokenizer=``): universal speculative decoding when sampling,
  re-tokenised text when greedy (``exactcheck.contracts.generator``: two vocabularies).
- ``PromptLookup``: ``generate(prompt_lookup_num_tokens=draft_length)``; the draft model is
  not used (candidates come from n-grams of the prompt).
- ``TargetGenerate``: plain ``target.generate`` without a draft, the baseline.

The decoding policy (``exactcheck.contracts.policy``) becomes transformers' own settings: temperature,
``top_k`` (0 when unset), ``top_p`` (1.0 when unset), ``min_p``, ``sequence_bias`` for the
logit bias, ``bad_words_ids`` for banned tokens, ``eos_token_id`` for stop tokens, and a
``LogitsProcessor`` (``PolicyMask``) for a state-dependent mask. ``top_k`` and ``top_p`` are
passed explicitly because transformers fills an unset ``top_k`` with its global default 50, which
is not the policy "softmax(logits / T)". Every call passes an
all-ones attention mask (transformers otherwise infers one from ``pad_token_id``, which in a toy
vocabulary is a real token) and draws its randomness from the global torch generator, seeded
with the call's seed inside ``torch.random.fork_rng`` so the caller's global state is untouched.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from exactcheck.contracts.transformers_compat import output_cache, prompt_lookup_kwargs, require_ensemble_weight
from exactcheck.contracts.generator import Capabilities, DecodingPolicy, Generation

__all__ = ["AssistedGeneration", "AssistedDifferentTokenizers", "PromptLookup", "TargetGenerate", "PolicyMask", "policy_kwargs"]


class PolicyMask:
    """A transformers logits processor applying a policy's state-dependent mask (and nothing
    else): tokens the mask forbids after the generated prefix get -inf."""

    def __init__(self, policy: DecodingPolicy, prompt_length: int):
        self.policy, self.prompt_length = policy, prompt_length

    def __call__(self, input_ids, scores):
        out = scores.clone()
        for row in range(input_ids.shape[0]):
            prefix = tuple(input_ids[row, self.prompt_length:].tolist())
            ids = self.policy.mask(prefix)
            if isinstance(ids, torch.Tensor) and ids.dtype == torch.bool:
                forbidden = ~ids.to(scores.device)
            else:
                forbidden = torch.ones(scores.shape[-1], dtype=torch.bool, device=scores.device)
                forbidden[list(ids)] = False
            out[row] = out[row].masked_fill(forbidden, -float("inf"))
        return out


def policy_kwargs(policy: DecodingPolicy, prompt_length: int) -> dict:
    """``generate`` keyword arguments that realise ``policy`` with transformers' own processors."""
    from transformers import LogitsProcessorList
    if policy.greedy:
        kwargs = dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs = dict(do_sample=True, temperature=policy.temperature, top_k=policy.top_k or 0,
                      top_p=1.0 if policy.top_p is None else policy.top_p)
        if policy.min_p is not None:
            kwargs["min_p"] = policy.min_p
    if policy.penalized:  # transformers' RepetitionPenaltyLogitsProcessor reads every input id: prompt and output
        kwargs["repetition_penalty"] = policy.repetition_penalty
    if policy.logit_bias:
        kwargs["sequence_bias"] = {(token,): bias for token, bias in policy.logit_bias}
    if policy.banned_tokens:
        kwargs["bad_words_ids"] = [[token] for token in policy.banned_tokens]
    if policy.stop_tokens:
        kwargs["eos_token_id"] = list(policy.stop_tokens)
        kwargs["pad_token_id"] = policy.stop_tokens[0]
    if policy.mask is not None:
        kwargs["logits_processor"] = LogitsProcessorList([PolicyMask(policy, prompt_length)])
    return kwargs


def _generate(model, input_ids, policy, max_new_tokens, seed, **kwargs) -> Generation:
    devices = [model.device] if model.device.type == "cuda" else []
    # with a stop token, stopping early is the law: no minimum is passed at all (min_new_tokens=0 would
    # still make transformers 4.57 build a MinLengthLogitsProcessor, which its assisted paths refuse)
    minimum = {} if policy.stop_tokens else dict(min_new_tokens=max_new_tokens)
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids.to(model.device), attention_mask=torch.ones_like(input_ids, device=model.device),
                             max_new_tokens=max_new_tokens, **minimum,
                             return_dict_in_generate=True, **policy_kwargs(policy, input_ids.shape[-1]), **kwargs)
    return Generation(out.sequences, target_cache=output_cache(out))


@dataclass(frozen=True)
class AssistedGeneration:
    """transformers assisted generation (speculative sampling when sampling)."""

    draft_length: int = 4
    ensemble_weight: float | None = None

    @property
    def name(self) -> str:
        weight = "" if self.ensemble_weight is None else f", assistant_ensemble_weight={self.ensemble_weight:g}"
        return f"transformers.generate(assistant_model=draft, num_assistant_tokens={self.draft_length}{weight})"

    @property
    def lossy(self) -> bool:
        return self.ensemble_weight is not None and 0 < self.ensemble_weight < 1

    # transformers' own penalty convention (the repetition penalty over prompt and output), nothing else
    capabilities = Capabilities(penalty_conventions=("transformers",))

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        with _drafting(draft, self.draft_length):
            extra = {}
            if self.ensemble_weight is not None:
                require_ensemble_weight()
                extra = dict(assistant_ensemble_weight=self.ensemble_weight)
            return _generate(target, input_ids, policy, max_new_tokens, seed, assistant_model=draft, **extra)


@contextlib.contextmanager
def _drafting(draft, draft_length: int):
    """``draft.generation_config`` set to draft ``draft_length`` tokens every step (a constant
    schedule, confidence threshold 0), restored afterwards."""
    config = draft.generation_config
    settings = dict(num_assistant_tokens=draft_length, num_assistant_tokens_schedule="constant",
                    assistant_confidence_threshold=0.0)
    saved = {key: getattr(config, key, None) for key in settings}
    for key, value in settings.items():
        setattr(config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(config, key, value)


@dataclass(frozen=True)
class AssistedDifferentTokenizers:
    """transformers assisted generation with a draft of another vocabulary:
    ``target.generate(assistant_model=draft, tokenizer=target_tokenizer,
    assistant_tokenizer=draft_tokenizer)``. Sampling goes through
    ``UniversalSpeculativeDecodingGenerator`` (token-level intersection: the assistant samples over
    the tokens both vocabularies spell alike, its LM head pruned to them in place, its logits mapped
    into the target's vocabulary by the ``AssistantToTargetTranslator`` that
    ``AssistantVocabTranslatorCache`` keeps per tokenizer pair); greedy through
    ``AssistedCandidateGeneratorDifferentTokenizers`` (the candidates' text re-tokenised).
    ``greedy_only``: the greedy path alone (the sampled laws are not applicable)."""

    draft_length: int = 4
    greedy_only: bool = False
    different_tokenizers = True

    @property
    def name(self) -> str:
        path = ("AssistedCandidateGeneratorDifferentTokenizers, greedy" if self.greedy_only
                else "UniversalSpeculativeDecodingGenerator when sampling")
        return (f"transformers.generate(assistant_model=draft, tokenizer=, assistant_tokenizer=, "
                f"num_assistant_tokens={self.draft_length}) [{path}]")

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(greedy_only=self.greedy_only)

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed, *, target_tokenizer,
                 draft_tokenizer):
        with _drafting(draft, self.draft_length):
            return _generate(target, input_ids, policy, max_new_tokens, seed, assistant_model=draft,
                             tokenizer=target_tokenizer, assistant_tokenizer=draft_tokenizer)


@dataclass(frozen=True)
class PromptLookup:
    """transformers prompt-lookup decoding: candidates are n-gram continuations from the prompt."""

    draft_length: int = 3
    max_matching_ngram: int = 2

    capabilities = Capabilities(penalty_conventions=("transformers",))

    @property
    def name(self) -> str:
        return (f"transformers.generate(prompt_lookup_num_tokens={self.draft_length}, "
                f"max_matching_ngram_size={self.max_matching_ngram})")

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        return _generate(target, input_ids, policy, max_new_tokens, seed,
                         prompt_lookup_num_tokens=self.draft_length,
                         max_matching_ngram_size=self.max_matching_ngram,
                         **prompt_lookup_kwargs(bool(policy.stop_tokens), target))


@dataclass(frozen=True)
class TargetGenerate:
    """Plain ``target.generate`` (no draft): what speculative decoding must reproduce."""

    name: str = "transformers.generate (target alone)"

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        return _generate(target, input_ids, policy, max_new_tokens, seed)
