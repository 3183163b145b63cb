"""Context-dependent toy language models whose sequence law can be enumerated exactly.

A ``ToyLM`` is a finite-state model: the prefix is summarised by a rolling hash state
``s' = (s * V + x + 1) mod S`` and the next-token row is ``table[s]``. Every row therefore depends
on the whole prefix through the state, yet the law of every length-L continuation is a finite
product of table rows, enumerated in float64 by ``ContextWorld.sequence_law``. Target and draft
share the state machine and differ in their tables; ``agreement`` sets how close the draft is.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["ToyLM", "ContextWorld", "context_worlds", "make_context_world"]


@dataclass(frozen=True, eq=False)
class ToyLM:
    """Next-token rows ``table[S, V]`` (float32) indexed by the rolling-hash state of the prefix.
    Compared and hashed by identity, so tables derived from a model can be cached per model."""

    table: torch.Tensor

    @property
    def num_states(self) -> int:
        return self.table.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.table.shape[1]

    def law(self) -> np.ndarray:
        """The float64 law of every state's row (float32 values renormalised in float64)."""
        law = self.table.double().numpy()
        return law / law.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class ContextWorld:
    """A target and a draft ``ToyLM`` driven from ``prompt_state`` to ``length`` new tokens,
    drafting ``draft_length`` tokens per verify call."""

    name: str
    description: str
    target: ToyLM
    draft: ToyLM
    prompt_state: int
    length: int
    draft_length: int
    # False: the draft has a vocabulary (and state machine) of its own (``toy_models.tokenizer_worlds``)
    shared_vocabulary: bool = True
    # the tokens random prompts are drawn from (None: every token; ``hf_toy_lm.prompt_for_state``)
    prompt_tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.shared_vocabulary and self.target.table.shape != self.draft.table.shape:
            raise ValueError(f"world {self.name}: target and draft tables differ in shape")

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def num_states(self) -> int:
        return self.target.num_states

    def next_state(self, states, tokens):
        """The state after appending ``tokens`` (works on ints, numpy arrays and tensors)."""
        return (states * self.vocab_size + tokens + 1) % self.num_states

    def sequence_law(self, rows: np.ndarray | None = None) -> np.ndarray:
        """Exact float64 law of the first ``length`` tokens, indexed by
        ``x_1 * V**(L-1) + ... + x_L`` (earlier tokens are more significant). ``rows`` [S, V]
        replaces the target's rows (a decoding policy's transform of them)."""
        vocab = self.vocab_size
        rows = self.target.law() if rows is None else rows
        law = np.ones(1)
        states = np.array([self.prompt_state], dtype=np.int64)
        for _ in range(self.length):
            law = (law[:, None] * rows[states]).reshape(-1)
            states = self.next_state(np.repeat(states, vocab), np.tile(np.arange(vocab), states.size))
        return law


def make_context_world(name: str, vocab: int, num_states: int, length: int, draft_length: int,
                       agreement: float, seed: int, concentration: float = 0.7) -> ContextWorld:
    """Dirichlet target rows per state; draft rows ``agreement * p + (1 - agreement) * noise``."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, concentration), size=num_states)
    noise = rng.dirichlet(np.full(vocab, concentration), size=num_states)
    q = agreement * p + (1 - agreement) * noise

    def f32(rows: np.ndarray) -> torch.Tensor:
        return torch.tensor(rows / rows.sum(1, keepdims=True), dtype=torch.float32)

    return ContextWorld(
        name,
        f"context LM, V={vocab}, {num_states} states, L={length}, k={draft_length}, "
        f"draft agreement {agreement}",
        ToyLM(f32(p)), ToyLM(f32(q)), prompt_state=int(rng.integers(num_states)),
        length=length, draft_length=draft_length,
    )


@functools.lru_cache(maxsize=1)
def context_worlds() -> tuple[ContextWorld, ...]:
    """The built-in context worlds, in audit order (3 to 64 tokens; 243 to 4096 sequences).
    Built once per process; worlds are immutable."""
    return (
        make_context_world("ctx_v3_l5_k3", vocab=3, num_states=13, length=5, draft_length=3,
                           agreement=0.6, seed=21),
        make_context_world("ctx_v4_l5_k4", vocab=4, num_states=17, length=5, draft_length=4,
                           agreement=0.85, seed=22),
        make_context_world("ctx_v8_l3_k2", vocab=8, num_states=67, length=3, draft_length=2,
                           agreement=0.3, seed=23),
        make_context_world("ctx_v64_l2_k1", vocab=64, num_states=4099, length=2, draft_length=1,
                           agreement=0.7, seed=24),
    )
