"""Observed laws next to their exact expected laws, computed in float64 from the world.

Each ``LawComparison`` is one check's data: counts per cell from the samples, the exact law of
those cells, and how to name a cell. Expected laws come from the world's rows, never from the
subject. For a step world with target rows p_i and draft rows q_i (i < k) the Leviathan step has

    beta_i = sum_x min(p_i(x), q_i(x))                    (acceptance probability at i)
    P(N = j) = beta_0 ... beta_{j-1} (1 - beta_j),  j < k;   P(N = k) = beta_0 ... beta_{k-1}
    correction | N = j  ~  max(0, p_j - q_j) / (1 - beta_j)
    bonus      | N = k  ~  p_k
    first emitted token ~  p_0

The accepted-length, correction and bonus laws are those of Leviathan et al.'s rejection
sampler. A verifier that declares the target-only rule (``AcceptanceRule.TARGET_ONLY``: accept x
with probability p_i(x); after a rejection draw from p_i without x) is checked against that
rule's laws instead:

    beta_i = sum_x q_i(x) p_i(x);   correction | N = j  ~  p_j(y) (1 - q_j(y)) / (1 - beta_j)

(the draft token x ~ q_j is rejected with probability 1 - p_j(x) and then y != x is drawn from
p_j / (1 - p_j(x)); summing over x gives p_j(y) (1 - q_j(y))).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from exactcheck.step.contract import AcceptanceRule
from exactcheck.step.drive import SequenceSamples, StepSamples
from toy_models import ContextWorld, StepWorld

__all__ = ["LawComparison", "LawPlan", "planned_laws", "compare", "step_law_parts", "policy_sequence_law",
           "MIN_CONDITIONAL_SAMPLES"]

# A conditional law (correction, bonus) is checked only when the exact law expects at least this
# many trials in its condition; the choice depends on the law and n, never on the samples.
MIN_CONDITIONAL_SAMPLES = 100


@dataclass(frozen=True)
class LawPlan:
    """One law to check on a world: its name, condition and exact expected law."""

    law: str
    condition: str
    expected: np.ndarray
    label: Callable[[int], str]
    condition_probability: float = 1.0  # P(a trial counts for this law), exact


@dataclass(frozen=True)
class LawComparison:
    plan: LawPlan
    counts: np.ndarray


def step_law_parts(world: StepWorld, rule: AcceptanceRule = AcceptanceRule.LEVIATHAN
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(P(N = j) for j = 0..k, residual laws [k, V]) of the exact step under ``rule``."""
    p, q = world.target_law(), world.draft_law()
    if rule is AcceptanceRule.TARGET_ONLY:
        beta = (p[:-1] * q).sum(1)
        raw = p[:-1] * (1 - q)
    else:
        beta = np.minimum(p[:-1], q).sum(1)
        raw = np.clip(p[:-1] - q, 0, None)
    reach = np.concatenate([[1.0], np.cumprod(beta)])
    accepted = reach * np.concatenate([1 - beta, [1.0]])
    mass = raw.sum(1, keepdims=True)
    residual = np.where(mass > 0, raw / np.where(mass > 0, mass, 1), p[:-1])
    return np.clip(accepted, 0, 1), residual


def _token(i: int) -> str:
    return f"token {i}"


def planned_laws(world: StepWorld | ContextWorld, n: int,
                 rule: AcceptanceRule = AcceptanceRule.LEVIATHAN) -> list[LawPlan]:
    """The laws checked on ``world`` with ``n`` trials under the subject's acceptance ``rule``,
    decided before any sample is drawn."""
    if isinstance(world, ContextWorld):
        vocab, length = world.vocab_size, world.length

        def sequence(i: int) -> str:
            return str([int(d) for d in np.unravel_index(i, (vocab,) * length)])

        return [LawPlan("sequence", f"first {length} tokens", world.sequence_law(), sequence)]
    p = world.target_law()
    k, vocab = world.draft_length, world.vocab_size
    accepted, residual = step_law_parts(world, rule)
    under = "" if rule is AcceptanceRule.LEVIATHAN else f" (acceptance rule {rule.value})"
    plans = [
        LawPlan("first_token", "first emitted token", p[0], _token),
        LawPlan("accepted_length", f"drafts accepted per step{under}", accepted, lambda j: f"N={j}"),
    ]
    if n * accepted[k] >= MIN_CONDITIONAL_SAMPLES:
        plans.append(LawPlan("bonus_token", f"given N={k}", p[k], _token, float(accepted[k])))
    rejected = accepted[:k].sum()
    if n * rejected >= MIN_CONDITIONAL_SAMPLES:
        joint = (accepted[:k, None] * residual / rejected).reshape(-1)
        plans.append(LawPlan("correction_token", f"(N, token) given N<{k}{under}", joint,
                             lambda c: f"N={c // vocab}, token {c % vocab}", float(rejected)))
    return plans


def compare(plan: LawPlan, samples: StepSamples | SequenceSamples) -> LawComparison:
    """Count the samples into the plan's cells."""
    cells = plan.expected.size
    if isinstance(samples, SequenceSamples):
        vocab, length = samples.world.vocab_size, samples.world.length
        weights = vocab ** np.arange(length - 1, -1, -1, dtype=np.int64)
        index = samples.sequences.numpy() @ weights
    else:
        k, vocab = samples.world.draft_length, samples.world.vocab_size
        accepted, last = samples.accepted.numpy(), samples.last_token.numpy()
        if plan.law == "first_token":
            index = samples.outputs[:, 0].numpy()
        elif plan.law == "accepted_length":
            index = accepted
        elif plan.law == "bonus_token":
            index = last[accepted == k]
        elif plan.law == "correction_token":
            keep = accepted < k
            index = accepted[keep] * vocab + last[keep]
        else:
            raise ValueError(f"unknown step law {plan.law!r}")
    return LawComparison(plan, np.bincount(index, minlength=cells).astype(np.int64))


def policy_sequence_law(world: ContextWorld, policy, length: int) -> dict[tuple[int, ...], float]:
    """The exact float64 law of a generation of at most ``length`` tokens from ``world``'s
    target under a decoding policy (``exactcheck.e2e.policy``): every outcome, as the tuple of its
    tokens (shorter when it ends with a stop token), with its probability. Each row is the
    policy's transform of the target's float64 row at the prefix's state, with the prefix
    passed to the policy's mask."""
    rows = world.target.law()
    out: dict[tuple[int, ...], float] = {}

    def walk(state: int, prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length or (prefix and prefix[-1] in policy.stop_tokens):
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        row = policy.transform(rows[state][None], [prefix])[0]
        for token in np.flatnonzero(row > 0):
            walk(int(world.next_state(state, int(token))), prefix + (int(token),), prob * float(row[token]))

    walk(world.prompt_state, (), 1.0)
    return out
