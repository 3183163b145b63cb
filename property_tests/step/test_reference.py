"""The reference verifier: exact on worlds with known answers, and safe at the boundaries."""
import pytest
import numpy as np
import torch

from exactcheck import Outcome, reference_verifier, run_audit
from exactcheck.step.properties import PROPERTIES, search
from exactcheck.forcing.randomness import controlled_randomness
from exactcheck.step.drive import drive
from exactcheck.step.laws import step_law_parts
from toy_models import step_worlds, three_token


def test_three_token_example_verdicts():
    result = run_audit(reference_verifier, level="standard", worlds=["three_token"], progress=False)
    verdicts = {v.law: v for v in result.verdicts}
    assert set(verdicts) == {"first_token", "accepted_length", "bonus_token", "correction_token", "step_output"}
    assert all(v.outcome is Outcome.EXACT for v in verdicts.values())
    # each verdict carries its numbers
    first = verdicts["first_token"]
    assert first.samples == 150_000 and first.detectable_tv < 0.01  # the standard level's floor
    assert first.tv_certificate is not None and first.tv_certificate <= 0.01
    assert first.tv_interval[0] <= first.tv_estimate <= first.tv_interval[1]


def test_three_token_residual_is_all_on_a():
    samples = drive(reference_verifier, three_token(), 100_000, seed=1)
    rejected = samples.accepted == 0
    assert rejected.sum() > 9_000
    assert (samples.last_token[rejected] == 0).all()


def test_accepted_length_frequencies_follow_the_exact_law():
    world = next(w for w in step_worlds() if w.name == "random_v8_k4")
    samples = drive(reference_verifier, world, 200_000, seed=2)
    freq = np.bincount(samples.accepted.numpy(), minlength=5) / 200_000
    law, _ = step_law_parts(world)
    assert np.abs(freq - law).max() < 0.005  # 5 sigma at n = 200k is about 0.0045


@pytest.mark.long
def test_reference_holds_every_property():
    for name in PROPERTIES:
        result = search(reference_verifier, name, examples=15, seed=3)
        assert result.failure is None, result.failure
        assert result.examples > 0 and not result.note, result.note


def test_zero_residual_after_a_rounding_rejection_draws_from_p():
    # q exceeds p by one ulp at the draft token, so u close to 1 rejects it; the residual
    # max(0, p - q) is then not a law at all on some rows: the reference must still emit a valid id
    p = torch.tensor([[0.25, 0.25, 0.5], [0.2, 0.3, 0.5]])
    q = torch.nextafter(p[:1], torch.ones_like(p[:1]))
    drafts = torch.tensor([[2]])
    with controlled_randomness("one_minus_ulp"):
        out = reference_verifier(p[None], q[None], drafts, torch.Generator())
    assert out.shape == (1, 2) and out[0, 0] in (0, 1, 2) and out[0, 1] == -1
    assert p[0, out[0, 0]] > 0


def test_same_seed_same_output_and_rows_independent_of_batch():
    world = next(w for w in step_worlds() if w.name == "random_v8_k4")
    a = drive(reference_verifier, world, 5_000, seed=9)
    b = drive(reference_verifier, world, 5_000, seed=9)
    c = drive(reference_verifier, world, 5_000, seed=10)
    assert torch.equal(a.outputs, b.outputs) and not torch.equal(a.outputs, c.outputs)
