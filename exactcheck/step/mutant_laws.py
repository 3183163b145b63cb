"""The exact output law of each mutant of the corpus whose law has a closed form on a step world.

A mutant's law is what an oracle needs to know to be the best test against it
(``benchmarks/efficiency.py``: Wald's sequential probability ratio test between the exact law and
the mutant's). Each entry is written from the mutant's docstring, in float64 numpy, in the
contract of ``exactcheck.rules.Rule.emission``: for draft sequences d [D, k] with the target rows
along them p [D, k+1, V] and the draft rows q [D, k, V], (P(N = j | d) [D, k+1], the law of the
token emitted after the j accepted drafts [D, k+1, V]). ``output_law`` turns an emission into the
law of the whole step output (the j emitted drafts, then one token) over every sequence of 1 to
k + 1 tokens: the observation of one trial, nothing of it summarised.

Uniforms are taken as continuous: a float64 uniform lies on a 2^-53 grid, so a law here is the
mutant's up to about 2^-53 a draw. The worlds' laws are the float32 rows taken to float64 and
renormalised, as everywhere in exactcheck; a mutant reads the float32 rows themselves (a
difference of about 1e-7 in a probability). ``property_tests/step/test_mutant_laws.py`` checks every
law against the mutant's own samples.

Not here (``NO_LAW``, with the reason): mutants whose law is within 2^-53 (2^-24 for a float32
draw) of the exact law on every world, which only forced random numbers can tell apart (the
property search of ``exactcheck.step.properties`` finds them); a mutant whose trials are not
independent (the same uniforms at every call); one that reads uninitialised memory.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from exactcheck.rules import all_drafts, chain_law, normalised_rows, draft_ratios, block_stop_probabilities, rule_spec
from exactcheck.step import mutants as m
from exactcheck.contracts.reference_verifier import ReferenceVerifier
from exactcheck.contracts.sampling import inverse_cdf

__all__ = ["Emission", "mutant_emission", "NO_LAW", "output_law", "exact_output_law", "mutant_output_law",
           "output_cells", "sampled_law", "reference_emission", "cell_offsets"]

Emission = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


# ---- pieces shared by the laws --------------------------------------------------------------

def sampled_law(rows: np.ndarray, low: np.ndarray | None = None, high: np.ndarray | None = None) -> np.ndarray:
    """The law of the token ``exactcheck.contracts.sampling.inverse_cdf`` returns from the float64
    cumulative sums of ``rows`` [R, V] (any rows: negative entries, totals other than 1) for a
    uniform u on [low, high) (default [0, 1)). The token is a step function of u that can change
    only at a cumulative value, so evaluating the sampler at every cumulative value in the
    interval (and at its lower end) and weighting by the length of the piece that follows gives
    the law exactly, whatever the sampler does with rows that are not a law."""
    rows = np.asarray(rows, dtype=np.float64)
    count, vocab = rows.shape
    low = np.zeros(count) if low is None else np.asarray(low, dtype=np.float64)
    high = np.ones(count) if high is None else np.asarray(high, dtype=np.float64)
    out = np.zeros((count, vocab))
    unique, back = np.unique(np.concatenate([rows, low[:, None], high[:, None]], 1), axis=0, return_inverse=True)
    back = back.reshape(-1)
    cdf_all = np.cumsum(unique[:, :vocab], 1)
    for r, (row_cdf, lo, hi) in enumerate(zip(cdf_all, unique[:, vocab], unique[:, vocab + 1])):
        if not hi > lo:
            continue
        cuts = np.unique(np.concatenate([[lo], row_cdf[(row_cdf > lo) & (row_cdf < hi)]]))
        lengths = np.diff(np.concatenate([cuts, [hi]]))
        cdf = torch.from_numpy(np.tile(row_cdf, (cuts.size, 1)))
        tokens = inverse_cdf(cdf, torch.from_numpy(cuts)).numpy()
        law = np.bincount(tokens, weights=lengths, minlength=vocab)[:vocab]
        out[back == r] = law / (hi - lo)
    return out


def _law(rows: np.ndarray) -> np.ndarray:
    """Rows as the laws a verifier samples from (it normalises what it is handed)."""
    return rows / rows.sum(-1, keepdims=True)


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p_j - q_j) normalised at each draft position (p_j where it is all zero) [D, k, V]."""
    return normalised_rows(np.clip(p[:, :-1] - q, 0, None), _law(p[:, :-1]))


def _finals(corrections: np.ndarray, bonus: np.ndarray) -> np.ndarray:
    return np.concatenate([corrections, bonus[:, None]], 1)


def _token_wise(p, q, d, accept_probability=None):
    ratio, _, _ = draft_ratios(p, q, d)
    a = np.minimum(ratio, 1.0) if accept_probability is None else accept_probability
    return chain_law(a), _finals(_residual(p, q), _law(p[:, -1]))


def _one_hot(tokens: np.ndarray, vocab: int) -> np.ndarray:
    return np.eye(vocab)[tokens]


def _float32_law(rows: np.ndarray) -> np.ndarray:
    """Rows normalised in float64 and handed on in float32, as the mutants that rewrite the target
    rows do (``.to(target_probs.dtype)``), read back in float64."""
    return (rows / rows.sum(-1, keepdims=True)).astype(np.float32).astype(np.float64)


def reference_emission(p, q, d):
    """The exact token-wise law (``exactcheck.rules``), the null hypothesis of every mutant here."""
    return rule_spec("token-wise").emission(p, q, d)


# ---- one law per mutant class ------------------------------------------------------------------

def _trust_draft(mutant):
    return lambda p, q, d: _token_wise(p, q, d, np.ones(d.shape))


def _resample_from_target(mutant):
    def law(p, q, d):
        accept, _ = _token_wise(p, q, d)
        return accept, _law(p)
    return law


def _unclamped_residual(mutant):
    def law(p, q, d):
        accept, final = _token_wise(p, q, d)
        raw = p[:, :-1] - q
        positive = np.clip(raw, 0, None).sum(-1, keepdims=True)
        rows = raw / np.where(positive > 0, positive, 1.0)
        final[:, :-1] = sampled_law(rows.reshape(-1, rows.shape[-1])).reshape(rows.shape)
        return accept, final
    return law


def _wrong_normaliser(mutant):
    def law(p, q, d):
        accept, final = _token_wise(p, q, d)
        raw = p[:, :-1] - q
        rows = np.clip(raw, 0, None) / np.maximum(np.abs(raw).sum(-1, keepdims=True), 1e-300)
        final[:, :-1] = sampled_law(rows.reshape(-1, rows.shape[-1])).reshape(rows.shape)
        return accept, final
    return law


def _inverted_ratio(mutant):
    def law(p, q, d):  # u * p < q: probability min(1, q/p), and 1 where p = 0
        _, pi, qi = draft_ratios(p, q, d)
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(pi > 0, np.minimum(1.0, qi / np.where(pi > 0, pi, 1.0)), 1.0)
        return _token_wise(p, q, d, a)
    return law


def _accept_if_p_ge_q(mutant):
    def law(p, q, d):
        _, pi, qi = draft_ratios(p, q, d)
        return _token_wise(p, q, d, (pi >= qi).astype(np.float64))
    return law


def _no_stop_at_first_rejection(mutant):
    def law(p, q, d):  # N = the number of accepted positions: a Poisson-binomial count
        ratio, _, _ = draft_ratios(p, q, d)
        a = np.minimum(ratio, 1.0)
        count = np.zeros((d.shape[0], d.shape[1] + 1))
        count[:, 0] = 1.0
        for i in range(d.shape[1]):
            count[:, 1:] = count[:, 1:] * (1 - a[:, i, None]) + count[:, :-1] * a[:, i, None]
            count[:, 0] *= 1 - a[:, i]
        _, final = _token_wise(p, q, d)
        return count, final
    return law


def _bonus_from_draft(mutant):
    def law(p, q, d):
        accept, final = _token_wise(p, q, d)
        final[:, -1] = _law(q[:, -1])
        return accept, final
    return law


def _bonus_argmax(mutant):
    def law(p, q, d):
        accept, final = _token_wise(p, q, d)
        final[:, -1] = _one_hot(p[:, -1].argmax(-1), p.shape[-1])
        return accept, final
    return law


def _no_bonus_token(mutant):
    def law(p, q, d):  # all k accepted: the k drafts alone, the same output as N = k-1 then d_{k-1}
        accept, final = _token_wise(p, q, d)
        k, vocab = d.shape[1], p.shape[-1]
        rejected, complete = accept[:, k - 1], accept[:, k]
        both = rejected + complete
        mixed = rejected[:, None] * final[:, k - 1] + complete[:, None] * _one_hot(d[:, k - 1], vocab)
        final[:, k - 1] = np.where(both[:, None] > 0, mixed / np.where(both > 0, both, 1.0)[:, None], final[:, k - 1])
        accept[:, k - 1], accept[:, k] = both, 0.0
        return accept, final
    return law


def _shifted_target_rows(mutant):
    return lambda p, q, d: _token_wise(np.concatenate([p[:, 1:], p[:, -1:]], 1), q, d)


def _shared_uniforms(mutant):
    def law(p, q, d):  # the final draw reuses the uniform of the decision at the stop position
        ratio, _, _ = draft_ratios(p, q, d)
        a = np.minimum(ratio, 1.0)
        accept, final = _token_wise(p, q, d)
        k, vocab = d.shape[1], p.shape[-1]
        rejected = _residual(p, q)  # after a rejection at j: u_j ~ U[a_j, 1)
        final[:, :k] = sampled_law(rejected.reshape(-1, vocab), a.reshape(-1),
                                   np.ones(a.size)).reshape(rejected.shape)
        final[:, k] = sampled_law(_law(p[:, k]), np.zeros(d.shape[0]), a[:, k - 1])  # all accepted: u ~ U[0, a)
        return accept, final
    return law


def _ratio_in_half_precision(mutant):
    def law(p, q, d):
        _, pi, qi = draft_ratios(p, q, d)
        half = (torch.from_numpy(pi).half() / torch.from_numpy(qi).half()).double().numpy()
        return _token_wise(p, q, d, np.nan_to_num(np.clip(half, 0.0, 1.0), nan=0.0))
    return law


def _tiny_q_accepted(mutant):
    def law(p, q, d):
        ratio, _, qi = draft_ratios(p, q, d)
        return _token_wise(p, q, d, np.where(qi < 1e-6, 1.0, np.minimum(ratio, 1.0)))
    return law


def _scaled_acceptance(mutant):
    def law(p, q, d):
        ratio, _, _ = draft_ratios(p, q, d)
        return _token_wise(p, q, d, np.minimum(mutant.factor * ratio, 1.0))
    return law


def _leaky_residual(mutant):
    def law(p, q, d):
        accept, final = _token_wise(p, q, d)
        final[:, :-1] = normalised_rows(np.clip(p[:, :-1] - mutant.factor * q, 0, None), _law(p[:, :-1]))
        return accept, final
    return law


def _dropped_tail_mass(mutant):
    return lambda p, q, d: _token_wise(_float32_law(np.where(p < mutant.threshold, 0.0, p)), q, d)


def _target_temperature(mutant):
    return lambda p, q, d: _token_wise(_float32_law(p ** (1 / mutant.temperature)), q, d)


# block verification: tau = the last j >= 1 whose uniform passes its stop probability h_j

def _last_passing(h: np.ndarray) -> np.ndarray:
    """P(tau = j) [D, k+1] for independent tests passing with probabilities h_1..h_k [D, k]."""
    fail_after = np.concatenate([np.cumprod((1 - h)[:, ::-1], 1)[:, ::-1], np.ones_like(h[:, :1])], 1)
    return np.concatenate([fail_after[:, :1], h * fail_after[:, 1:]], 1)


def _block_final(p, q, weights, positions):
    """Block's row for the token after ``positions`` [k+1] (one per tau = 0..k): max(w_n p_n -
    q_n, 0) normalised at n < k (p_n if zero), p_k at n = k."""
    k = q.shape[1]
    rows = []
    for n in positions:
        if n >= k:
            rows.append(_law(p[:, k]))
        else:
            raw = np.clip(weights[:, n, None] * p[:, n] - q[:, n], 0, None)
            rows.append(normalised_rows(raw, _law(p[:, n])))
    return np.stack(rows, 1)


def _block_stop_from_current_row(mutant):
    def law(p, q, d):
        weights, stop = block_stop_probabilities(p, q, d)
        k = d.shape[1]
        h = stop[:, 1:].copy()
        for j in range(1, k):  # h_j from row j - 1 with the weight w_j
            mass = np.clip(weights[:, j, None] * p[:, j - 1] - q[:, j - 1], 0, None).sum(-1)
            denominator = mass + 1 - weights[:, j]
            with np.errstate(divide="ignore", invalid="ignore"):
                h[:, j - 1] = np.where(denominator > 0, mass / np.where(denominator > 0, denominator, 1.0), 1.0)
        return _last_passing(h), _block_final(p, q, weights, range(k + 1))
    return law


def _block_correction_at_next_position(mutant):
    def law(p, q, d):
        weights, stop = block_stop_probabilities(p, q, d)
        k = d.shape[1]
        return _last_passing(stop[:, 1:]), _block_final(p, q, weights, [min(j + 1, k) for j in range(k + 1)])
    return law


def _poisson(mean: np.ndarray, counts: int) -> np.ndarray:
    """P(X = c) for c < counts and P(X >= counts) as the last entry, X ~ Poisson(mean) [D, counts + 1]."""
    out = np.zeros(mean.shape + (counts + 1,))
    term = np.exp(-mean)
    for c in range(counts):
        out[..., c] = term
        term = term * mean / (c + 1)
    out[..., counts] = np.clip(1 - out[..., :counts].sum(-1), 0, None)
    return out


def _block_product_of_uniforms(mutant):
    """tau = the last i with w_i >= u_1 ... u_i. With S_i = -log(u_1 ... u_i), the arrival times of a
    unit Poisson process, the prefix of i passes when S_i >= t_i = -log w_i, that is when the
    process has fewer than i points in [0, t_i]. P(tau = j) = P(fewer than j points by t_j, at
    least i points by t_i for every i > j): a walk through the sorted times with Poisson
    increments, counts above k merged (no condition reads them)."""
    def law(p, q, d):
        weights, _ = block_stop_probabilities(p, q, d)
        k = d.shape[1]
        with np.errstate(divide="ignore"):
            times = -np.log(weights[:, 1:])  # inf where w = 0: that prefix never passes
        out = np.zeros((d.shape[0], k + 1))
        for j in range(k + 1):
            out[:, j] = _points_probability(times, j, k)
        return out, _block_final(p, q, weights, range(k + 1))
    return law


def _points_probability(times: np.ndarray, j: int, k: int) -> np.ndarray:
    """P(N(t_j) <= j - 1 (if j >= 1) and N(t_i) >= i for i > j) for a unit Poisson process, per row
    of times [D, k] (t_i at column i - 1; inf allowed)."""
    rows = times.shape[0]
    order = np.argsort(times, 1, kind="stable")
    state = np.zeros((rows, k + 2))  # P(count = c), c = 0..k, and c >= k + 1 merged
    state[:, 0] = 1.0
    now = np.zeros(rows)
    for step in range(k):
        index = order[:, step]
        t = np.take_along_axis(times, index[:, None], 1)[:, 0]
        finite = np.isfinite(t)
        gap = np.where(finite, t - now, 0.0)
        increments = _poisson(gap, k + 1)  # [D, k+2]
        moved = np.zeros_like(state)
        for c in range(k + 2):
            for extra in range(k + 2):
                target = min(c + extra, k + 1)
                moved[:, target] += state[:, c] * increments[:, extra]
        # at t = inf every count is unbounded: N(inf) >= i holds, N(inf) <= j - 1 fails
        moved = np.where(finite[:, None], moved, 0.0)
        moved[~finite, k + 1] = state[~finite].sum(1)
        state = moved
        now = np.where(finite, t, now)
        i = index + 1  # the prefix this time belongs to
        counts = np.arange(k + 2)[None]
        allowed = np.where((i == j)[:, None], counts <= j - 1, np.where((i > j)[:, None], counts >= i[:, None], True))
        state = state * allowed
    return state.sum(1)


def _threshold_acc_multiplied(mutant):
    def law(p, q, d):  # u < p(d) * acc, or p(d) >= single; after a rejection p without d
        _, pi, _ = draft_ratios(p, q, d)
        a = np.where(pi > 0, np.where(pi >= mutant.single, 1.0, np.minimum(1.0, pi * mutant.acc)), 0.0)
        rest = p[:, :-1].copy()
        np.put_along_axis(rest, d[..., None], 0.0, axis=-1)
        return chain_law(a), _finals(normalised_rows(rest, _law(p[:, :-1])), _law(p[:, -1]))
    return law


_LAWS: dict[type, Callable] = {
    ReferenceVerifier: lambda verifier: _token_wise,  # the exact reference, as it reads its rows
    m.TrustDraft: _trust_draft,
    m.ResampleFromTarget: _resample_from_target,
    m.UnclampedResidual: _unclamped_residual,
    m.WrongNormaliser: _wrong_normaliser,
    m.InvertedRatio: _inverted_ratio,
    m.AcceptIfTargetAtLeastDraft: _accept_if_p_ge_q,
    m.NoStopAtFirstRejection: _no_stop_at_first_rejection,
    m.BonusFromDraft: _bonus_from_draft,
    m.BonusArgmax: _bonus_argmax,
    m.NoBonusToken: _no_bonus_token,
    m.ShiftedTargetRows: _shifted_target_rows,
    m.SharedUniforms: _shared_uniforms,
    m.RatioInHalfPrecision: _ratio_in_half_precision,
    m.TinyDraftProbabilityAccepted: _tiny_q_accepted,
    m.BlockStopFromCurrentRow: _block_stop_from_current_row,
    m.BlockCorrectionAtNextPosition: _block_correction_at_next_position,
    m.BlockProductOfUniforms: _block_product_of_uniforms,
    m.ThresholdAccMultiplied: _threshold_acc_multiplied,
    m.ScaledAcceptance: _scaled_acceptance,
    m.LeakyResidual: _leaky_residual,
    m.DroppedTailMass: _dropped_tail_mass,
    m.TargetTemperature: _target_temperature,
}

_BOUNDARY = ("its law is within 2^-53 of the exact law on every world (it differs only at a uniform of "
             "exactly 0 or 1 - 2^-53): no sample size can see it; forced random numbers do")
NO_LAW: dict[type, str] = {
    m.AcceptOnEqualUniform: _BOUNDARY,
    m.UnguardedZeroResidual: _BOUNDARY,
    m.ZeroResidualToVocab: _BOUNDARY,
    m.BlockAcceptsAtZero: _BOUNDARY,
    m.ExponentialRaceNaN: ("its law is within about 2^-24 a draw of the exact law (float32 exponentials): "
                           "forced random numbers see it"),
    m.ReseededGenerator: "no law of one trial: each trial is exact, but every call repeats the same uniforms",
    m.UninitialisedUnseededRows: "reads uninitialised memory (torch.empty): its law is not defined",
}


def mutant_emission(verifier) -> Emission | None:
    """The exact law of a mutant (an instance of a class of ``exactcheck.step.mutants``, with its
    parameters), or None (``NO_LAW`` says why)."""
    law = _LAWS.get(type(verifier))
    return None if law is None else law(verifier)


# ---- the law of a whole step output ---------------------------------------------------------

def cell_offsets(k: int, vocab: int) -> np.ndarray:
    """Where the outputs of 1, 2, ..., k+1 tokens start in ``output_law``'s cells [k+2]."""
    return np.concatenate([[0], np.cumsum(vocab ** np.arange(1, k + 2, dtype=np.int64))])


def _enumerated(p: np.ndarray, q: np.ndarray):
    k, vocab = q.shape
    d = all_drafts(vocab, k)
    weight = np.prod(q[np.arange(k), d], axis=1)
    keep = weight > 0
    return d[keep], weight[keep]


def output_law(emission: Emission, p: np.ndarray, q: np.ndarray, draft_law: np.ndarray | None = None) -> np.ndarray:
    """The law of one step's output when a verifier reads target rows p [k+1, V] and draft rows q
    [k, V] and the drafts are drawn from ``draft_law`` (default q): every sequence of j drafts then
    one token, j = 0..k, at cell ``cell_offsets[j] + code`` (code: the tokens in base V, the first
    most significant)."""
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    k, vocab = q.shape
    d, weight = _enumerated(p, q if draft_law is None else np.asarray(draft_law, dtype=np.float64))
    accept, final = emission(np.broadcast_to(p, (d.shape[0], k + 1, vocab)).copy(),
                             np.broadcast_to(q, (d.shape[0], k, vocab)).copy(), d)
    offsets = cell_offsets(k, vocab)
    law = np.zeros(offsets[-1])
    for j in range(k + 1):
        head = (d[:, :j] * vocab ** np.arange(j - 1, -1, -1, dtype=np.int64)).sum(1)
        cells = offsets[j] + head[:, None] * vocab + np.arange(vocab)[None]
        mass = (weight * accept[:, j])[:, None] * final[:, j]
        law += np.bincount(cells.reshape(-1), weights=mass.reshape(-1), minlength=law.size)
    return law


def exact_output_law(world) -> np.ndarray:
    """The exact output law of a step world under token-wise verification, from the world's
    float64 law (the null hypothesis every mutant law is tested against)."""
    return output_law(reference_emission, world.target_law(), world.draft_law())


def mutant_output_law(emission: Emission, world) -> np.ndarray:
    """A mutant's output law on a step world: its decisions read the rows it is handed (the
    world's float32 rows, in float64, not renormalised: a mutant that compares p with q sees them
    so), the drafts come from the world's draft law."""
    return output_law(emission, world.target_rows.double().numpy(), world.draft_rows.double().numpy(),
                      world.draft_law())


def output_cells(outputs: torch.Tensor | np.ndarray, vocab: int) -> np.ndarray:
    """Each output row [n, k+1] (tokens then -1 padding) as its cell of ``output_law``."""
    outputs = np.asarray(outputs)
    k = outputs.shape[1] - 1
    length = (outputs >= 0).sum(1)
    powers = vocab ** np.arange(k, -1, -1, dtype=np.int64)
    code = (np.where(outputs >= 0, outputs, 0) * powers[None]).sum(1) // vocab ** (k + 1 - length)
    return cell_offsets(k, vocab)[length - 1] + code
