"""Goodness of fit of observed counts against an exact law, TV estimates and Holm's method.

The test. Cells whose exact probability is 0 are *impossible*: one sample there is a certain
defect (p-value 0, no statistics needed). The other cells are pooled before any sample is seen:
each cell with expected count n*p_i >= 5 stands alone; the smaller ones are sorted by probability
and merged in runs until each pooled cell expects at least 5 samples (Cochran's rule). Pearson's
X^2 over the pooled cells is compared with the chi-square law with (cells - 1) degrees of
freedom. Because the pooling depends only on the exact law and n, never on the data, the
reference distribution is the usual one; the false-alarm rate this gives is measured on the
reference verifier and reported in README.

Power. Every alternative at total variation eps from the law on the pooled cells has chi-square
divergence at least 4 eps^2 (Cauchy-Schwarz), so X^2 has noncentrality at least 4 n eps^2. The
smallest TV detectable at power 0.9 is the eps whose noncentral chi-square exceeds the critical
value with probability 0.9.

TV. The plug-in estimate 1/2 sum |N_i/n - p_i| is biased upward by sampling noise. Its
interval uses the Bretagnolle-Huber-Carol inequality P(TV(p_hat, p) >= t) <= 2^K exp(-2 n t^2):
the upper end on all K cells, the lower end on the pooled cells (TV on a coarser partition never
exceeds the true TV), each at half the error. Where the law has cells of probability 0, the TV
is also at least the subject's mass z on them (TV = sup_A |q(A) - p(A)| >= q(Z) - p(Z) = z): the
lower end is then the larger of the pooled Bretagnolle-Huber-Carol bound and the one-sided
Clopper-Pearson lower bound on z from the k of n samples that fell there, each at half of the
lower end's error (Bonferroni, decided from the law alone), so k > 0 gives a lower end above 0
and the interval keeps its 95%. Laws without such cells get the interval as before.
Certificates (``tv_certificate``) add tail merging.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import optimize, special, stats

__all__ = ["GoodnessOfFit", "goodness_of_fit", "impossible_mass_lower", "pooling", "detectable_tv", "holm",
           "tv_certificate",
           "MIN_EXPECTED", "POWER", "INTERVAL_CONFIDENCE"]

MIN_EXPECTED = 5.0
POWER = 0.9
INTERVAL_CONFIDENCE = 0.95
_TINY = float(np.finfo(np.float64).tiny)


@dataclass(frozen=True)
class GoodnessOfFit:
    """Pearson's test of observed counts against an exact law, with the evidence kept."""

    statistic: float
    df: int
    pvalue: float
    samples: int
    cells: int
    pooled_cells: int
    impossible: int  # samples on cells of exact probability 0
    tv_estimate: float
    tv_interval: tuple[float, float]
    detectable_tv: float


def pooling(expected: np.ndarray, n: int, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """Pooled-cell index for every cell of positive probability (-1 for impossible cells),
    decided from the law and ``n`` alone."""
    group = np.full(expected.size, -1, dtype=np.int64)
    possible = np.flatnonzero(expected > 0)
    big = possible[expected[possible] * n >= min_expected]
    group[big] = np.arange(big.size)
    small = possible[expected[possible] * n < min_expected]
    small = small[np.argsort(expected[small], kind="stable")]
    next_group, run = big.size, 0.0
    members: list[int] = []
    for cell in small:
        members.append(cell)
        run += expected[cell] * n
        if run >= min_expected:
            group[members] = next_group
            next_group, run, members = next_group + 1, 0.0, []
    if members:  # leftover run below the minimum joins the last pooled cell (or the smallest big one)
        if next_group > big.size:
            group[members] = next_group - 1
        elif big.size:
            group[members] = group[big[np.argmin(expected[big])]]
        else:
            group[members] = 0
    return group


def detectable_tv(n: int, df: int, level: float, power: float = POWER) -> float:
    """Smallest TV (on the pooled cells) that the level-``level`` test detects with ``power``."""
    if n <= 0:
        return 1.0
    if df <= 0:  # only impossible cells can show a defect: need one hit with prob `power`
        return float(1 - (1 - power) ** (1 / n))
    critical = float(special.chdtri(df, level))  # the chi-square isf, without scipy.stats' overhead

    def shortfall(lam: float) -> float:
        # the noncentral chi-square sf (scipy.stats.ncx2.sf costs 0.15 ms a call; brentq calls it often);
        # at lam = 0 the central one
        sf = special.chdtrc(df, critical) if lam <= 0 else 1.0 - special.chndtr(critical, df, lam)
        return float(sf) - power

    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    lam = optimize.brentq(shortfall, 0.0, high, xtol=1e-6)
    return float(min(1.0, math.sqrt(lam / (4 * n))))


def _bhc_radius(cells: int, n: int, error: float) -> float:
    return math.sqrt((cells * math.log(2) + math.log(1 / error)) / (2 * n))


def tv_certificate(counts: np.ndarray, expected: np.ndarray, alpha: float) -> float:
    """An upper confidence bound on the true TV: with probability at least 1 - alpha (whatever
    the subject's law), TV(true law, expected) <= the returned value.

    Tail merging: for any set T of cells, TV(q, p) <= TV on the partition with T merged into
    one cell + p(T) (the cells of T can differ by at most min(q(T), p(T)) beyond what the merged
    cell shows). On the merged partition with K' cells the Bretagnolle-Huber-Carol inequality
    bounds the TV by the plug-in TV plus sqrt((K' ln 2 + ln(1/alpha)) / 2n). T is the set of the
    j least likely cells, j chosen to minimise p(T) + radius(K') from the exact law and n alone
    (so the choice costs no confidence). Impossible cells go into T for free."""
    counts = np.asarray(counts, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.float64)
    n = int(counts.sum())
    if n == 0:
        return 1.0
    order = np.argsort(expected, kind="stable")
    tail_mass = np.concatenate([[0.0], np.cumsum(expected[order])])[:-1]  # p(T_j), j = 0..K-1
    kept = expected.size - np.arange(expected.size)  # cells outside T_j
    cells = kept + (np.arange(expected.size) > 0)  # plus the merged tail cell when T_j is not empty
    radius = np.sqrt((cells * math.log(2) + math.log(1 / alpha)) / (2 * n))
    j = int(np.argmin(tail_mass + radius))
    tail, rest = order[:j], order[j:]
    observed = counts / n
    merged = 0.5 * (float(np.abs(observed[rest] - expected[rest]).sum())
                    + abs(float(observed[tail].sum() - expected[tail].sum())))
    return min(1.0, merged + float(tail_mass[j]) + float(radius[j]))


def impossible_mass_lower(k: int, n: int, error: float) -> float:
    """The one-sided Clopper-Pearson lower confidence bound on a binomial probability from ``k``
    successes in ``n`` trials: with probability at least 1 - ``error`` it is <= the true
    probability. 0 for k = 0; above 0 for every k > 0."""
    if k <= 0 or n <= 0:
        return 0.0
    return float(stats.beta.ppf(error, k, n - k + 1))


def goodness_of_fit(counts: np.ndarray, expected: np.ndarray, level: float,
                    power: float = POWER) -> GoodnessOfFit:
    """Test ``counts`` (int, [K]) against the exact law ``expected`` (float64, [K], sums to 1).
    ``level`` is the significance level used for the detectable TV (the check's alpha share).

    ``tv_interval`` covers the true TV with probability at least 95% (2.5% at each end). Its
    lower end is the pooled Bretagnolle-Huber-Carol bound; where the law has cells of
    probability 0 it is at least the Clopper-Pearson lower bound on the subject's mass there
    (the k of n samples that fell on them: above 0 whenever k > 0), the two sharing the lower
    end's 2.5% equally."""
    counts = np.asarray(counts, dtype=np.int64)
    expected = np.asarray(expected, dtype=np.float64)
    if counts.shape != expected.shape:
        raise ValueError(f"counts {counts.shape} and expected {expected.shape} differ in shape")
    n = int(counts.sum())
    group = pooling(expected, n)
    impossible = int(counts[group < 0].sum())
    groups = int(group.max()) + 1 if n and (group >= 0).any() else 0
    observed = np.bincount(group[group >= 0], weights=counts[group >= 0], minlength=groups)
    pooled_p = np.bincount(group[group >= 0], weights=expected[group >= 0], minlength=groups)
    df = max(groups - 1, 0)
    if n == 0:
        return GoodnessOfFit(0.0, df, 1.0, 0, counts.size, groups, 0, 0.0, (0.0, 1.0), 1.0)
    statistic = float(((observed - n * pooled_p) ** 2 / (n * pooled_p)).sum()) if df else 0.0
    # An impossible outcome is certain evidence (p = 0); a chi-square tail that underflows is
    # reported as the smallest positive double instead of 0.
    pvalue = 0.0 if impossible else (max(float(special.chdtrc(df, statistic)), _TINY) if df else 1.0)

    tv = 0.5 * float(np.abs(counts / n - expected).sum())
    tv_pooled = 0.5 * (float(np.abs(observed / n - pooled_p).sum()) + impossible / n)
    half = (1 - INTERVAL_CONFIDENCE) / 2
    high = min(1.0, tv + _bhc_radius(counts.size, n, half))
    if (expected <= 0).any():  # TV >= the subject's mass on impossible cells: bound both, half the error each
        low = max(0.0, tv_pooled - _bhc_radius(groups + 1, n, half / 2), impossible_mass_lower(impossible, n, half / 2))
    else:
        low = max(0.0, tv_pooled - _bhc_radius(groups + 1, n, half))
    return GoodnessOfFit(statistic, df, pvalue, n, counts.size, groups, impossible, tv,
                         (low, high), detectable_tv(n, df, level, power))


def holm(pvalues: Sequence[float], alpha: float, family: int | None = None) -> tuple[list[float], list[float]]:
    """Holm's step-down method over a family of ``family`` hypotheses (default: the p-values
    given), of which ``pvalues`` are the ones tested: the others count as p = 1, so they sort
    last and change nothing but the family size. Returns each tested hypothesis's adjusted
    p-value (reject when it is <= alpha; the family-wise error rate is <= alpha under any
    dependence) and the alpha share it was compared with, alpha / (family - rank)."""
    m = len(pvalues) if family is None else family
    if m < len(pvalues):
        raise ValueError(f"family ({family}) is smaller than the {len(pvalues)} p-values tested")
    order = np.argsort(np.asarray(pvalues, dtype=np.float64), kind="stable")
    adjusted, shares = [1.0] * len(pvalues), [alpha] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
        shares[i] = alpha / (m - rank)
    return adjusted, shares
