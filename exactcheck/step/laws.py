"""The step and context worlds' exact laws, and the samples counted into their cells: what
``exactcheck.stats`` compares as data (``LawPlan``, ``LawComparison``).

Observed laws next to their exact expected laws, computed in float64 from the world.

Each ``LawComparison`` is one check's data: counts per cell from the samples, the exact law of
those cells, and how to name a cell. Expected laws come from the world's rows, never from the
subject.

On a step world (target rows p_0..p_k, draft rows q_0..q_{k-1}, drafts drawn from q) every exact
verifier, whatever its rule, emits a first token distributed as p_0 and, when it accepts all k
drafts, a bonus token distributed as p_k: these two laws (``first_token``, ``bonus_token``) judge
**exactness**. (Both follow from exactness itself: the output continued by the target must be a
sample of the target; docs/checks.md.) On a context world the law of a whole generation through
the speculative loop is the target's sequence law, whatever the rule: ``sequence`` judges exactness.

How many drafts are accepted (``accepted_length``) and the law of the token after the last accepted
one (``correction_token``) depend on the rule: they judge **conformance** to it
(``exactcheck.rules``). For a subject that declares its rule, its laws; for one that does not, every
registered exact rule's (``LawPlan.alternatives``): the check passes when one of them fits
(intersection-union: the largest p-value, the smallest e-value). For token-wise rejection sampling

    beta_i = sum_x min(p_i(x), q_i(x))                    (acceptance probability at i)
    P(N = j) = beta_0 ... beta_{j-1} (1 - beta_j),  j < k;   P(N = k) = beta_0 ... beta_{k-1}
    correction | N = j  ~  max(0, p_j - q_j) / (1 - beta_j)

A subject that declares a lossy rule (typical acceptance, thresholds, ...) is checked against the
law its rule induces on each world, first token and sequence included: each such verdict says
how far that law is from the target (an exact TV, computed by enumeration).
"""
from __future__ import annotations

import numpy as np

from exactcheck.rules import (EXACT_RULES, RuleSpec, loop_sequence_law, output_tv, reference_rows,
                              reference_sequence_law, rule_spec, step_laws, step_output_law)
from exactcheck.stats.laws import MIN_CONDITIONAL_SAMPLES, LawComparison, LawPlan
from exactcheck.step.samples import SequenceSamples, StepSamples
from toy_models import ContextWorld, StepWorld

__all__ = ["planned_laws", "compare", "step_law_parts", "planning_rule", "TOKEN_WISE"]

TOKEN_WISE = rule_spec("token-wise")


def planning_rule(rule: RuleSpec | None) -> RuleSpec:
    """The rule budgets are planned under: the declared one, else token-wise."""
    return rule or TOKEN_WISE


def step_law_parts(world: StepWorld, rule: RuleSpec | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(P(N = j) for j = 0..k, correction laws given N = j [k, V]) of the step under ``rule``."""
    laws = step_laws(planning_rule(rule), world.target_law(), world.draft_law())
    rejected = laws.accepted[:-1, None]
    residual = np.where(rejected > 0, laws.correction / np.where(rejected > 0, rejected, 1.0),
                        world.target_law()[:-1])
    return np.clip(laws.accepted, 0, 1), residual


def _token(i: int) -> str:
    return f"token {i}"


def planned_laws(world: StepWorld | ContextWorld, n: int, rule: RuleSpec | None = None) -> list[LawPlan]:
    """The laws checked on ``world`` with ``n`` trials for a subject judged by ``rule`` (None:
    undeclared), decided before any sample is drawn."""
    exact = rule is None or rule.exact
    greedy = rule is not None and rule.rule.greedy
    lossy = {} if exact else dict(lossy_rule=rule.label, lossy_tv=output_tv(rule, world))
    if isinstance(world, ContextWorld):
        vocab, length = world.vocab_size, world.length

        def sequence(i: int) -> str:
            return str([int(d) for d in np.unravel_index(i, (vocab,) * length)])

        expected = reference_sequence_law(world, greedy) if exact else loop_sequence_law(rule, world)
        return [LawPlan("sequence", f"first {length} tokens", expected, sequence, conformance=not exact, **lossy)]
    p = world.target_law()
    reference = reference_rows(p, greedy)
    k, vocab = world.draft_length, world.vocab_size
    planning = planning_rule(rule)
    laws = step_laws(planning, p, world.draft_law())
    accepted = np.clip(laws.accepted, 0, 1)
    under = ("" if rule == TOKEN_WISE else " (any registered exact rule)" if rule is None
             else f" (rule {rule.label})")
    others = [] if rule is not None else [(name, step_laws(rule_spec(name), p, world.draft_law()))
                                          for name in EXACT_RULES]
    plans = [
        LawPlan("first_token", "first emitted token", reference[0] if exact else laws.emitted[0], _token,
                conformance=not exact, **lossy),
        LawPlan("accepted_length", f"drafts accepted per step{under}", accepted, lambda j: f"N={j}",
                conformance=True, alternatives=tuple((name, np.clip(other.accepted, 0, 1)) for name, other in others)),
    ]
    if n * accepted[k] >= MIN_CONDITIONAL_SAMPLES:
        plans.append(LawPlan("bonus_token", f"given N={k}", reference[k] if exact else laws.bonus, _token,
                             float(accepted[k]), conformance=not exact, **lossy))
    rejected = accepted[:k].sum()
    if n * rejected >= MIN_CONDITIONAL_SAMPLES:
        def joint(parts) -> np.ndarray:
            mass = parts.accepted[:k].sum()
            return (parts.correction / mass).reshape(-1) if mass > 0 else np.zeros(k * vocab)

        plans.append(LawPlan("correction_token", f"(N, token) given N<{k}{under}", joint(laws),
                             lambda c: f"N={c // vocab}, token {c % vocab}", float(rejected), conformance=True,
                             alternatives=tuple((name, joint(other)) for name, other in others)))
    # the joint conformance law: one rule must explain N, the first token and the last together
    draft = world.draft_law()
    cells = np.arange((k + 1) * vocab * vocab)
    n_of, first_of, last_of = cells // vocab ** 2, cells // vocab % vocab, cells % vocab
    plans.append(LawPlan("step_output", f"(N, first token, last token) of each step{under}",
                         step_output_law(planning, p, draft),
                         lambda c: f"N={c // vocab ** 2}, first {c // vocab % vocab}, last {c % vocab}",
                         conformance=True, alternatives=tuple((name, step_output_law(rule_spec(name), p, draft))
                                                              for name in EXACT_RULES) if rule is None else (),
                         groupings=(n_of * vocab + first_of, n_of * vocab + last_of)))
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
        elif plan.law == "step_output":
            index = (accepted * vocab + samples.outputs[:, 0].numpy()) * vocab + last
        else:
            raise ValueError(f"unknown step law {plan.law!r}")
    return LawComparison(plan, np.bincount(index, minlength=cells).astype(np.int64))
