"""Penalties in the decoding policy: repetition, presence and frequency, each reading the history
its engine's convention reads; the exact laws against a direct computation; the reference loop
under them; the field's penalty mutants (exactcheck.e2e.penalty_mutants)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.contracts.policy import DecodingPolicy  # noqa: E402
from exactcheck.generation.laws import policy_sequence_law  # noqa: E402

POLICIES = (
    DecodingPolicy(1.0, repetition_penalty=1.8),
    DecodingPolicy(0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6,
                   penalty_convention="vllm"),
    DecodingPolicy(1.0, repetition_penalty=1.5, frequency_penalty=0.5, penalty_convention="llama.cpp",
                   penalty_last_n=4),
)


def _direct(world, policy, sequence) -> float:
    """The probability of ``sequence`` computed apart from the library: per position, the penalties
    of the convention written out on the row's log-probabilities, then the temperature."""
    rows = world.world.target.law()
    state, probability = world.world.prompt_state, 1.0
    for j, token in enumerate(sequence):
        logit = np.log(rows[state]).copy()
        output = list(sequence[:j])
        whole = list(world.prompt) + output
        if policy.penalty_convention == "llama.cpp":
            repeated = counted = whole[-policy.penalty_last_n:]
        else:
            repeated, counted = whole, output
        r = policy.repetition_penalty or 1.0
        for t in set(repeated):
            logit[t] = logit[t] / r if logit[t] > 0 else logit[t] * r
        for t in set(counted):
            logit[t] -= policy.presence_penalty + policy.frequency_penalty * counted.count(t)
        logit = logit / policy.temperature
        p = np.exp(logit - logit.max())
        probability *= (p / p.sum())[token]
        state = world.world.next_state(state, token)
    return probability


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.label())
def test_the_exact_law_under_each_penalty_is_the_direct_computation(policy):
    from toy_models.suite import all_model_worlds
    from exactcheck.e2e.plan import world_policies
    for world in all_model_worlds()[:2]:
        bound = world_policies(world, [policy])[0]
        assert bound.prompt == world.prompt
        law = policy_sequence_law(world.world, bound, world.length)
        plain = policy_sequence_law(world.world, DecodingPolicy(policy.temperature), world.length)
        for sequence in itertools.product(range(world.vocab_size), repeat=world.length):
            assert abs(law.get(sequence, 0.0) - _direct(world, policy, sequence)) < 1e-15
        tv = 0.5 * sum(abs(law.get(k, 0.0) - plain.get(k, 0.0)) for k in set(law) | set(plain))
        assert tv > 0.1  # the prompts repeat tokens: a penalty matters from the first position


def test_penalties_read_their_conventions_history_and_signs():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0]], dtype=torch.float64)
    rep = DecodingPolicy(1.0, repetition_penalty=2.0, prompt=(0, 1))
    x = rep.scores(logits, [(2,)])
    assert x.tolist() == [[1.0, -2.0, 0.25, 0.0]]  # positive divided, negative multiplied, unseen kept
    vllm = DecodingPolicy(1.0, presence_penalty=0.5, frequency_penalty=0.25, penalty_convention="vllm", prompt=(3, 3))
    assert vllm.scores(logits, [(1, 1, 2)]).tolist() == [[2.0, -2.0, -0.25, 0.0]]  # output only: not the prompt's 3
    last = DecodingPolicy(1.0, frequency_penalty=1.0, penalty_convention="llama.cpp", penalty_last_n=2,
                          prompt=(0, 0, 0))
    assert last.scores(logits, [(1,)]).tolist() == [[1.0, -2.0, 0.5, 0.0]]  # the last 2 tokens: 0 and 1
    with pytest.raises(ValueError, match="transformers has no presence or frequency"):
        DecodingPolicy(1.0, presence_penalty=0.5)


def test_a_penalty_policy_round_trips_the_command_line():
    from exactcheck.e2e.entry import parse_policy
    for policy in POLICIES:
        assert parse_policy(policy.spec()) == policy
        assert eval(policy.code(), {"DecodingPolicy": DecodingPolicy}) == policy  # noqa: S307


@pytest.mark.parametrize("name", [pytest.param("reference", marks=pytest.mark.long)] + [
    pytest.param(name, marks=pytest.mark.slow) for name in (
        "penalty_history_misses_prompt", "penalty_once_per_step", "penalty_on_draft_only",
        "verified_history_misses_drafts", "frequency_over_prompt")])
def test_the_reference_passes_and_each_penalty_mutant_is_found_at_quick(name):
    """The reference under two penalty policies passes (a long test); each mutant is found by a
    sequence law (``-m slow``, about a minute each; measured: reports/penalty-mutants.md)."""
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    from exactcheck.e2e.penalty_mutants import PENALTY_MUTANTS
    from exactcheck.e2e.runner import run_generator_audit
    subject = ReferenceSpeculativeLoop() if name == "reference" else PENALTY_MUTANTS[name]
    result = run_generator_audit(subject, level="quick", seed=0, progress=False, greedy=False,
                                 worlds=["hf_v3_l4_k3", "hf_v4_l3_k2"], policies=POLICIES[:2])
    if name == "reference":
        assert result.passed, [v.summary for v in result.failed]
    else:
        assert any(v.law.startswith("sequence") for v in result.failed), [v.check for v in result.verdicts]
