"""transformers' own ``generate`` loop as end-to-end generators (``exactcheck.generator``).

- ``AssistedGeneration``: ``target.generate(assistant_model=draft)``, greedy or sampling. The
  drafting settings are set where transformers reads them, on ``draft.generation_config``
  (``num_assistant_tokens`` = ``draft_length``, a constant schedule, confidence threshold 0 so
  every step drafts ``draft_length`` tokens), and restored afterwards. ``ensemble_weight`` sets
  ``assistant_ensemble_weight``; a weight in (0, 1) targets a mixture of p and q on purpose, so
  the generator declares itself lossy.
- ``PromptLookup``: ``generate(prompt_lookup_num_tokens=draft_length)``; the draft model is
  not used (candidates come from n-grams of the prompt).
- ``TargetGenerate``: plain ``target.generate`` without a draft, the baseline.

Sampling passes ``top_k=0`` and ``top_p=1.0`` explicitly: transformers fills an unset ``top_k``
with its global default 50, which is not the policy "softmax(logits / T)". Every call passes an
all-ones attention mask (transformers otherwise infers one from ``pad_token_id``, which in a toy
vocabulary is a real token) and draws its randomness from the global torch generator, seeded
with the call's seed inside ``torch.random.fork_rng`` so the caller's global state is untouched.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.generator import DecodingPolicy, Generation

__all__ = ["AssistedGeneration", "PromptLookup", "TargetGenerate"]


def _policy_kwargs(policy: DecodingPolicy) -> dict:
    if policy.greedy:
        return dict(do_sample=False, temperature=None, top_k=None, top_p=None)
    return dict(do_sample=True, temperature=policy.temperature, top_k=0, top_p=1.0)


def _generate(model, input_ids, policy, max_new_tokens, seed, **kwargs) -> Generation:
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(input_ids.to(model.device), attention_mask=torch.ones_like(input_ids, device=model.device),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             return_dict_in_generate=True, **_policy_kwargs(policy), **kwargs)
    return Generation(out.sequences, target_cache=getattr(out, "cache", None))


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

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        config = draft.generation_config
        settings = dict(num_assistant_tokens=self.draft_length, num_assistant_tokens_schedule="constant",
                        assistant_confidence_threshold=0.0)
        saved = {key: getattr(config, key, None) for key in settings}
        for key, value in settings.items():
            setattr(config, key, value)
        try:
            extra = {} if self.ensemble_weight is None else dict(assistant_ensemble_weight=self.ensemble_weight)
            return _generate(target, input_ids, policy, max_new_tokens, seed, assistant_model=draft, **extra)
        finally:
            for key, value in saved.items():
                setattr(config, key, value)


@dataclass(frozen=True)
class PromptLookup:
    """transformers prompt-lookup decoding: candidates are n-gram continuations from the prompt."""

    draft_length: int = 3
    max_matching_ngram: int = 2

    @property
    def name(self) -> str:
        return (f"transformers.generate(prompt_lookup_num_tokens={self.draft_length}, "
                f"max_matching_ngram_size={self.max_matching_ngram})")

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        return _generate(target, input_ids, policy, max_new_tokens, seed,
                         prompt_lookup_num_tokens=self.draft_length,
                         max_matching_ngram_size=self.max_matching_ngram)


@dataclass(frozen=True)
class TargetGenerate:
    """Plain ``target.generate`` (no draft): what speculative decoding must reproduce."""

    name: str = "transformers.generate (target alone)"

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        return _generate(target, input_ids, policy, max_new_tokens, seed)
