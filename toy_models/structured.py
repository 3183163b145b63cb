"""Structured-output worlds whose constraint ends inside a draft window (issue 68).

One 9-token vocabulary: two thinking words ``hmm`` ``so``, the end-of-thinking token
``</think>``, the answer words ``yes`` ``no`` ``maybe`` ``not`` ``.``, and ``<eos>`` (the stop
token).

* ``choice_v9``: a ``choice``-like constraint of four short alternatives of different lengths,
  ``yes`` | ``no .`` | ``maybe`` | ``maybe not .``, then ``<eos>``. The grammar accepts after 1,
  2 or 3 tokens (after ``maybe`` it has accepted and may still go on), so with a draft window of
  3 or 4 the end of generation lands at varied positions inside the first block.
* ``think_choice_v9``: a reasoning boundary. Free text (the target's own law, every token
  allowed, ``<eos>`` included) for at most ``THINKING_BUDGET`` tokens, then ``</think>`` (forced
  when the budget is spent), then the choice constraint. With the budget of 3 the boundary is
  at generated position 0 to 3, so ``</think>`` and the first constrained token fall inside a
  window of 3 or 4 drafts.

Each world's law is the target's law masked by the world's ``mask(prefix)`` and renormalised,
enumerated in float64 from the world (``exactcheck.generation.laws.policy_sequence_law``): 4
outputs in ``choice_v9``, 2,000 in ``think_choice_v9``. The masks are total (any prefix gets a
non-empty set; a dead prefix gets ``<eos>``), so a mutant that feeds them a stale prefix still
gets a row.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

from toy_models.context_lm import make_context_world
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["TOKENS", "EOS", "END_OF_THINKING", "CHOICES", "THINKING_BUDGET", "choice_allowed",
           "ReasoningThenConstraint", "choice_world", "reasoning_world", "structured_worlds"]

TOKENS = ("hmm", "so", "</think>", "yes", "no", "maybe", "not", ".", "<eos>")
HMM, SO, END_OF_THINKING, YES, NO, MAYBE, NOT, DOT, EOS = range(9)
CHOICES = ((YES,), (NO, DOT), (MAYBE,), (MAYBE, NOT, DOT))
THINKING_BUDGET = 3
EVERY_TOKEN = tuple(range(len(TOKENS)))


@functools.lru_cache(maxsize=None)
def choice_allowed(prefix: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens the choice constraint allows after ``prefix`` (the answer so far): the next
    token of every alternative ``prefix`` begins, and ``<eos>`` where ``prefix`` is a whole
    alternative; after ``<eos>``, or on a prefix no alternative begins, only ``<eos>``."""
    if EOS in prefix:
        return (EOS,)
    n = len(prefix)
    following = {alt[n] for alt in CHOICES if len(alt) > n and alt[:n] == prefix}
    if prefix in CHOICES:
        following.add(EOS)
    return tuple(sorted(following)) or (EOS,)


@dataclass(frozen=True)
class ReasoningThenConstraint:
    """A mask that leaves the thinking free and constrains the answer: every token allowed
    until ``end_of_thinking`` (only it once ``budget`` thinking tokens are spent; only ``<eos>``
    after an ``<eos>``), then ``constraint`` of the tokens after it. ``end_of_thinking`` is read
    by the late-constraint mutant (``exactcheck.e2e.grammar_mutants``)."""

    end_of_thinking: int
    budget: int
    constraint: Callable[[tuple[int, ...]], tuple[int, ...]]
    every_token: tuple[int, ...]
    stop: int

    def __call__(self, prefix: tuple[int, ...]) -> tuple[int, ...]:
        prefix = tuple(prefix)
        if self.end_of_thinking in prefix:
            return self.constraint(prefix[prefix.index(self.end_of_thinking) + 1:])
        if self.stop in prefix:
            return (self.stop,)
        return (self.end_of_thinking,) if len(prefix) >= self.budget else self.every_token


REASONING_MASK = ReasoningThenConstraint(END_OF_THINKING, THINKING_BUDGET, choice_allowed, EVERY_TOKEN, EOS)


def is_valid_choice(tokens) -> bool:
    """A whole alternative, then ``<eos>``, every token allowed where it stands."""
    tokens = tuple(int(t) for t in tokens)
    return bool(tokens) and tokens[-1] == EOS and tokens[:-1] in CHOICES


def is_valid_reasoning(tokens) -> bool:
    """Free thinking ended by ``<eos>``, or thinking, ``</think>`` and a valid choice; every token
    allowed by the mask where it stands."""
    tokens = tuple(int(t) for t in tokens)
    if not tokens or tokens[-1] != EOS or any(tokens[i] not in REASONING_MASK(tokens[:i]) for i in range(len(tokens))):
        return False
    if END_OF_THINKING not in tokens:
        return True
    return is_valid_choice(tokens[tokens.index(END_OF_THINKING) + 1:])


def answer(output) -> str:
    """The answer of an output: the text after ``</think>`` without ``<eos>`` ("-": none)."""
    output = tuple(output)
    if END_OF_THINKING not in output:
        return "-"
    return " ".join(TOKENS[t] for t in output[output.index(END_OF_THINKING) + 1:] if t != EOS)


def thinking_length(output) -> int:
    """Where ``</think>`` stands (-1: none)."""
    output = tuple(output)
    return output.index(END_OF_THINKING) if END_OF_THINKING in output else -1


def _world(name: str, mask, validate, validity: str, longest: int, marginals, seed: int) -> ModelWorld:
    from exactcheck.contracts.policy import DecodingPolicy
    world = make_context_world(name, vocab=len(TOKENS), num_states=97, length=longest, draft_length=4,
                               agreement=0.5, seed=seed, concentration=1.0)
    prompt, state = prompt_for_state(world, 4, seed=seed)
    policy = DecodingPolicy(temperature=1.0, stop_tokens=(EOS,), mask=mask, name=name.split("_")[0])
    # room for 4 tokens past the longest output: a generator must stop at <eos> anyway
    return ModelWorld(name, dataclasses.replace(world, prompt_state=state), tuple(prompt), policy=policy,
                      validate=validate, validity=validity, max_new_tokens=longest + 4, marginals=marginals)


@functools.lru_cache(maxsize=1)
def choice_world() -> ModelWorld:
    """The choice world: 4 outputs of 2 to 4 tokens."""
    return _world("choice_v9", choice_allowed, is_valid_choice, "every output is one of the choices, then <eos>", 4,
                  (), seed=73)


@functools.lru_cache(maxsize=1)
def reasoning_world() -> ModelWorld:
    """The reasoning-boundary world: at most 3 free tokens, ``</think>``, a choice, ``<eos>``."""
    marginals = (("answer", "the answer after </think>", answer),
                 ("thinking_length", "where </think> stands", thinking_length))
    return _world("think_choice_v9", REASONING_MASK, is_valid_reasoning,
                  "every output is free thinking ended by <eos>, or thinking, </think>, one of the choices, <eos>",
                  THINKING_BUDGET + 1 + 4, marginals, seed=69)


def structured_worlds() -> tuple[ModelWorld, ModelWorld]:
    return choice_world(), reasoning_world()
