"""Worlds give exact laws; the closed-form step laws agree with brute-force enumeration."""
import itertools

import numpy as np
import pytest

from exactcheck.step.laws import planned_laws, step_law_parts
from toy_models import context_worlds, make_context_world, step_worlds, three_token


def test_three_token_example_exact_laws():
    accepted, residual = step_law_parts(three_token())
    np.testing.assert_allclose(accepted, [0.1, 0.9], atol=1e-7)
    # the guide's residual: all mass on A (token 0)
    np.testing.assert_array_equal(residual[0], [1.0, 0.0, 0.0])
    plans = {p.law: p for p in planned_laws(three_token(), 200_000)}
    np.testing.assert_allclose(plans["first_token"].expected, [0.6, 0.3, 0.1], atol=1e-7)
    np.testing.assert_array_equal(plans["correction_token"].expected, [1.0, 0.0, 0.0])


def _brute_force_step(world):
    """P(N = j) and P(N = j, correction y) by enumerating every draft block and acceptance path."""
    p, q = world.target_law(), world.draft_law()
    k, vocab = world.draft_length, world.vocab_size
    accepted = np.zeros(k + 1)
    joint = np.zeros((k, vocab))
    for drafts in itertools.product(range(vocab), repeat=k):
        prob_drafts = np.prod([q[i, x] for i, x in enumerate(drafts)])
        reach = prob_drafts
        for i, x in enumerate(drafts):
            a = min(1.0, p[i, x] / q[i, x]) if q[i, x] > 0 else 0.0
            rej = reach * (1 - a)
            accepted[i] += rej
            raw = np.clip(p[i] - q[i], 0, None)
            if rej > 0:
                joint[i] += rej * raw / raw.sum()
            reach *= a
        accepted[k] += reach
    return accepted, joint


@pytest.mark.parametrize("world", [w for w in step_worlds() if w.vocab_size ** w.draft_length <= 5000],
                         ids=lambda w: w.name)
def test_accepted_length_and_residual_laws_match_enumeration(world):
    accepted, residual = step_law_parts(world)
    brute_accepted, brute_joint = _brute_force_step(world)
    np.testing.assert_allclose(accepted, brute_accepted, atol=1e-9)
    rejected = accepted[:-1]
    np.testing.assert_allclose((rejected[:, None] * residual)[rejected > 0],
                               brute_joint[rejected > 0], atol=1e-9)


def test_sequence_law_is_product_of_rows():
    world = make_context_world("tiny", vocab=3, num_states=7, length=3, draft_length=2,
                               agreement=0.5, seed=5)
    law = world.sequence_law()
    rows = world.target.law()
    for cell, seq in enumerate(itertools.product(range(3), repeat=3)):
        state, prob = world.prompt_state, 1.0
        for x in seq:
            prob *= rows[state, x]
            state = world.next_state(state, x)
        assert law[cell] == pytest.approx(prob, rel=1e-12)


@pytest.mark.parametrize("world", context_worlds(), ids=lambda w: w.name)
def test_context_worlds_are_context_dependent_and_normalised(world):
    law = world.sequence_law()
    assert law.sum() == pytest.approx(1.0, abs=1e-12)
    assert 3 <= world.vocab_size <= 64
    # rows differ across states: the next-token law depends on the prefix
    assert np.abs(np.diff(world.target.law()[:5], axis=0)).max() > 0.05


def test_worlds_cover_the_edge_families():
    names = {w.name for w in step_worlds()}
    assert {"three_token", "p_equals_q", "disjoint_supports", "one_hot", "draft_mass_where_p_zero",
            "near_zero_q", "nearly_equal"} <= names
    equal = next(w for w in step_worlds() if w.name == "p_equals_q")
    assert (equal.target_rows[:2] == equal.draft_rows).all()  # bitwise


def test_conditional_laws_are_planned_from_the_law_not_the_data():
    equal = next(w for w in step_worlds() if w.name == "p_equals_q")
    # p == q: a rejection never happens, so there is no correction law to check
    assert "correction_token" not in {p.law for p in planned_laws(equal, 200_000)}
    disjoint = next(w for w in step_worlds() if w.name == "disjoint_supports")
    assert "bonus_token" not in {p.law for p in planned_laws(disjoint, 200_000)}
