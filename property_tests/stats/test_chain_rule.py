"""Chain-rule checks: exact under the null, sensitive to a temperature error, fast path = rows."""
import numpy as np
import pytest
import torch

from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS, chain_rule_tests, teacher_forced
from exactcheck.step.drive import drive_chain
from exactcheck.step.mutants import SMALL_BIAS_MUTANTS
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.stats.goodness_of_fit import holm
from toy_models.zipf_world import ZipfWorld, zipf_world

SMALL = ZipfWorld("zipf_v2000_l16_k3", 2_000, 16, 3, 1.1, 5)


def _rejects(world, sequences, seed, alpha=1e-3):
    tests = chain_rule_tests(world, sequences, seed)
    assert [t.name for t in tests] == list(CHAIN_RULE_TESTS)
    return min(holm([t.pvalue for t in tests], alpha)[0]) <= alpha


def test_fast_statistics_equal_the_generic_computation_from_the_rows():
    for world in (SMALL, zipf_world()):
        gen = torch.Generator().manual_seed(1)
        seqs = world.sample(3, gen)
        fast, generic = teacher_forced(world, seqs), teacher_forced(world, seqs, fast=False)
        for key in fast:
            assert torch.allclose(fast[key], generic[key], rtol=0, atol=1e-11), key


def test_world_rows_are_laws_and_sampling_follows_them():
    prev, pos = torch.tensor([0, 5, 1999]), torch.tensor([0, 3, 15])
    for rows in (SMALL.target_rows(prev, pos), SMALL.draft_rows(prev, pos)):
        assert rows.shape == (3, 2000) and (rows > 0).all()
        assert torch.allclose(rows.sum(1), torch.ones(3, dtype=torch.float64))
    # first-position law of direct sampling against the row (chi-square, 8 pooled cells)
    seqs = SMALL.sample(40_000, torch.Generator().manual_seed(2))
    p0 = SMALL.target_rows(torch.tensor([0]), torch.tensor([0]))[0].numpy()
    order = np.argsort(-p0)
    counts = np.bincount(seqs[:, 0].numpy(), minlength=2000)[order]
    edges = [0, 1, 2, 4, 8, 16, 64, 256, 2000]
    obs = np.array([counts[a:b].sum() for a, b in zip(edges, edges[1:])])
    exp = np.array([p0[order][a:b].sum() for a, b in zip(edges, edges[1:])]) * 40_000
    assert (((obs - exp) ** 2) / exp).sum() < 26.1  # chi-square 7 df, p = 5e-4


@pytest.mark.long
def test_false_alarm_rate_on_exact_sequences_is_at_most_alpha():
    """300 runs of 300 exact sequences: rejections at alpha = 0.05 within the binomial bound."""
    rejections = 0
    for run in range(300):
        seqs = SMALL.sample(300, torch.Generator().manual_seed(100 + run))
        rejections += _rejects(SMALL, seqs, seed=run, alpha=0.05)
    assert rejections <= 15 + 3 * (300 * 0.05 * 0.95) ** 0.5  # mean 15, 3 sigma


def test_reference_through_the_loop_passes_and_temperature_error_is_caught():
    ref = drive_chain(reference_verifier, SMALL, 300, seed=4)
    assert ref.sequences.shape == (300, 16) and (ref.sequences >= 0).all()
    assert not _rejects(SMALL, ref.sequences, seed=5)
    hot = drive_chain(SMALL_BIAS_MUTANTS["temperature_1.05"].verifier, SMALL, 300, seed=4)
    assert _rejects(SMALL, hot.sequences, seed=5)


@pytest.mark.slow
def test_v50000_temperature_error_detected_with_few_sequences():
    world = zipf_world()
    ref = drive_chain(reference_verifier, world, 100, seed=6)
    assert not _rejects(world, ref.sequences, seed=7)
    hot = drive_chain(SMALL_BIAS_MUTANTS["temperature_1.05"].verifier, world, 100, seed=6)
    assert _rejects(world, hot.sequences, seed=7)


@pytest.mark.long
def test_audit_runs_the_large_world_when_named_and_flags_a_temperature_error():
    from exactcheck import run_audit
    from exactcheck.step.mutants import temperature_1_05

    result = run_audit(temperature_1_05, level="quick", worlds=["zipf_v50000_l64_k4"], progress=False)
    chain = [v for v in result.verdicts if v.world == "zipf_v50000_l64_k4"]
    assert [v.law for v in chain] == list(CHAIN_RULE_TESTS)
    assert all(v.samples == 200 * 64 for v in chain)
    assert "surprisal" in {v.law for v in result.failed}
    assert all(v.adjusted_pvalue is not None for v in chain)
