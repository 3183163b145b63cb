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

__all__ = ["PairCount", "same_cell_pairs"]


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
