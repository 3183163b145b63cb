"""Anytime-valid testing: stop an audit as soon as a defect is evident, alpha intact.

The test martingale. For a law with exact cell probabilities pi (on the pooled cells the
fixed-budget test would use; the pooling depends on the law and the planned budget only) and the
sequence of cells x_1, x_2, ... a subject produced, the Dirichlet-mixture likelihood ratio

    E_n = int prod_{t<=n} theta(x_t) / pi(x_t) dDirichlet(theta; A pi)
        = Gamma(A) / Gamma(A + n) * prod_i Gamma(A pi_i + N_i) / Gamma(A pi_i) / prod_i pi_i^N_i

is, for each concentration A, a nonnegative martingale with E_0 = 1 when the x_t are i.i.d. from
pi (a mixture of likelihood ratios), and so is the average over a grid of A. It depends on the
counts N only, so it can be evaluated after each batch. Ville's inequality gives
P(sup_n E_n >= 1/a) <= a under the exact law: declaring a defect the first time E_n >= 1/a,
checked as often as we like, has false-alarm probability at most a. (Ramdas, Gruenwald, Vovk &
Shafer, "Game-theoretic statistics and safe anytime-valid inference", 2023.)

Any sample on a cell of exact probability 0 is a certain defect, as in the fixed test.

The audit spends half of alpha on these e-processes (Bonferroni over the m statistical checks:
threshold 2m / alpha each) and half on the fixed-budget Pearson tests (Holm at alpha / 2) of the
checks that run to their budget, so the family-wise false-alarm rate stays <= alpha. The concentration
grid spans 1 to 10^6 (the prior's spread around pi matches deviations from about 1 down to 10^-3
per cell); averaging over it costs log(7) in log-evidence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp

from exactcheck.stats.goodness_of_fit import pooling

__all__ = ["EProcess", "batch_schedule", "CONCENTRATIONS", "FIRST_BATCH_FRACTION", "GROWTH"]

CONCENTRATIONS = tuple(10.0 ** j for j in range(7))
FIRST_BATCH_FRACTION = 1 / 256  # the first look comes after this share of a world's budget
GROWTH = 1.5  # each look comes after GROWTH times the samples of the one before


def batch_schedule(budget: int, first_fraction: float = FIRST_BATCH_FRACTION,
                   growth: float = GROWTH, minimum: int = 500) -> list[int]:
    """Batch sizes summing to ``budget``: a first batch of ``first_fraction`` of it (at least
    ``minimum``), then batches that grow the total by ``growth`` each time."""
    sizes, total = [], 0
    step = min(budget, max(minimum, int(math.ceil(budget * first_fraction))))
    while total < budget:
        step = min(step, budget - total)
        sizes.append(step)
        total += step
        step = max(1, int(math.ceil(total * (growth - 1))))
    return sizes


@dataclass
class EProcess:
    """The Dirichlet-mixture test martingale of one law, looked at after each batch."""

    expected: np.ndarray  # exact law over the law's cells (float64)
    budget: int  # samples the law is expected to see at the full budget (fixes the pooling)

    def __post_init__(self) -> None:
        self.expected = np.asarray(self.expected, dtype=np.float64)
        self._group = pooling(self.expected, max(int(self.budget), 1))
        groups = int(self._group.max()) + 1 if (self._group >= 0).any() else 0
        self._pi = np.bincount(self._group[self._group >= 0], weights=self.expected[self._group >= 0],
                               minlength=groups)
        self._log_pi = np.log(self._pi)
        self.largest = 0.0  # the largest log E over the looks so far (E_0 = 1)

    def look(self, counts: np.ndarray) -> float:
        """log E_n for the counts so far (over the law's cells; the caller keeps them, adding
        each batch): +inf once a sample fell on an impossible cell. Records the largest."""
        current = self.log_evidence(np.asarray(counts, dtype=np.int64))
        self.largest = max(self.largest, current)
        return current

    def log_evidence(self, counts: np.ndarray) -> float:
        if counts[self._group < 0].any():
            return math.inf
        n = int(counts.sum())
        if n == 0 or self._pi.size <= 1:
            return 0.0
        pooled = np.bincount(self._group[self._group >= 0], weights=counts[self._group >= 0],
                             minlength=self._pi.size)
        plug = float(pooled @ self._log_pi)
        logs = []
        for a in CONCENTRATIONS:
            prior = a * self._pi
            logs.append(gammaln(a) - gammaln(a + n)
                        + float((gammaln(prior + pooled) - gammaln(prior)).sum()) - plug)
        return float(logsumexp(logs) - math.log(len(logs)))
