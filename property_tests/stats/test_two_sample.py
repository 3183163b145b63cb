"""The two-sample permutation test (``exactcheck.stats.two_sample``), the served audit's check where a
world's law cannot be computed (a JSON schema): its level is kept under the null at small samples,
it finds a TV well above its stated detectable one, and it names outcomes only the audited sample has."""
import numpy as np

from exactcheck.stats.two_sample import two_sample_test

P = np.array([0.45, 0.25, 0.15, 0.1, 0.04, 0.01])


def test_the_level_is_kept_under_the_null():
    rng = np.random.default_rng(0)
    pvalues = np.array([two_sample_test(list(rng.choice(6, 150, p=P)), list(rng.choice(6, 250, p=P)), 0.05,
                                        seed=i).pvalue for i in range(400)])
    # a valid p-value: P(p <= a) <= a; 400 draws, three binomial standard deviations of slack
    for level in (0.05, 0.2):
        assert (pvalues <= level).mean() <= level + 3 * np.sqrt(level * (1 - level) / 400), level


def test_a_tv_above_the_detectable_one_is_found_and_outcomes_only_the_audited_sample_has_are_named():
    rng = np.random.default_rng(1)
    q = P.copy()
    q[0], q[5] = q[0] - 0.15, q[5] + 0.15
    test = two_sample_test(list(rng.choice(6, 1500, p=q)), list(rng.choice(6, 1500, p=P)), 1e-4)
    assert test.detectable_tv < 0.15 and test.pvalue < 1e-4 and test.splits >= 200_000
    assert test.tv_interval[0] <= 0.15 <= test.tv_interval[1]
    odd = two_sample_test([("x",)] * 30 + [("a",)] * 70, [("a",)] * 100, 1e-3)
    assert odd.only_first == 30 and odd.example == ("x",) and odd.pvalue < 1e-3
    same = two_sample_test([("a",)] * 5, [("a",)] * 7, 1e-3)
    assert same.pvalue == 1.0 and same.tv_estimate == 0.0
