"""exactcheck.stats.rates: the test behind speculation_ran keeps its level under the null (many
simulated law/probe splits at several drafting rates, fixed seed), rejects "speculation off on the
probes" once the planned number of probes is reached, and its p-value is the smallest level that
rejects."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from exactcheck.stats.rates import fewer_positives_pvalue, rate_lower_bound, units_to_detect_off


def test_the_lower_bound_is_clopper_pearson():
    assert rate_lower_bound(0, 100, 0.05) == 0.0
    assert rate_lower_bound(10, 100, 0.05) == pytest.approx(stats.beta.ppf(0.05, 10, 91))
    assert rate_lower_bound(100, 100, 0.05) == pytest.approx(0.05 ** (1 / 100))


@pytest.mark.parametrize("rate", [0.005, 0.05, 0.3, 0.9])
def test_the_level_holds_under_the_null_with_probes_planned_from_the_law_units(rate):
    rng = np.random.default_rng(20261205)
    trials, law_units, share = 4000, 3000, 1e-3
    rejected = {0.05: 0, 0.01: 0}
    for _ in range(trials):
        k = int(rng.binomial(law_units, rate))
        n = min(units_to_detect_off(k, law_units, share) or 32, 3000)
        x = int(rng.binomial(n, rate))
        p = fewer_positives_pvalue(k, law_units, x, n)
        for level in rejected:
            rejected[level] += p <= level
    for level, count in rejected.items():
        # at most the level (a one-sided binomial bound at 1e-6 on the count of 4,000)
        assert count <= stats.binom.ppf(1 - 1e-6, trials, level), (level, count)


def test_speculation_off_is_rejected_once_the_planned_probes_are_sent():
    for k, units in ((161, 12_000), (12, 1_500), (2_000, 2_000)):
        for share in (1e-3, 1e-5):
            n = units_to_detect_off(k, units, share)
            assert fewer_positives_pvalue(k, units, 0, n) <= share
            if n > 1:
                assert fewer_positives_pvalue(k, units, 0, n - 1) > share
    assert units_to_detect_off(0, 10_000, 1e-3) is None


def test_the_pvalue_is_the_smallest_rejecting_level():
    p = fewer_positives_pvalue(161, 12_000, 0, 1000)
    r_lo = rate_lower_bound(161, 12_000, p / 2)
    assert (1 - r_lo) ** 1000 == pytest.approx(p / 2, rel=1e-6)
    assert fewer_positives_pvalue(161, 12_000, 13, 1000) == 1.0  # as many as expected: no evidence
    assert fewer_positives_pvalue(161, 12_000, 0, 32) > 0.1  # the 32 probes: no evidence
    assert math.isclose(fewer_positives_pvalue(5, 5, 5, 5), 1.0)
