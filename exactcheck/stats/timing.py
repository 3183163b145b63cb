"""Times and rates measured over requests, each with its interval: what ``exactcheck cost`` reports
of a served system (``exactcheck.cost.served``). Pure numpy and scipy; nothing here sends a request.

- ``mean_interval``: the mean with Student's t interval, mean ± t(n - 1) · s / √n (the requests
  independent draws of one latency law; with few requests the t quantile widens it);
- ``median_interval``: the median with the distribution-free interval between two order
  statistics: [x_(j), x_(n+1-j)] covers the median with probability P(j ≤ B ≤ n - j), B ~ Bin(n, 1/2),
  whatever the law; j is the largest index whose coverage is still at least the confidence. Under
  6 requests no j reaches 95%, and the interval is the range, with its own coverage 1 - 2^(1-n)
  stated in ``confidence``;
- ``ratio_of_sums``: Σ num / Σ den over requests (tokens per second: tokens / seconds; a latency
  ratio: the audited server's times / the reference's, pair by pair), with a percentile bootstrap
  over requests (pairs resampled whole, so what the two requests of a pair share cancels);
- ``ratio_of_rates``: (Σ a_num / Σ a_den) / (Σ b_num / Σ b_den), the ratio of two servers' tokens
  per second, bootstrapped over pairs the same way.

A bootstrap whose resamples all give the same value (every pair with the same ratio) has that value
as both ends of its interval. Every result is an ``Estimate`` carrying its method in words.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import special, stats

__all__ = ["Estimate", "mean_interval", "median_interval", "ratio_of_sums", "ratio_of_rates", "CONFIDENCE",
           "RESAMPLES"]

CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass(frozen=True)
class Estimate:
    """A figure and its interval: ``confidence`` is the interval's coverage (for a median under 6
    requests, what the order statistics reach, below the confidence asked); NaN where the requests
    cannot give one (none, or one for an interval; None in ``to_dict``)."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str

    def to_dict(self) -> dict:
        """The fields, NaN written as None (strict JSON)."""
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "Estimate":
        return cls(**{k: _NAN if data[k] is None else data[k] for k in cls.__dataclass_fields__})


_NAN = float("nan")


def _values(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def mean_interval(x, confidence: float = CONFIDENCE) -> Estimate:
    """The mean of ``x`` with Student's t interval (module docstring)."""
    x = _values(x)
    n = x.size
    method = f"mean over {n} requests; Student's t interval"
    if n == 0:
        return Estimate(_NAN, _NAN, _NAN, confidence, method)
    mean = float(x.mean())
    if n == 1:
        return Estimate(mean, _NAN, _NAN, confidence, method)
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, confidence, method)


def median_interval(x, confidence: float = CONFIDENCE) -> Estimate:
    """The median of ``x`` with the order-statistic interval (module docstring)."""
    x = np.sort(_values(x))
    n = x.size
    if n == 0:
        return Estimate(_NAN, _NAN, _NAN, confidence, "median of no request")
    # j (1-based): the largest with P(B <= j - 1) <= (1 - confidence) / 2, so coverage 1 - 2 P(B <= j - 1)
    j = 1
    while j + 1 <= (n + 1) // 2 and float(special.bdtr(j, n, 0.5)) <= (1 - confidence) / 2:
        j += 1
    coverage = 1 - 2 * float(special.bdtr(j - 1, n, 0.5))
    return Estimate(float(np.median(x)), float(x[j - 1]), float(x[n - j]), coverage,
                    f"median over {n} requests; interval between order statistics {j} and {n + 1 - j} "
                    f"(distribution-free, coverage {coverage:.3f})")


def _bootstrap(statistic, columns: tuple[np.ndarray, ...], confidence: float, resamples: int,
               seed: int) -> tuple[float, float]:
    n = columns[0].size
    index = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        values = statistic(*(c[index] for c in columns))
    values = values[np.isfinite(values)]
    if values.size == 0:
        return _NAN, _NAN
    tail = (1 - confidence) / 2
    low, high = float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))
    if np.all(values == values[0]):  # every resample alike: no spread to estimate
        low = high = float(values[0])
    return low, high


def _sum_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return num.sum(-1) / den.sum(-1)


def ratio_of_sums(num, den, confidence: float = CONFIDENCE, resamples: int = RESAMPLES, seed: int = 0,
                  what: str = "sum / sum") -> Estimate:
    """Σ num / Σ den with a percentile bootstrap over the (num, den) pairs (module docstring)."""
    num, den = _values(num), _values(den)
    if num.size != den.size:
        raise ValueError(f"ratio_of_sums: {num.size} numerators against {den.size} denominators")
    method = f"{what} over {num.size} requests; percentile bootstrap over requests ({resamples} resamples)"
    if num.size == 0 or den.sum() == 0:
        return Estimate(_NAN, _NAN, _NAN, confidence, method)
    low, high = _bootstrap(_sum_ratio, (num, den), confidence, resamples, seed)
    return Estimate(float(num.sum() / den.sum()), low, high, confidence, method)


def ratio_of_rates(a_num, a_den, b_num, b_den, confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                   seed: int = 0, what: str = "rate / rate") -> Estimate:
    """(Σ a_num / Σ a_den) / (Σ b_num / Σ b_den), bootstrapped over pairs (module docstring)."""
    columns = tuple(_values(c) for c in (a_num, a_den, b_num, b_den))
    if len({c.size for c in columns}) != 1:
        raise ValueError("ratio_of_rates: the four columns must be paired (the same length)")
    n = columns[0].size
    method = f"{what} over {n} paired requests; percentile bootstrap over pairs ({resamples} resamples)"
    if n == 0 or columns[1].sum() == 0 or columns[2].sum() == 0:
        return Estimate(_NAN, _NAN, _NAN, confidence, method)

    def statistic(an, ad, bn, bd):
        return _sum_ratio(an, ad) / _sum_ratio(bn, bd)

    low, high = _bootstrap(statistic, columns, confidence, resamples, seed)
    estimate = float(statistic(*(c[None] for c in columns))[0])
    return Estimate(estimate, low, high, confidence, method)
