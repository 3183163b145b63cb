"""Two samples, one law? The test behind a served world whose law the audit cannot compute: the audited
server's answers against the reference server's answers to the same constrained requests (speculation
off), each sample drawn independently.

The test. Each distinct outcome is a cell; cells whose two samples together hold fewer than
``MIN_POOLED`` outcomes are merged into one (and that one, if still small, into the smallest other
cell). The statistic is Pearson's X^2 of the 2 x K table. Under the null (both samples drawn from one
law) every split of the pooled outcomes into samples of these sizes is equally likely, so given the
pooled counts the first sample's counts are multivariate hypergeometric; the pooling depends only on
the pooled counts, which no split changes. The p-value is the Monte Carlo permutation p-value
(1 + #{X^2 of a split >= X^2 observed}) / (1 + B) over B splits drawn from that law: exactly valid at
every sample size (P(p <= a) <= a), with B large enough that the smallest p-value is well under the
check's alpha share.

Power. Two samples of sizes m and n compare like one sample of size mn / (m + n) against a known law:
the noncentrality of X^2 is at least 4 (mn / (m + n)) eps^2 at TV eps on the pooled cells, so the
smallest TV detectable with power 0.9 is ``goodness_of_fit.detectable_tv`` at that size (an
approximation: the permutation test's level is met exactly, its power only approximately).

TV. The plug-in TV between the two empirical laws; its interval by the Bretagnolle-Huber-Carol
inequality on each sample (the upper end on all K cells, the lower end on the pooled ones), the 5%
error split four ways.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np

from exactcheck.stats.goodness_of_fit import INTERVAL_CONFIDENCE, _bhc_radius, detectable_tv

__all__ = ["TwoSample", "two_sample_test", "MIN_POOLED"]

MIN_POOLED = 10  # outcomes of both samples together a cell holds, at least, after pooling
MAX_SPLITS = 2_000_000


@dataclass(frozen=True)
class TwoSample:
    """The test of two samples of outcomes, with its evidence."""

    statistic: float  # Pearson X^2 of the 2 x K table, pooled cells
    df: int
    pvalue: float  # the Monte Carlo permutation p-value
    splits: int  # B: the random splits drawn
    samples: tuple[int, int]
    cells: int
    pooled_cells: int
    tv_estimate: float
    tv_interval: tuple[float, float]
    detectable_tv: float
    only_first: int  # outcomes of the first sample in cells the second never reached
    example: Hashable | None  # the commonest such outcome


def _pooled(total: np.ndarray) -> np.ndarray:
    """Each cell's pooled cell (an index); small cells merged into one, and that into the smallest
    other where it is still small."""
    order = np.argsort(total, kind="stable")
    small = [int(i) for i in order if total[i] < MIN_POOLED]
    big = [int(i) for i in order if total[i] >= MIN_POOLED]
    groups = ([small] if small else []) + [[i] for i in big]
    if len(groups) > 1 and small and total[small].sum() < MIN_POOLED:
        groups = [small + groups[1]] + groups[2:]
    out = np.empty(total.size, dtype=np.int64)
    for j, members in enumerate(groups):
        out[members] = j
    return out


def _pearson(first: np.ndarray, total: np.ndarray, m: int, n: int) -> np.ndarray:
    """X^2 of the 2 x K tables whose first rows are ``first`` (..., K) and column sums ``total``."""
    second = total - first
    grand = m + n
    e1, e2 = total * (m / grand), total * (n / grand)
    return ((first - e1) ** 2 / e1).sum(axis=-1) + ((second - e2) ** 2 / e2).sum(axis=-1)


def two_sample_test(first: Sequence[Hashable], second: Sequence[Hashable], level: float,
                    seed: int = 0) -> TwoSample:
    """The test of ``first`` (the audited server's outcomes) against ``second`` (the reference's),
    at ``level`` (the check's alpha share: the splits are enough for p-values well under it);
    ``seed`` fixes the splits (the verdict reproduces)."""
    m, n = len(first), len(second)
    if m == 0 or n == 0:
        raise ValueError("two samples of at least one outcome each are needed")
    names = sorted(set(first) | set(second), key=repr)
    index = {name: i for i, name in enumerate(names)}
    a = np.bincount([index[x] for x in first], minlength=len(names)).astype(np.int64)
    b = np.bincount([index[x] for x in second], minlength=len(names)).astype(np.int64)
    tv = 0.5 * float(np.abs(a / m - b / n).sum())
    pool = _pooled(a + b)
    k = int(pool.max()) + 1
    pa, pb = np.bincount(pool, a, minlength=k).astype(np.int64), np.bincount(pool, b, minlength=k).astype(np.int64)
    total = pa + pb
    statistic = float(_pearson(pa, total, m, n)) if k > 1 else 0.0
    splits = int(min(MAX_SPLITS, max(1_000, math.ceil(20 / level))))
    if k > 1:
        rng, exceed, left = np.random.default_rng(seed), 0, splits
        while left:
            size = min(left, 100_000)
            draws = rng.multivariate_hypergeometric(total, m, size=size)
            exceed += int((_pearson(draws, total, m, n) >= statistic * (1 - 1e-12)).sum())
            left -= size
        pvalue = (1 + exceed) / (1 + splits)
    else:
        pvalue = 1.0
    error = (1 - INTERVAL_CONFIDENCE) / 4
    pooled_tv = 0.5 * float(np.abs(pa / m - pb / n).sum())
    low = max(0.0, pooled_tv - _bhc_radius(k, m, error) - _bhc_radius(k, n, error))
    high = min(1.0, tv + _bhc_radius(len(names), m, error) + _bhc_radius(len(names), n, error))
    only = np.flatnonzero((a > 0) & (b == 0))
    example = names[int(only[np.argmax(a[only])])] if only.size else None
    return TwoSample(statistic, k - 1, float(pvalue), splits if k > 1 else 0, (m, n), len(names), k, tv,
                     (low, high), detectable_tv(max(1, m * n // (m + n)), k - 1, level), int(a[only].sum()),
                     example)
