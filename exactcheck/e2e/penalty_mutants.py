"""Loop mutants of the penalties (``DecodingPolicy`` repetition, presence and frequency penalties):
each reads the wrong history, or applies the penalty to the wrong rows, as a field bug did.

The reference loop (``exactcheck.e2e.loop.ReferenceSpeculativeLoop``) computes every row's law with
the history of exactly the tokens before it: the prompt (where the convention reads it), the
committed tokens and, at a verified position, the drafts before it. Under speculation that history
is easy to get wrong (field-notes section 7):

- ``PenaltyHistoryMissesPrompt``: the history starts at the output, under a convention that reads
  the prompt (transformers' and vLLM's repetition penalty);
- ``PenaltyOncePerStep`` (SGLang PR #33643): the penalty's counts take one token per verify step,
  not every emitted token (the effective penalty is about nominal / L);
- ``PenaltyOnDraftOnly`` (TRT-LLM PR #17701): the draft applies the penalties, the target at
  verification does not;
- ``VerifiedHistoryMissesDrafts``: the verified positions of a step read the history at the step's
  start, without the drafts before them;
- ``FrequencyOverPrompt`` (vLLM's convention: presence and frequency read the output only): the
  frequency and presence penalties count the prompt too.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from exactcheck.e2e.loop import ReferenceSpeculativeLoop

__all__ = ["PenaltyHistoryMissesPrompt", "PenaltyOncePerStep", "PenaltyOnDraftOnly", "VerifiedHistoryMissesDrafts",
           "FrequencyOverPrompt", "PENALTY_MUTANTS"]


def _unpenalized(policy):
    return dataclasses.replace(policy, repetition_penalty=None, presence_penalty=0.0, frequency_penalty=0.0)


@dataclass(frozen=True)
class PenaltyHistoryMissesPrompt(ReferenceSpeculativeLoop):
    """The penalty history starts at the generated tokens: the prompt's tokens are not penalised
    under a convention that reads them."""

    name: str = "mutant: penalty_history_misses_prompt"

    def policy_rows(self, logits, policy, prefixes, role):
        return dataclasses.replace(policy, prompt=()).probabilities(logits, prefixes)


@dataclass(frozen=True)
class PenaltyOncePerStep(ReferenceSpeculativeLoop):
    """SGLang PR #33643: the penalizer is fed one token per verify step (the step's last emitted
    token), so a step that emitted several tokens counts one of them."""

    name: str = "mutant: penalty_once_per_step"
    counted: list = field(default_factory=list, compare=False, repr=False)  # one token per finished step

    def policy_rows(self, logits, policy, prefixes, role):
        if prefixes and len(prefixes[0]) == 0 and role == "draft":
            self.counted.clear()  # a new generation (its first step drafts from an empty output)
        history = tuple(self.counted)
        return policy.probabilities(logits, [history + tuple(p[len(prefixes[0]):]) for p in prefixes])

    def commit(self, emitted, generated, drafts, p, policy, generator):
        if emitted.numel():
            self.counted.append(int(emitted[-1]))
        return emitted


@dataclass(frozen=True)
class PenaltyOnDraftOnly(ReferenceSpeculativeLoop):
    """TRT-LLM PR #17701: one-model speculation ignored the penalties at verification: the target's
    rows are unpenalised (the draft's are)."""

    name: str = "mutant: penalty_on_draft_only"

    def policy_rows(self, logits, policy, prefixes, role):
        return (policy if role == "draft" else _unpenalized(policy)).probabilities(logits, prefixes)


@dataclass(frozen=True)
class VerifiedHistoryMissesDrafts(ReferenceSpeculativeLoop):
    """Every verified position of a step reads the history at the step's start, without the drafts
    before it (the step's own tokens are counted only from the next step on)."""

    name: str = "mutant: verified_history_misses_drafts"

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "target":
            prefixes = [prefixes[0]] * len(prefixes)
        return policy.probabilities(logits, prefixes)


@dataclass(frozen=True)
class FrequencyOverPrompt(ReferenceSpeculativeLoop):
    """Under vLLM's convention (presence and frequency read the output only), the presence and
    frequency penalties count the prompt's tokens as well."""

    name: str = "mutant: frequency_over_prompt"

    def policy_rows(self, logits, policy, prefixes, role):
        if policy.penalty_convention == "vllm":
            policy = dataclasses.replace(policy, penalty_convention="llama.cpp", penalty_last_n=1 << 30)
        return policy.probabilities(logits, prefixes)


PENALTY_MUTANTS = {m.name.split(": ")[1]: m for m in (
    PenaltyHistoryMissesPrompt(), PenaltyOncePerStep(), PenaltyOnDraftOnly(), VerifiedHistoryMissesDrafts(),
    FrequencyOverPrompt())}
