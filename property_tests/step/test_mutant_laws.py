"""The mutants' exact output laws (``exactcheck.step.mutant_laws``), the oracle's half of
``benchmarks/efficiency.py``: each one must be the law of the mutant's own samples.

The sample checks are Pearson tests of the whole step output (every sequence of emitted tokens)
against the computed law, Bonferroni over every (mutant, world) pair at a family-wise alpha of
1e-3, with fixed seeds: a correct law fails this family with probability at most 1e-3, and the
seeds make the outcome the same on every run. A sample on an output the law gives probability 0
fails at once.
"""
from __future__ import annotations

import numpy as np
import pytest

from exactcheck.rules import rule_spec
from exactcheck.stats.goodness_of_fit import goodness_of_fit
from exactcheck.step.drive import drive_steps
from exactcheck.step.mutant_laws import (NO_LAW, exact_output_law, mutant_emission, mutant_output_law, output_cells,
                                         output_law, sampled_law)
from exactcheck.step.mutants import MUTANTS, SMALL_BIAS_MUTANTS
from exactcheck.contracts.reference_verifier import reference_verifier
from toy_models.step_worlds import step_worlds

CORPUS = dict(MUTANTS, **SMALL_BIAS_MUTANTS)
WITH_LAW = {name: m for name, m in CORPUS.items() if mutant_emission(m.verifier) is not None}
# worlds with impossible outputs, ties, rounding and k = 4: where most mutants show
WORLDS = {w.name: w for w in step_worlds() if w.name in ("three_token", "random_v8_k4", "nearly_equal",
                                                          "disjoint_supports", "random_v8_k4@bfloat16")}
FAMILY_ALPHA = 1e-3
TRIALS = 10_000


def test_every_mutant_has_a_law_or_says_why_not():
    for name, m in CORPUS.items():
        assert (mutant_emission(m.verifier) is None) == (type(m.verifier) in NO_LAW), name
    assert len(WITH_LAW) >= 24


def test_the_reference_verifiers_law_is_the_exact_law():
    for world in step_worlds():
        ours = mutant_output_law(mutant_emission(reference_verifier), world)
        assert ours.sum() == pytest.approx(1.0, abs=1e-12)
        # rows read as they are handed, not renormalised: each position off by at most its rows'
        # rounding (about 1e-7 in float32, 1e-3 in bfloat16)
        off = sum(float((rows.double().sum(1) - 1).abs().max()) for rows in (world.target_rows, world.draft_rows))
        assert 0.5 * np.abs(ours - exact_output_law(world)).sum() <= (world.draft_length + 1) * off, world.name


@pytest.mark.long
def test_every_mutant_law_differs_from_the_rule_it_declares():
    for name, m in WITH_LAW.items():
        spec, emission = rule_spec(m.rule), mutant_emission(m.verifier)
        tvs = [0.5 * np.abs(mutant_output_law(emission, w) - output_law(spec.emission, w.target_law(), w.draft_law())).sum()
               for w in step_worlds()]
        assert max(tvs) > 5e-4, name


def _matches_its_samples(name: str, worlds: list, trials: int) -> None:
    verifier, emission = WITH_LAW[name].verifier, mutant_emission(WITH_LAW[name].verifier)
    share = FAMILY_ALPHA / (len(WITH_LAW) * len(worlds))
    for world in worlds:
        law = mutant_output_law(emission, world)
        samples = drive_steps(verifier, world, trials, seed=20261202)
        counts = np.bincount(output_cells(samples.outputs.numpy(), world.vocab_size), minlength=law.size)
        fit = goodness_of_fit(counts, law, share)
        assert fit.impossible == 0, f"{name} on {world.name}: outputs the law says never happen"
        assert fit.pvalue > share, f"{name} on {world.name}: p = {fit.pvalue:.3g}"


@pytest.mark.parametrize("name", sorted(WITH_LAW))
def test_a_mutants_law_is_the_law_of_its_samples(name):
    _matches_its_samples(name, list(WORLDS.values()), TRIALS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(WITH_LAW))
def test_a_mutants_law_is_the_law_of_its_samples_on_every_world(name):
    _matches_its_samples(name, step_worlds(), 40_000)


def test_sampled_law_follows_the_sampler_on_rows_that_are_not_laws():
    law = np.array([[0.2, 0.3, 0.5]])
    assert np.allclose(sampled_law(law), law)
    # a total of 0.5: every uniform past it is clamped to the last token of positive mass
    assert np.allclose(sampled_law(np.array([[0.1, 0.4, 0.0]])), [[0.1, 0.9, 0.0]])
    # a uniform restricted to [0.25, 0.75)
    assert np.allclose(sampled_law(law, np.array([0.25]), np.array([0.75])), [[0.0, 0.5, 0.5]])
