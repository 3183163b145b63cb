"""The tests a user would pick instead of exactcheck, re-implemented from their sources (decision
rules and constants only). Each returns True when it reports a problem. ``OWN_TRIALS`` is the
sample size each runs at in its own project.

Engines (field notes, section 2):
- vLLM V0/V1 ``test_rejection_sampling_approximates_target_distribution``: empirical law of the
  first emitted token on nested prefixes of 10, 100, ... up to n (100,000 in the test); passes
  when its L2 distance to the target shrinks more than 20 times as much as its mean L2 distance
  to 100 random reference laws (softmax of uniform logits);
- TensorRT-LLM: |KL(hist_spec || p) - KL(hist_plain || p)| < 0.01 on 50,000 draws, hist_plain
  from as many plain samples of p (KL taken from the histogram to p so that it stays finite when
  a rare token is unseen; the engine's test uses V = 500, where every token is seen);
- vLLM model-runner V2: Pearson chi-square of the first-token histogram (40,960 trials), cells of
  expected count < 5 merged, failing when X^2 > df + 10 sqrt(2 df).

Other testers (field notes, section 5; read in their repositories):
- amazon-science Approximately-Aligned-Decoding, ``generator_probability_smell_test/tester.py``
  (``test_generates_correct_distribution``): 1,000 samples of the whole outcome (here: one step's
  output sequence), every outcome its own cell, expected counts p + 1e-50 rescaled to n,
  ``scipy.stats.chisquare``, a failure when p < 1e-7;
- DeepSpec PR #48 (its description; the test code is not public): a chi-square of the committed
  token at every position against a float64 reference on 20,000 rounds, each assert at about 1e-9
  false-fail. Read here as Pearson per position (the token at position i given that the step
  emitted one there, its law from the rule's exact laws), cells pooled to expected counts >= 5,
  a failure when any position's p < 1e-9;
- ``pytest-stochastic`` 0.1.0 ``@distributional_test``: 10,000 samples, ``scipy.stats.chisquare``
  against the reference counts with no merging, a failure when p <= 1e-6 (its default
  significance). It has no discrete path; a user tests the first token's histogram.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from exactcheck.stats.goodness_of_fit import goodness_of_fit, pooling

__all__ = ["vllm_l2_fails", "trtllm_kl_fails", "vllm_v2_chi2_fails", "smell_test_fails", "deepspec_fails",
           "pytest_stochastic_fails", "OWN_TRIALS"]

OWN_TRIALS = {"vllm-l2": 100_000, "trtllm-kl": 50_000, "vllm-v2-chi2": 40_960, "smell-test": 1_000,
              "deepspec-chi2": 20_000, "pytest-stochastic": 10_000}


def vllm_l2_fails(first: np.ndarray, p: np.ndarray, n: int, rng: np.random.Generator) -> bool:
    vocab = p.size
    reference = torch.softmax(torch.from_numpy(rng.random((100, vocab))), -1).numpy()
    sizes = [s for s in (10 ** j for j in range(1, 12)) if s < n] + [n]
    to_target, to_reference = [], []
    for size in sizes:
        hist = np.bincount(first[:size], minlength=vocab) / size
        to_target.append(float(np.linalg.norm(p - hist)))
        to_reference.append(float(np.linalg.norm(reference - hist[None, :])) / reference.shape[0])
    target_ratio = to_target[0] / max(to_target[-1], 1e-300)
    reference_ratio = to_reference[0] / to_reference[-1]
    return not target_ratio > 20 * reference_ratio


def _kl_from(hist: np.ndarray, p: np.ndarray) -> float:
    seen = hist > 0
    with np.errstate(divide="ignore"):
        return float((hist[seen] * np.log(hist[seen] / p[seen])).sum()) if (p[seen] > 0).all() else math.inf


def trtllm_kl_fails(first: np.ndarray, p: np.ndarray, n: int, rng: np.random.Generator) -> bool:
    spec = np.bincount(first[:n], minlength=p.size) / n
    plain = rng.multinomial(n, p) / n
    return not abs(_kl_from(spec, p) - _kl_from(plain, p)) < 0.01


def vllm_v2_chi2_fails(first: np.ndarray, p: np.ndarray, n: int) -> bool:
    counts = np.bincount(first[:n], minlength=p.size)
    if (counts[p == 0] > 0).any():
        return True
    group = pooling(p, n)
    cells = int(group.max()) + 1
    observed = np.bincount(group[group >= 0], weights=counts[group >= 0], minlength=cells)
    expected = np.bincount(group[group >= 0], weights=p[group >= 0], minlength=cells) * n
    df = cells - 1
    statistic = float(((observed - expected) ** 2 / expected).sum())
    return statistic > df + 10 * math.sqrt(2 * df)


def _scipy_chisquare_p(counts: np.ndarray, law: np.ndarray, floor: float = 0.0) -> float:
    """``scipy.stats.chisquare`` with expected counts ``law`` (+ ``floor``) rescaled to the
    observed total, every cell its own (cells of expected 0 and no sample dropped)."""
    expected = law + floor
    keep = (expected > 0) | (counts > 0)
    if (counts[expected == 0] > 0).any():
        return 0.0
    expected = expected[keep] / expected[keep].sum() * counts.sum()
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return float(stats.chisquare(counts[keep], expected).pvalue)


def smell_test_fails(cells: np.ndarray, law: np.ndarray, n: int) -> bool:
    """``cells``: each trial's whole outcome as an index into ``law``."""
    return _scipy_chisquare_p(np.bincount(cells[:n], minlength=law.size), law, 1e-50) < 1e-7


def deepspec_fails(tokens: np.ndarray, position_laws: np.ndarray, n: int) -> bool:
    """``tokens`` [trials, k+1] (-1 where nothing was emitted), ``position_laws`` [k+1, V]: the
    law of the token at each position given that one was emitted there."""
    for i, law in enumerate(position_laws):
        column = tokens[:n, i]
        column = column[column >= 0]
        if column.size == 0 or law.sum() <= 0:
            continue
        if goodness_of_fit(np.bincount(column, minlength=law.size), law, 1e-9).pvalue < 1e-9:
            return True
    return False


def pytest_stochastic_fails(first: np.ndarray, p: np.ndarray, n: int) -> bool:
    return _scipy_chisquare_p(np.bincount(first[:n], minlength=p.size), p) <= 1e-6
