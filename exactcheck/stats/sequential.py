"""Anytime-valid testing: stop an audit as soon as a defect is evident, alpha intact.

The test martingale. For a law with exact cell probabilities pi over some cells and the sequence
of cells x_1, x_2, ... a subject produced, the Dirichlet-mixture likelihood ratio

    E_n = int prod_{t<=n} theta(x_t) / pi(x_t) dDirichlet(theta; A pi)
        = Gamma(A) / Gamma(A + n) * prod_i Gamma(A pi_i + N_i) / Gamma(A pi_i) / prod_i pi_i^N_i

is, for each concentration A, a nonnegative martingale with E_0 = 1 when the x_t are i.i.d. from
pi (a mixture of likelihood ratios), and so is the average over a grid of A. It depends on the
counts N only, so it can be evaluated after each batch. Ville's inequality gives
P(sup_n E_n >= 1/a) <= a under the exact law: declaring a defect the first time E_n >= 1/a,
checked as often as we like, has false-alarm probability at most a. (Ramdas, Gruenwald, Vovk &
Shafer, "Game-theoretic statistics and safe anytime-valid inference", 2023.)

Three sets of cells, one e-process. A mixture over K cells pays about (K - 1)/2 log n nats to
learn an alternative it does not know, so the same law is watched at three resolutions, each
decided from the law and the budget alone:
- the pooled cells of the fixed-budget test (cells expecting fewer than 5 samples at the budget
  merged): little to pay for a long tail of rare cells;
- the law's own cells: mass arriving where the exact law has almost none (a rejection rate going
  from 1e-7 to 2%: pooled, that cell is merged away; unpooled, two hits there are overwhelming);
- the cells sorted by probability and cut where the mass counted from the lightest cell passes
  1/2, 1/4, 1/8, ... (about log2(1 / smallest p) groups): mass moving between the head and the
  tail as a group (a temperature, a dropped tail), seen at a dimension a long tail does not have.
The e-process is the average of the three martingales, itself a test martingale on the same
observations: it costs log 3 of evidence against the best of them (``benchmarks/efficiency.py``
measures the trials to detection against the oracle SPRT that knows the defect).

Any sample on a cell of exact probability 0 is a certain defect, as in the fixed test.

The audit spends half of alpha on these e-processes (Bonferroni over the m statistical checks:
threshold 2m / alpha each) and half on the fixed-budget Pearson tests (Holm at alpha / 2) of the
checks that run to their budget, so the family-wise false-alarm rate stays <= alpha. The concentration
grid spans 1 to 10^6 (the prior's spread around pi matches deviations from about 1 down to 10^-3
per cell); averaging over it costs log(7) in log-evidence.

The looks. A world's trials come in batches whose totals double from one trial up to
``FIRST_BATCH_FRACTION`` of its budget and then grow by ``GROWTH``, and each batch is looked at in
``LOOKS_PER_BATCH`` equal parts (totals 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, ...): a gross
defect (an output the exact law never gives) is seen at the trial it happens on, a subtle one
within 1.25 times the trials it needs, and a budget of 10^6 costs about 100 looks. Looking more
often never costs alpha (Ville); it costs a look's arithmetic and a subject call per part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

from exactcheck.stats.goodness_of_fit import pooling

__all__ = ["EProcess", "batch_schedule", "dyadic_tail_groups", "CONCENTRATIONS", "FIRST_BATCH_FRACTION", "GROWTH",
           "LOOKS_PER_BATCH"]

CONCENTRATIONS = tuple(10.0 ** j for j in range(7))
FIRST_BATCH_FRACTION = 1 / 256  # the looks double from one trial up to this share of a world's budget
GROWTH = 1.5  # each batch comes after GROWTH times the samples of the one before
LOOKS_PER_BATCH = 4  # each batch of ``batch_schedule`` is looked at in this many equal parts


def batch_schedule(budget: int, first_fraction: float = FIRST_BATCH_FRACTION,
                   growth: float = GROWTH, minimum: int = 500, from_one: bool = True) -> list[int]:
    """Batch sizes summing to ``budget``: totals 1, 2, 4, ... doubling up to ``first_fraction`` of
    it (at least ``minimum``), then batches that grow the total by ``growth`` each time. Without
    ``from_one`` the first batch is that whole first share (for a subject whose every call is
    costly: a time-budgeted audit of an interpreted kernel)."""
    sizes, total = [], 0
    doubling_until = min(budget, max(minimum, int(math.ceil(budget * first_fraction))))
    step = 1 if from_one else doubling_until
    while total < budget:
        step = min(step, budget - total)
        sizes.append(step)
        total += step
        step = total if total < doubling_until else max(1, int(math.ceil(total * (growth - 1))))
    if not from_one:
        return sizes
    # every batch looked at in LOOKS_PER_BATCH parts: the looks above plus the points between
    # (looks are free under Ville; ``benchmarks/efficiency.py``: median 3.60 -> 2.90 x the oracle)
    return [size // parts + (i < size % parts) for size in sizes
            for parts in (min(LOOKS_PER_BATCH, size),) for i in range(parts)]


def first_look_schedule(budget: int, share: float, growth: float = GROWTH) -> list[int]:
    """Batch sizes summing to ``budget``: one first batch of ``share`` of it (at least 1), then
    batches that grow the total by ``growth`` each time (a schedule fixed before any trial, so
    the looks stay anytime-valid)."""
    first = min(budget, max(1, int(math.ceil(budget * share))))
    sizes, total = [first], first
    while total < budget:
        step = min(max(1, int(math.ceil(total * (growth - 1)))), budget - total)
        sizes.append(step)
        total += step
    return sizes


@dataclass
class EProcess:
    """The test martingale of one law (the average of its Dirichlet mixtures on the pooled cells,
    the law's own cells and its dyadic tail groups), looked at after each batch."""

    expected: np.ndarray  # exact law over the law's cells (float64)
    budget: int  # samples the law is expected to see at the full budget (fixes the pooling)
    groupings: tuple = ()  # more cell -> group maps the law names (coarsenings of a joint law)

    def __post_init__(self) -> None:
        self.expected = np.asarray(self.expected, dtype=np.float64)
        pooled = pooling(self.expected, max(int(self.budget), 1))
        unpooled = np.where(self.expected > 0, np.cumsum(self.expected > 0) - 1, -1)
        # the sets of cells the mixture runs on, each as (cell -> group, group probabilities); a
        # grouping's cells of probability 0 stay impossible (they are checked before any mixture)
        groups = [pooled, unpooled, dyadic_tail_groups(self.expected)]
        groups += [np.where(self.expected > 0, np.asarray(g, dtype=np.int64), -1) for g in self.groupings]
        self._partitions = [(group, np.bincount(group[group >= 0], weights=self.expected[group >= 0],
                                                 minlength=int(group.max()) + 1 if (group >= 0).any() else 0))
                            for group in groups]
        self._impossible = self.expected <= 0
        self.largest = 0.0  # the largest log E over the looks so far (E_0 = 1)

    def look(self, counts: np.ndarray) -> float:
        """log E_n for the counts so far (over the law's cells; the caller keeps them, adding
        each batch): +inf once a sample fell on an impossible cell. Records the largest."""
        current = self.log_evidence(np.asarray(counts, dtype=np.int64))
        self.largest = max(self.largest, current)
        return current

    def log_evidence(self, counts: np.ndarray) -> float:
        """log of the average of the Dirichlet-mixture martingales on the three sets of cells."""
        if counts[self._impossible].any():
            return math.inf
        n = int(counts.sum())
        if n == 0:
            return 0.0
        logs = [_mixture(group, pi, counts, n) for group, pi in self._partitions]
        return _logsumexp(logs) - math.log(len(logs))


def dyadic_tail_groups(expected: np.ndarray) -> np.ndarray:
    """Each cell's group (-1 for impossible cells): the cells sorted by probability, and the
    cumulative mass counted from the lightest cut at 1/2, 1/4, 1/8, ...: group j holds the cells
    whose cumulative mass lies in (2^-(j+1), 2^-j], relabelled 0.. in order."""
    group = np.full(expected.size, -1, dtype=np.int64)
    possible = np.flatnonzero(expected > 0)
    if possible.size == 0:
        return group
    order = possible[np.argsort(expected[possible], kind="stable")]
    mass = np.cumsum(expected[order]) / expected[possible].sum()
    level = np.floor(-np.log2(np.maximum(mass, 1e-300))).astype(np.int64)
    group[order] = np.unique(level, return_inverse=True)[1].reshape(-1)
    return group


def _mixture(group: np.ndarray, pi: np.ndarray, counts: np.ndarray, n: int) -> float:
    """log E_n of the Dirichlet mixture over the concentration grid on the cells ``group`` maps
    the law's cells to (probabilities ``pi``): 0 when there is one cell (nothing to test)."""
    if pi.size <= 1:
        return 0.0
    pooled = np.bincount(group[group >= 0], weights=counts[group >= 0], minlength=pi.size)
    seen = pooled > 0  # a cell with no sample adds gammaln(prior) - gammaln(prior) = 0
    prior = _GRID[:, None] * pi[None, seen]
    logs = (gammaln(_GRID) - gammaln(_GRID + n) + (gammaln(prior + pooled[seen]) - gammaln(prior)).sum(1)
            - float(pooled[seen] @ np.log(pi[seen])))
    return _logsumexp(logs) - math.log(_GRID.size)


_GRID = np.array(CONCENTRATIONS)


def _logsumexp(values) -> float:
    """log(sum(exp(values))) of a few finite-or-inf floats (scipy's costs 0.1 ms a call, in every
    look of every law)."""
    values = np.asarray(values, dtype=np.float64)
    top = float(values.max())
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.exp(values - top).sum()))
