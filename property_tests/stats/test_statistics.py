"""The statistics hold their stated error rates on exact multinomial samples (fixed seeds)."""
import numpy as np
import pytest
from scipy import stats

from exactcheck.stats.goodness_of_fit import MIN_EXPECTED, detectable_tv, goodness_of_fit, holm, pooling


def _binomial_band(n: int, rate: float, tail: float = 1e-4) -> tuple[int, int]:
    return int(stats.binom.ppf(tail, n, rate)), int(stats.binom.isf(tail, n, rate))


@pytest.mark.long
@pytest.mark.parametrize("cells,concentration,n", [(10, 1.0, 2_000), (1_000, 0.3, 20_000),
                                                   pytest.param(4_096, 0.2, 20_000, marks=pytest.mark.slow)])
def test_false_alarm_rate_matches_level_on_sparse_laws(cells, concentration, n):
    rng = np.random.default_rng(cells)
    law = rng.dirichlet(np.full(cells, concentration))
    runs = 2_000
    pvalues = np.array([goodness_of_fit(rng.multinomial(n, law), law, 1e-3).pvalue
                        for _ in range(runs)])
    for level in (0.01, 0.05):
        low, high = _binomial_band(runs, level)
        assert low <= (pvalues <= level).sum() <= high, (level, (pvalues <= level).mean())


def test_impossible_outcome_is_certain_evidence():
    law = np.array([0.5, 0.5, 0.0])
    gof = goodness_of_fit(np.array([500, 499, 1]), law, 1e-3)
    assert gof.pvalue == 0.0 and gof.impossible == 1


def test_pooling_is_data_free_and_reaches_min_expected():
    rng = np.random.default_rng(3)
    law = rng.dirichlet(np.full(500, 0.2))
    law[:10] = 0
    law /= law.sum()
    n = 5_000
    group = pooling(law, n)
    assert (group[law == 0] == -1).all()
    pooled = np.bincount(group[group >= 0], weights=law[group >= 0] * n)
    assert (pooled >= MIN_EXPECTED).all()


def test_power_at_the_detectable_tv():
    """A defect of exactly the stated detectable TV is found at least ~90% of the time."""
    rng = np.random.default_rng(7)
    law = rng.dirichlet(np.full(20, 1.0))
    n, level = 20_000, 1e-3
    eps = detectable_tv(n, len(law) - 1, level)
    # the least detectable alternative: mass moved in proportion to p (chi-square = 4 eps^2)
    sign = np.where(np.arange(20) < 10, 1.0, -1.0)
    shift = sign * law
    shift -= law * shift.sum()  # keep it summing to 0
    alt = law + eps * shift / (0.5 * np.abs(shift).sum())
    assert 0.5 * np.abs(alt - law).sum() == pytest.approx(eps, rel=1e-9)
    hits = sum(goodness_of_fit(rng.multinomial(n, alt), law, level).pvalue <= level
               for _ in range(400))
    assert hits >= 0.85 * 400


def test_tv_interval_covers_the_true_tv():
    rng = np.random.default_rng(11)
    law = rng.dirichlet(np.full(50, 1.0))
    alt = 0.97 * law + 0.03 * rng.dirichlet(np.full(50, 1.0))
    true_tv = 0.5 * np.abs(alt - law).sum()
    covered = 0
    for _ in range(200):
        low, high = goodness_of_fit(rng.multinomial(10_000, alt), law, 1e-3).tv_interval
        covered += low <= true_tv <= high
    assert covered >= 190


def test_holm_matches_its_definition():
    p = [0.01, 0.5, 0.0001, 0.02]
    adjusted, shares = holm(p, 0.05)
    assert adjusted == pytest.approx([0.03, 0.5, 0.0004, 0.04])
    assert shares == pytest.approx([0.05 / 3, 0.05, 0.05 / 4, 0.05 / 2])
    rng = np.random.default_rng(0)
    for _ in range(200):  # step-down rejections equal "adjusted <= alpha"
        p = list(rng.uniform(0, 0.05, size=6) ** 2)
        adjusted, _ = holm(p, 0.01)
        order = np.argsort(p)
        rejected = set()
        for rank, i in enumerate(order):
            if p[i] > 0.01 / (6 - rank):
                break
            rejected.add(i)
        assert rejected == {i for i in range(6) if adjusted[i] <= 0.01}


def test_tv_certificate_covers_the_true_tv_at_its_confidence():
    from exactcheck.stats.goodness_of_fit import tv_certificate

    rng = np.random.default_rng(13)
    law = rng.dirichlet(np.full(20, 1.0))
    alt = 0.98 * law + 0.02 * rng.dirichlet(np.full(20, 1.0))
    true_tv = 0.5 * np.abs(alt - law).sum()
    covered = sum(tv_certificate(rng.multinomial(5_000, alt), law, 0.05) >= true_tv
                  for _ in range(300))
    assert covered >= 285  # >= 95%, and BHC is conservative
