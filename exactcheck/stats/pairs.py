"""Whether several samples of one request are independent draws: the pair test behind a serve
audit's ``independent_samples`` check.

A request asking k samples (OpenAI's ``n``, llama.cpp's ``n_cmpl``) gives floor(k/2) disjoint
pairs: (0, 1), (2, 3), .... Under the null every sample is an independent draw of the law, whose
cells have probabilities p, so each pair falls in one cell with probability q = sum p**2,
independently of every other pair (no sample is in two pairs). The count of such pairs is
Binomial(pairs, q) exactly; the test is the exact two-sided binomial test (scipy's
``binomtest``, the likelihood method). Samples that share their random numbers (every sample of a
request seeded alike: llama.cpp offsets each child's seed, server-task.h ``add_child``, and vLLM
each child's, v1/engine/parallel_sampling.py) repeat each other and push the count up; samples
made to differ push it down.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["PairCount", "same_cell_pairs", "same_cell_after"]


@dataclass(frozen=True)
class PairCount:
    """Disjoint within-request pairs, how many fell in one cell, what independence gives, and the
    exact two-sided binomial p-value."""

    pairs: int
    same: int
    q: float  # the probability that two independent draws fall in one cell
    pvalue: float

    @property
    def expected(self) -> float:
        return self.pairs * self.q


def same_cell_pairs(groups: list[np.ndarray], expected: np.ndarray) -> PairCount:
    """``groups``: each request's samples as cell indices, in the order the server gave them;
    ``expected``: the cells' exact probabilities (an index past them: a cell of probability 0)."""
    p = np.asarray(expected, dtype=np.float64)
    q = min(1.0, float(np.sum(p * p)))
    pairs = same = 0
    for cells in groups:
        cells = np.asarray(cells, dtype=np.int64)
        half = cells.size // 2
        pairs += half
        same += int(np.sum(cells[0:2 * half:2] == cells[1:2 * half:2]))
    if pairs == 0:
        return PairCount(0, 0, q, 1.0)
    return PairCount(pairs, same, q, float(stats.binomtest(same, pairs, q).pvalue))


def same_cell_after(pairs: list[tuple[int, int]], expected: np.ndarray) -> PairCount:
    """Pairs (first, second) of cell indices where which requests were paired may depend on the first's
    answer (a request in flight together with the next one sent: a long answer stays in flight longer)
    but not on the second's (its answer is drawn after the pairing is decided, from its own seed). Under
    the null the second falls in the first's cell with probability p[first], independently across pairs
    (no request in two pairs): the count is Poisson-binomial with those probabilities, exactly, whatever
    the selection; the test is its exact two-sided test (the likelihood method, as ``binomtest``'s).
    ``PairCount.q``: the mean of those probabilities."""
    p = np.asarray(expected, dtype=np.float64)
    if not pairs:
        return PairCount(0, 0, min(1.0, float(np.sum(p * p))), 1.0)
    first = np.array([a for a, _ in pairs], dtype=np.int64)
    second = np.array([b for _, b in pairs], dtype=np.int64)
    chances = np.where(first < p.size, p[np.minimum(first, p.size - 1)], 0.0)
    same = int(np.sum(first == second))
    pmf = np.array([1.0])
    for c in chances:  # the Poisson-binomial law of the count, by convolution
        pmf = np.convolve(pmf, [1.0 - c, c])
    pvalue = float(min(1.0, pmf[pmf <= pmf[same] * (1 + 1e-7)].sum()))
    return PairCount(len(pairs), same, float(chances.mean()), pvalue)
