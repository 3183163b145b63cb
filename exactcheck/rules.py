"""The verification algorithms engines ship, one registry: each rule's exact laws, its decision at
forced uniforms, whether it is exact, its parameters and the engine source it follows.

A rule is how a verifier turns the target rows p_0..p_k, the draft rows q_0..q_{k-1} and the drafts
d_0..d_{k-1} into N accepted drafts and one more token. Everything exactcheck knows of a rule
follows from one function, ``Rule.emission``: for a batch of draft sequences, P(N = j | drafts)
and the law of the final token given N = j, exactly, in float64. From it this module derives

- the step laws of a step world (``step_laws``): the accepted length, the correction law at the
  stop position, the bonus law, and the law of the token emitted at each position;
- the law of a whole generation of a context world driven through the speculative loop
  (``loop_sequence_law``), by enumeration over draft sequences and the world's states;
- the output law's exact TV from the target (``output_tv``): zero for an exact rule (the tests check
  it by enumeration), the price of a lossy one.

``Rule.oracle`` gives the decision at a forced uniform u with the freedom an exact implementation
has (u or 1 - u, < or <=): the acceptance property of ``exactcheck.step.properties`` reads it.

Built in (``RULES``): exact ``token-wise`` (Leviathan et al.), ``target-only`` (SGLang's tree
kernel on a chain), ``block`` (Sun et al. 2024, vLLM 0.33's and SGLang's block verification);
lossy ``sglang-threshold``, ``typical``, ``synthetic``, ``fly`` and ``relaxed``. A subject declares
its rule with an ``acceptance_rule`` attribute (a name, ``NAME:param=value,...`` or a ``RuleSpec``);
the command line takes ``--rule``. Sources and formulas: docs/rules.md.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Parameter", "Rule", "RuleSpec", "RULES", "rule_spec", "declared_rule", "EXACT_RULES", "StepLaws",
           "step_laws", "step_output_law", "completion_law", "product_law", "loop_sequence_law", "reference_sequence_law", "output_tv",
           "Oracle", "LEGACY_NAMES", "reference_rows", "all_drafts", "chain_law", "normalised_rows", "draft_ratios",
           "block_stop_probabilities"]


@dataclass(frozen=True)
class Parameter:
    name: str
    default: float | None  # None: no default (the engine requires a value)
    description: str
    low: float = 0.0
    high: float = math.inf
    integer: bool = False

    def check(self, value: float) -> float:
        if not self.low <= value <= self.high:
            raise ValueError(f"{self.name} ({value}) must be in [{self.low:g}, {self.high:g}]")
        if self.integer and value != int(value):
            raise ValueError(f"{self.name} ({value}) must be an integer")
        return float(value)


@dataclass(frozen=True)
class Oracle:
    """A rule's decision at forced uniforms, on a batch of rows. ``thresholds`` [B, m] float64: a
    test passes when u < threshold (an exact implementation may also use <=, or 1 - u; a uniform
    within the tie margin of a threshold is not judged). ``decide(passes [B, m] bool) -> [B]``:
    the accepted count; ``relevant(accepted [B]) -> [B, m] bool``: the tests the decision read
    (a tie there makes the row not judged). ``described``: the per-draft quantity in messages."""

    thresholds: np.ndarray
    decide: Callable[[np.ndarray], np.ndarray]
    relevant: Callable[[np.ndarray], np.ndarray]
    described: str


def _leading(passes: np.ndarray) -> np.ndarray:
    return np.cumprod(passes, axis=1).sum(1)


def _up_to_first_failure(accepted: np.ndarray, m: int) -> np.ndarray:
    return np.arange(m)[None] <= np.minimum(accepted, m - 1)[:, None]


def normalised_rows(rows: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Rows over the last axis normalised; a row of zero mass is replaced by ``fallback``."""
    mass = rows.sum(-1, keepdims=True)
    return np.where(mass > 0, rows / np.where(mass > 0, mass, 1.0), fallback)


def _gather(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """rows [D, k, V], tokens [D, k] -> rows[d, i, tokens[d, i]]."""
    return np.take_along_axis(rows, tokens[..., None], axis=-1)[..., 0]


def _one_hot_argmax(rows: np.ndarray) -> np.ndarray:
    out = np.zeros_like(rows)
    np.put_along_axis(out, rows.argmax(-1)[..., None], 1.0, axis=-1)
    return out


@dataclass(frozen=True)
class Rule:
    """One verification algorithm. Subclasses give ``emission`` and ``oracle``."""

    name: str
    title: str
    source: str  # the engine file and release it follows
    exact: bool  # exact at every parameter value
    parameters: tuple[Parameter, ...] = ()
    greedy: bool = False  # its reference is the greedy target (argmax), not sampling from p
    formula: str = ""  # the rule in one line, for ``exactcheck rules``

    @property
    def noun(self) -> str:
        """What the rule is called in a sentence ("block verification")."""
        return self.title.split(" (")[0]

    def exact_at(self, values: dict) -> bool:
        """Whether the rule is exact at these parameter values."""
        return self.exact

    def emission(self, p: np.ndarray, q: np.ndarray, d: np.ndarray, values: dict) -> tuple[np.ndarray, np.ndarray]:
        """For draft sequences ``d`` [D, k] with the target rows along them ``p`` [D, k+1, V] and
        the draft rows ``q`` [D, k, V]: (P(N = j | d) [D, k+1], law of the final token given
        N = j and d [D, k+1, V]), float64."""
        raise NotImplementedError

    def oracle(self, p: np.ndarray, q: np.ndarray, d: np.ndarray, values: dict) -> Oracle | None:
        """The decision at forced uniforms for rows p [B, k+1, V], q [B, k, V] and drafts d
        [B, k] (float64, normalised); None if the rule's decisions are not set by uniforms this
        audit can force."""
        return None

    def chain_parts(self, p: np.ndarray, q: np.ndarray, values: dict) -> tuple[np.ndarray, np.ndarray] | None:
        """For a rule whose acceptance at each position does not depend on the others, on a step
        world (rows p [k+1, V], q [k, V]): (acceptance probability per position [k], unnormalised
        correction law per position [k, V]) in closed form; None: laws by enumeration."""
        return None


def draft_ratios(p, q, d):
    """p_i(d_i) / q_i(d_i) at each draft (inf where q = 0)."""
    pi, qi = _gather(p[:, :-1], d), _gather(q, d)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(qi > 0, pi / np.where(qi > 0, qi, 1.0), np.inf), pi, qi


def chain_law(accept_prob: np.ndarray) -> np.ndarray:
    """P(N = j) [D, k+1] for independent per-position acceptance probabilities [D, k]."""
    reach = np.concatenate([np.ones_like(accept_prob[:, :1]), np.cumprod(accept_prob, 1)], 1)
    return reach * np.concatenate([1 - accept_prob, np.ones_like(accept_prob[:, :1])], 1)


class TokenWise(Rule):
    def chain_parts(self, p, q, values):
        return np.minimum(p[:-1], q).sum(1), np.clip(p[:-1] - q, 0, None)

    def emission(self, p, q, d, values):
        ratio, _, _ = draft_ratios(p, q, d)
        accept = chain_law(np.minimum(ratio, 1.0))
        final = np.concatenate([normalised_rows(np.clip(p[:, :-1] - q, 0, None), p[:, :-1]), p[:, -1:]], 1)
        return accept, final

    def oracle(self, p, q, d, values):
        ratio, _, _ = draft_ratios(p, q, d)
        k = d.shape[1]
        return Oracle(ratio, _leading, lambda accepted: _up_to_first_failure(accepted, k), "p/q")


class TargetOnly(Rule):
    def chain_parts(self, p, q, values):
        # x ~ q is rejected with probability 1 - p(x), then y != x drawn from p / (1 - p(x)):
        # summed over x, the correction has mass p(y) (1 - q(y))
        return (p[:-1] * q).sum(1), p[:-1] * (1 - q)

    def _accept(self, pi, values):
        return pi

    def emission(self, p, q, d, values):
        _, pi, _ = draft_ratios(p, q, d)
        rest = p[:, :-1].copy()  # after a rejection: p without the rejected draft
        np.put_along_axis(rest, d[..., None], 0.0, axis=-1)
        return chain_law(self._accept(pi, values)), np.concatenate([normalised_rows(rest, p[:, :-1]), p[:, -1:]], 1)

    def oracle(self, p, q, d, values):
        _, pi, _ = draft_ratios(p, q, d)
        k = d.shape[1]
        return Oracle(pi, _leading, lambda accepted: _up_to_first_failure(accepted, k), "p")


def block_stop_probabilities(p, q, d) -> tuple[np.ndarray, np.ndarray]:
    """Block verification's prefix weights w_j (j = 0..k: w_0 = 1, w_{j+1} = min(1, w_j
    p_j(d_j) / q_j(d_j))) and stop probabilities h_j = R_j / (R_j + 1 - w_j) with
    R_j = sum_x max(w_j p_j(x) - q_j(x), 0) over row j (h = 1 where the denominator is 0; it
    is never the last to pass then), h_k = w_k. Shapes [D, k+1]."""
    ratio, _, _ = draft_ratios(p, q, d)
    k = d.shape[1]
    weights = np.ones((d.shape[0], k + 1))
    for j in range(k):
        weights[:, j + 1] = np.minimum(1.0, weights[:, j] * ratio[:, j])
    residual = np.clip(weights[:, :k, None] * p[:, :k] - q, 0, None).sum(-1)
    denominator = residual + 1 - weights[:, :k]
    with np.errstate(divide="ignore", invalid="ignore"):
        stop = np.where(denominator > 0, residual / np.where(denominator > 0, denominator, 1.0), 1.0)
    stop = np.concatenate([stop, weights[:, k:]], 1)
    stop[:, 0] = 1.0  # tau = 0 when no later position passes
    return weights, stop


class Block(Rule):
    def emission(self, p, q, d, values):
        weights, stop = block_stop_probabilities(p, q, d)
        k = d.shape[1]
        later = np.concatenate([np.cumprod((1 - stop)[:, :0:-1], 1)[:, ::-1], np.ones_like(stop[:, :1])], 1)
        accept = stop * later  # tau = j: the last j whose u_j passes h_j
        raw = np.clip(weights[:, :k, None] * p[:, :k] - q, 0, None)
        return accept, np.concatenate([normalised_rows(raw, p[:, :k]), p[:, k:]], 1)

    def oracle(self, p, q, d, values):
        _, stop = block_stop_probabilities(p, q, d)
        m = stop.shape[1] - 1

        def decide(passes):  # tau = the last j >= 1 whose test passes, else 0
            index = np.arange(1, m + 1)[None]
            return np.where(passes, index, 0).max(1)

        return Oracle(stop[:, 1:], decide, lambda accepted: np.ones((accepted.size, m), dtype=bool),
                      "h (block stop probability)")


class SglangThreshold(TargetOnly):
    """SGLang's target-only verification with its two thresholds, on a chain (one sibling per
    depth): accept d if p(d) > 0 and (u < p(d) / t_acc or p(d) >= t_single); after a rejection,
    draw from p without d (as target-only); the bonus from p."""

    def exact_at(self, values):
        return values["single"] >= 1.0 and values["acc"] >= 1.0

    def chain_parts(self, p, q, values):
        return None  # the thresholds make acceptance depend on p(d) itself: by enumeration

    def _accept(self, pi, values):
        forced = (pi >= values["single"]) & (pi > 0)
        return np.where(forced, 1.0, np.minimum(1.0, pi / max(values["acc"], 1e-9))) * (pi > 0)

    def oracle(self, p, q, d, values):
        _, pi, _ = draft_ratios(p, q, d)
        k = d.shape[1]
        threshold = np.where((pi >= values["single"]) & (pi > 0), 2.0, np.where(pi > 0, pi / max(values["acc"], 1e-9), -1.0))
        return Oracle(threshold, _leading, lambda accepted: _up_to_first_failure(accepted, k),
                      "p / threshold_acc (2 where p >= threshold_single)")


def typical_threshold(p_rows: np.ndarray, values: dict) -> np.ndarray:
    """vLLM V0's typical-acceptance threshold min(epsilon, delta exp(-H)) per row, with the entropy
    H = -sum p log(p + 1e-5) in nats."""
    entropy = -(p_rows * np.log(p_rows + 1e-5)).sum(-1)
    return np.minimum(values["posterior_threshold"], values["posterior_alpha"] * np.exp(-entropy))


class Typical(Rule):
    """Accept d_i iff p_i(d_i) > min(epsilon, delta exp(-H(p_i))) (deterministic); the first
    rejected position emits the target's argmax; the bonus is sampled from p (vLLM V0), or, with
    ``argmax_bonus=1``, is the argmax too (Medusa, whose next token is always argmax p)."""

    def _accept(self, p, d, values):
        pi = _gather(p[:, :-1], d)
        return (pi > typical_threshold(p[:, :-1], values)).astype(np.float64)

    def emission(self, p, q, d, values):
        accept = chain_law(self._accept(p, d, values))
        bonus = _one_hot_argmax(p[:, -1:]) if values.get("argmax_bonus") else p[:, -1:]
        return accept, np.concatenate([_one_hot_argmax(p[:, :-1]), bonus], 1)

    def oracle(self, p, q, d, values):
        k = d.shape[1]
        threshold = np.where(self._accept(p, d, values) > 0, 2.0, -1.0)  # no uniform: decided by p alone
        return Oracle(threshold, _leading, lambda accepted: _up_to_first_failure(accepted, k),
                      "typical-acceptance decision (2 accept, -1 reject)")


class Synthetic(Rule):
    """vLLM's benchmarking mode: accept each draft with a fixed conditional rate, whatever p and
    q; after a rejection, a draw from the residual max(p - q, 0); the bonus from p."""

    def emission(self, p, q, d, values):
        rate = np.full(d.shape, values["rate"])
        accept = chain_law(rate)
        final = np.concatenate([normalised_rows(np.clip(p[:, :-1] - q, 0, None), p[:, :-1]), p[:, -1:]], 1)
        return accept, final

    def oracle(self, p, q, d, values):
        k = d.shape[1]
        return Oracle(np.full(d.shape, values["rate"]), _leading,
                      lambda accepted: _up_to_first_failure(accepted, k), "the synthetic rate")


def top_entropy(p_rows: np.ndarray, top: int) -> np.ndarray:
    """-sum p log p over the ``top`` largest (unrenormalised) probabilities of each row, nats."""
    largest = -np.sort(-p_rows, axis=-1)[..., :top]
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(largest > 0, largest * np.log(np.where(largest > 0, largest, 1.0)), 0.0).sum(-1)


class Fly(Rule):
    """vLLM 0.33's FLy: the native token-wise decisions a_i (u_i < p/q), except that a rejection at
    i is deferred when p(d_i) > 0, q(d_i) > 0, i + W < k and the top-K entropy of p_i is at least
    theta: if the next W native decisions all accept, d_i..d_{i+W} are accepted and verification
    goes on after them; else it stops at i. After a final rejection, a draw from max(p - q, 0) at
    that position; the bonus from p."""

    def _window(self, k: int, values: dict) -> int:
        return int(values["window"]) if values.get("window") else min(6, k - 1)

    def _deferrable(self, p, q, d, values):
        _, pi, qi = draft_ratios(p, q, d)
        k = d.shape[1]
        window = self._window(k, values)
        entropy = top_entropy(p[:, :-1], int(values["top_k"]))
        position = np.arange(k)[None]
        # a window of at least one draft (vLLM refuses FLy with fewer than 2 drafts: then none)
        return ((window >= 1) & (pi > 0) & (qi > 0) & (position + window < k)
                & (entropy >= values["entropy_threshold"])), window

    @staticmethod
    def _accepted(native: np.ndarray, deferrable: np.ndarray, window: int) -> np.ndarray:
        """The FLy state machine on native decisions [D, k] -> accepted counts [D]: walk the
        drafts; a native acceptance moves on; a deferrable rejection at i whose next ``window``
        native decisions all accept moves past them; any other rejection stops at i."""
        rows_total, k = native.shape
        position = np.zeros(rows_total, dtype=np.int64)
        stopped = np.zeros(rows_total, dtype=bool)
        offsets = np.arange(1, window + 1)
        while True:
            live = np.flatnonzero(~stopped & (position < k))
            if not live.size:
                return position
            at = position[live]
            ok = native[live, at]
            position[live[ok]] += 1
            rejected, at = live[~ok], at[~ok]
            ahead = np.minimum(at[:, None] + offsets[None], k - 1)
            window_accepts = native[rejected[:, None], ahead].all(1) if window else np.ones(rejected.size, bool)
            over = deferrable[rejected, at] & window_accepts
            position[rejected[over]] = at[over] + window + 1
            stopped[rejected[~over]] = True

    def emission(self, p, q, d, values):
        ratio, _, _ = draft_ratios(p, q, d)
        a = np.minimum(ratio, 1.0)
        deferrable, window = self._deferrable(p, q, d, values)
        k = d.shape[1]
        accept = np.zeros((d.shape[0], k + 1))
        for pattern in itertools.product((False, True), repeat=k):
            native = np.broadcast_to(np.array(pattern), d.shape)
            prob = np.prod(np.where(native, a, 1 - a), axis=1)
            count = self._accepted(native, deferrable, window)
            np.add.at(accept, (np.arange(d.shape[0]), count), prob)
        final = np.concatenate([normalised_rows(np.clip(p[:, :-1] - q, 0, None), p[:, :-1]), p[:, -1:]], 1)
        return accept, final

    def oracle(self, p, q, d, values):
        ratio, _, _ = draft_ratios(p, q, d)
        deferrable, window = self._deferrable(p, q, d, values)
        k = d.shape[1]
        return Oracle(ratio, lambda passes: self._accepted(passes, deferrable, window),
                      lambda accepted: np.ones((accepted.size, k), dtype=bool), "p/q (FLy deferrals)")


class Relaxed(Rule):
    """TensorRT-LLM's MTP relaxed acceptance (greedy): accept d_i iff it is among the target's top
    ``topk`` tokens and p_i(d_i) >= max p_i - delta; the first rejected position and the bonus emit
    the target's argmax. Its reference is the greedy target."""

    def _accept(self, p, d, values):
        rows = p[:, :-1]
        pi = _gather(rows, d)
        rank = (rows > pi[..., None]).sum(-1)  # tokens strictly more likely than d_i
        return ((rank < int(values["topk"])) & (pi >= rows.max(-1) - values["delta"])).astype(np.float64)

    def exact_at(self, values):
        # top-1 with no slack accepts the argmax only: greedy decoding itself (ties aside)
        return int(values["topk"]) == 1 and values["delta"] == 0

    def emission(self, p, q, d, values):
        return chain_law(self._accept(p, d, values)), _one_hot_argmax(p)

    def oracle(self, p, q, d, values):
        k = d.shape[1]
        threshold = np.where(self._accept(p, d, values) > 0, 2.0, -1.0)
        return Oracle(threshold, _leading, lambda accepted: _up_to_first_failure(accepted, k),
                      "relaxed-acceptance decision (2 accept, -1 reject)")


_V033 = "vLLM 0.33.0"
RULES: dict[str, Rule] = {rule.name: rule for rule in (
    TokenWise("token-wise", "token-wise rejection sampling (Leviathan et al. 2023)",
              f"{_V033} vllm/v1/sample/rejection_sampler.py; transformers _speculative_sampling; SGLang 0.5.23 "
              "kernels/ops/speculative/reject_sampling.py", True,
              formula="accept d_i with probability min(1, p_i(d_i)/q_i(d_i)); after a rejection draw from "
                      "max(p_j - q_j, 0) normalised; bonus from p_k"),
    TargetOnly("target-only", "target-only verification (SGLang's tree kernel on a chain)",
               "SGLang 0.5.23 sgl_kernel/speculative/sampling.cuh (TreeSpeculativeSamplingTargetOnly)", True,
               formula="accept d_i with probability p_i(d_i), whatever q; after a rejection draw from p_j "
                       "without d_j; bonus from p_k"),
    Block("block", "block verification (Sun et al. 2024, arXiv 2403.10444)",
          f"{_V033} vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py (rejection_sample_method="
          "'block'); SGLang 0.5.23 reject_sampling.py (--speculative-use-block-verification)", True,
          formula="w_0 = 1, w_{j+1} = min(1, w_j p_j(d_j)/q_j(d_j)); h_j = R_j/(R_j + 1 - w_j), R_j = "
                  "sum max(w_j p_j - q_j, 0), h_k = w_k; tau = last j with u_j <= h_j; then draw from "
                  "max(w_tau p_tau - q_tau, 0) normalised (bonus p_k at tau = k)"),
    SglangThreshold("sglang-threshold", "SGLang's acceptance thresholds (target-only verification)",
                    "SGLang 0.5.23 sgl_kernel/speculative/sampling.cuh; server_args "
                    "speculative_accept_threshold_single / _acc", False,
                    (Parameter("single", 1.0, "speculative_accept_threshold_single: accept if p(d) >= this", 0, 1),
                     Parameter("acc", 1.0, "speculative_accept_threshold_acc: accept if u < p(d)/this", 1e-9, 1)),
                    formula="accept d if p(d) > 0 and (u < p(d)/acc or p(d) >= single); after a rejection "
                            "draw from p without d; exact at single = acc = 1"),
    Typical("typical", "typical acceptance (Medusa; vLLM V0 TypicalAcceptanceSampler)",
            "vLLM 0.6.6 vllm/model_executor/layers/typical_acceptance_sampler.py; FasterDecoding/Medusa "
            "medusa/model/utils.py@e2a5d20", False,
            (Parameter("posterior_threshold", 0.09, "epsilon: the hard threshold", 0, 1),
             Parameter("posterior_alpha", 0.3, "delta: the entropy-scaled threshold's factor", 0, 1),
             Parameter("argmax_bonus", 0, "1: the bonus is argmax p (Medusa); 0: drawn from p (vLLM V0)", 0, 1,
                       integer=True)),
            formula="accept d_i iff p_i(d_i) > min(epsilon, delta exp(-H(p_i))), H = -sum p log(p + 1e-5); "
                    "the first rejected position emits argmax p; bonus from p (vLLM V0) or argmax p "
                    "(argmax_bonus=1, Medusa)"),
    Synthetic("synthetic", "synthetic acceptance (vLLM's benchmarking mode)",
              f"{_V033} rejection_sampler_utils.py / v1/sample/rejection_sampler.py (rejection_sample_method="
              "'synthetic')", False,
              (Parameter("rate", None, "conditional acceptance rate per draft (synthetic_acceptance_rates "
                                       "[c, c^2, ...])", 0, 1),),
              formula="accept each draft with probability rate, whatever p and q; after a rejection draw "
                      "from max(p - q, 0); bonus from p"),
    Fly("fly", "FLy deferred rejection (vLLM 0.33)",
        f"{_V033} vllm/v1/spec_decode/fly.py (rejection_sample_method='fly')", False,
        (Parameter("window", 0, "fly_window_size W (0: min(6, k - 1))", 0, 64, integer=True),
         Parameter("entropy_threshold", 0.3, "fly_entropy_threshold theta (nats)", 0),
         Parameter("top_k", 3, "fly_entropy_top_k: tokens in the entropy", 1, 1 << 20, integer=True)),
        formula="token-wise decisions, but a rejection at i with top-K entropy >= theta is overridden when "
                "the next W native decisions accept"),
    Relaxed("relaxed", "relaxed acceptance (TensorRT-LLM MTP, greedy)",
            "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/mtp.py@23ee85ee, mtpKernels.cu@b35ac1b6", False,
            (Parameter("topk", 1, "relaxed_topk", 1, 1 << 20, integer=True),
             Parameter("delta", 0.0, "relaxed_delta", 0, 1)), greedy=True,
            formula="accept d_i iff d_i is in the target's top-topk and p_i(d_i) >= max p_i - delta; the "
                    "first rejected position and the bonus emit argmax p; reference: greedy"),
)}
EXACT_RULES = tuple(name for name, rule in RULES.items() if rule.exact)
# the values subjects declared before the registry existed (``AcceptanceRule``)
LEGACY_NAMES = {"min(1, p/q)": "token-wise", "p (target only)": "target-only", "leviathan": "token-wise"}


@dataclass(frozen=True)
class RuleSpec:
    """A rule with its parameter values: what a subject declares."""

    rule: Rule
    values: tuple[tuple[str, float], ...] = ()

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def settings(self) -> dict:
        return dict(self.values)

    @property
    def exact(self) -> bool:
        return self.rule.exact_at(self.settings)

    @property
    def label(self) -> str:
        """``NAME`` or ``NAME:param=value,...`` (parameters that differ from the defaults)."""
        changed = [(k, v) for k, v in self.values
                   if v != next(p.default for p in self.rule.parameters if p.name == k)]
        return self.name + (":" + ",".join(f"{k}={v:g}" for k, v in changed) if changed else "")

    def emission(self, p, q, d):
        return self.rule.emission(p, q, d, self.settings)

    def oracle(self, p, q, d):
        return self.rule.oracle(p, q, d, self.settings)


def rule_spec(spec: "str | RuleSpec | Rule", **overrides) -> RuleSpec:
    """A ``RuleSpec`` from ``NAME`` or ``NAME:param=value,...`` (or a legacy value); ValueError
    naming the rule, the parameter or the value that is wrong."""
    if isinstance(spec, RuleSpec) and not overrides:
        return spec
    if isinstance(spec, Rule):
        spec = spec.name
    if isinstance(spec, RuleSpec):
        name, given = spec.name, dict(spec.values)
    else:
        spec = str(getattr(spec, "value", spec)).strip()
        name, _, rest = spec.partition(":")
        name = LEGACY_NAMES.get(spec, LEGACY_NAMES.get(name, name))
        given = {}
        for part in filter(None, (s.strip() for s in rest.split(","))):
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"rule {spec!r}: expected NAME:param=value,... (got {part!r})")
            try:
                given[key.strip()] = float(value)
            except ValueError:
                raise ValueError(f"rule {spec!r}: {key.strip()} ({value!r}) is not a number") from None
    if name not in RULES:
        raise ValueError(f"unknown rule {name!r}; known: {', '.join(RULES)}")
    rule = RULES[name]
    given.update(overrides)
    known = {p.name for p in rule.parameters}
    unknown = set(given) - known
    if unknown:
        raise ValueError(f"rule {name}: unknown parameter(s) {sorted(unknown)}; it takes "
                         f"{', '.join(sorted(known)) or 'none'}")
    values = []
    for parameter in rule.parameters:
        value = given.get(parameter.name, parameter.default)
        if value is None:
            raise ValueError(f"rule {name}: {parameter.name} has no default; give {name}:{parameter.name}=VALUE")
        values.append((parameter.name, parameter.check(value)))
    return RuleSpec(rule, tuple(values))


def declared_rule(subject) -> RuleSpec | None:
    """The rule a subject declares with an ``acceptance_rule`` attribute, or None (undeclared)."""
    declared = getattr(subject, "acceptance_rule", None)
    return None if declared is None else rule_spec(declared)


# ---- laws ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepLaws:
    """A rule's exact laws on a step world (float64)."""

    accepted: np.ndarray  # [k+1]: P(N = j)
    correction: np.ndarray  # [k, V]: P(N = j, final token = y), j < k
    bonus: np.ndarray  # [V]: law of the final token given N = k (zeros if P(N = k) = 0)
    # [k+1, V]: P(the token at position i is x and N >= i); None where the laws came in closed form
    emitted: np.ndarray | None = None


def all_drafts(vocab: int, k: int) -> np.ndarray:
    """Every draft sequence of length k [V^k, k], earlier drafts more significant."""
    return np.stack(np.unravel_index(np.arange(vocab ** k), (vocab,) * k), 1).astype(np.int64)


def reference_rows(rows: np.ndarray, greedy: bool) -> np.ndarray:
    """The law an exact verifier of this kind emits from target rows: the rows themselves, or their
    argmax (a greedy rule's reference)."""
    return _one_hot_argmax(np.asarray(rows, dtype=np.float64)) if greedy else rows


def _enumerate(spec: RuleSpec, p: np.ndarray, q: np.ndarray):
    """Every draft sequence with positive probability on a step world: (d [D, k], its probability
    [D], P(N = j, d) [D, k+1], law of the final token given N = j and d [D, k+1, V])."""
    k, vocab = q.shape
    d = all_drafts(vocab, k)
    weight = np.prod(q[np.arange(k), d], axis=1)
    d, weight = d[weight > 0], weight[weight > 0]
    accept, final = spec.emission(np.broadcast_to(p, (d.shape[0], k + 1, vocab)),
                                  np.broadcast_to(q, (d.shape[0], k, vocab)), d)
    return d, weight, weight[:, None] * accept, final


def _closed_form(spec: RuleSpec, p: np.ndarray, q: np.ndarray) -> StepLaws | None:
    parts = spec.rule.chain_parts(p, q, spec.settings)
    if parts is None:
        return None
    beta, raw = parts
    reach = np.concatenate([[1.0], np.cumprod(beta)])
    accepted = np.clip(reach * np.concatenate([1 - beta, [1.0]]), 0, 1)
    mass = raw.sum(1, keepdims=True)
    residual = np.where(mass > 0, raw / np.where(mass > 0, mass, 1), p[:-1])
    return StepLaws(accepted, accepted[:-1, None] * residual, p[-1])


@functools.lru_cache(maxsize=256)
def _step_laws_cached(spec: RuleSpec, p_bytes: bytes, q_bytes: bytes, k: int, vocab: int,
                      enumerated: bool) -> StepLaws:
    p = np.frombuffer(p_bytes).reshape(k + 1, vocab)
    q = np.frombuffer(q_bytes).reshape(k, vocab)
    if not enumerated:
        closed = _closed_form(spec, p, q)
        if closed is not None:
            return closed
    d, _, joint, final = _enumerate(spec, p, q)
    accepted = joint.sum(0)
    correction = np.einsum("dj,djv->jv", joint[:, :k], final[:, :k])
    bonus = np.einsum("d,dv->v", joint[:, k], final[:, k]) / accepted[k] if accepted[k] > 0 else np.zeros(vocab)
    emitted = np.zeros((k + 1, vocab))
    beyond = np.cumsum(joint[:, ::-1], 1)[:, ::-1]  # P(N >= j, d)
    for i in range(k + 1):
        emitted[i] = np.einsum("d,dv->v", joint[:, i], final[:, i])
        if i < k:  # accepted past i: the draft itself is the token at i
            np.add.at(emitted[i], d[:, i], beyond[:, i + 1])
    return StepLaws(accepted, correction, bonus, emitted)


def step_laws(spec: RuleSpec, p: np.ndarray, q: np.ndarray, enumerated: bool = False) -> StepLaws:
    """The exact laws of ``spec`` on a step world with target rows ``p`` [k+1, V] and draft rows
    ``q`` [k, V]: in closed form where the rule has one (token-wise, target-only), else, or with
    ``enumerated``, by enumeration over every draft sequence (V^k of them)."""
    p, q = _rows(p, q)
    return _step_laws_cached(spec, p.tobytes(), q.tobytes(), q.shape[0], p.shape[1], enumerated)


def _rows(p, q):
    p = np.ascontiguousarray(p, dtype=np.float64)
    q = np.ascontiguousarray(q, dtype=np.float64)
    if q.shape[0] == 0 or p.shape[0] != q.shape[0] + 1:
        raise ValueError(f"a step world has k >= 1 draft rows and k + 1 target rows (got {q.shape[0]}, {p.shape[0]})")
    return p, q


def _codes(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Each row of tokens [M, j] as one number in base V (the first token most significant)."""
    return (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1, dtype=np.int64)).sum(1)


def step_output_law(spec: RuleSpec, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The exact joint law of (N, the first emitted token, the last emitted token) of one step,
    [(k+1) V V] at cell (N V + first) V + last: the accepted length, the draft it starts with and
    the correction or bonus, together (at N = 0 the first token is the last). One law where the
    accepted length, the correction and the first token are three: a defect that moves mass
    between them (a block rule reading the wrong row, dropped tail mass) shows at their joint KL,
    not only at each marginal's; and a subject must fit one rule on all of them at once."""
    p, q = _rows(p, q)
    return _step_output_law_cached(spec, p.tobytes(), q.tobytes(), q.shape[0], p.shape[1])


@functools.lru_cache(maxsize=256)
def _step_output_law_cached(spec: RuleSpec, p_bytes: bytes, q_bytes: bytes, k: int, vocab: int) -> np.ndarray:
    p = np.frombuffer(p_bytes).reshape(k + 1, vocab)
    q = np.frombuffer(q_bytes).reshape(k, vocab)
    d, _, joint, final = _enumerate(spec, p, q)
    law = np.zeros((k + 1, vocab, vocab))
    law[0][np.arange(vocab), np.arange(vocab)] = np.einsum("d,dv->v", joint[:, 0], final[:, 0])
    for j in range(1, k + 1):
        np.add.at(law[j], d[:, 0], joint[:, j, None] * final[:, j])
    return law.reshape(-1)


def completion_law(spec: RuleSpec, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The law of a step's output completed to k + 1 tokens by independent draws from the
    reference rows (the target's, or its argmax for a greedy rule) at the positions it did not
    emit, over V^(k+1) outcomes. An exact rule's is the product of the reference rows: the output,
    continued by the target, must be a sample of the target."""
    p, q = _rows(p, q)
    k, vocab = q.shape
    d, _, joint, final = _enumerate(spec, p, q)
    reference = reference_rows(p, spec.rule.greedy)
    law = np.zeros(vocab ** (k + 1))
    for j in range(k + 1):
        head = _codes(d[:, :j], vocab)
        emitted = np.bincount((head[:, None] * vocab + np.arange(vocab)[None]).reshape(-1),
                              weights=(joint[:, j, None] * final[:, j]).reshape(-1), minlength=vocab ** (j + 1))
        law += np.outer(emitted, product_law(reference[j + 1:])).reshape(-1)
    return law


def product_law(rows: np.ndarray) -> np.ndarray:
    """The product law of independent rows [n, V] over V^n outcomes (earlier rows more significant)."""
    law = np.ones(1)
    for row in rows:
        law = np.outer(law, row).reshape(-1)
    return law


def _loop_step(spec: RuleSpec, world, state: int):
    """What one verify call from ``state`` emits under ``spec``: (code of the emitted tokens in
    base V [M], their number [M], probability [M], state after them [M])."""
    vocab, k = world.vocab_size, world.draft_length
    target, draft = world.target.law(), world.draft.law()
    d = all_drafts(vocab, k)
    states = np.zeros((d.shape[0], k + 1), dtype=np.int64)
    states[:, 0] = state
    for i in range(k):
        states[:, i + 1] = world.next_state(states[:, i], d[:, i])
    P, Q = target[states], draft[states[:, :k]]  # [D, k+1, V], [D, k, V]
    weight = np.prod(np.take_along_axis(Q, d[..., None], -1)[..., 0], axis=1)
    keep = weight > 0
    d, P, Q, weight, states = d[keep], P[keep], Q[keep], weight[keep], states[keep]
    accept, final = spec.emission(P, Q, d)
    codes, lengths, probs, ends = [], [], [], []
    for j in range(k + 1):
        head = _codes(d[:, :j], vocab)
        code = head[:, None] * vocab + np.arange(vocab)[None]  # [D, V]
        mass = weight[:, None] * accept[:, j, None] * final[:, j]
        end = world.next_state(states[:, j, None], np.arange(vocab)[None])
        # one entry per distinct (tokens): the end state is a function of the tokens
        total = np.bincount(code.reshape(-1), weights=mass.reshape(-1), minlength=vocab ** (j + 1))
        after = np.zeros(vocab ** (j + 1), dtype=np.int64)
        after[code.reshape(-1)] = end.reshape(-1)
        nonzero = np.flatnonzero(total > 0)
        codes.append(nonzero)
        lengths.append(np.full(nonzero.size, j + 1))
        probs.append(total[nonzero])
        ends.append(after[nonzero])
    return tuple(np.concatenate(parts) for parts in (codes, lengths, probs, ends))


def _world_key(world) -> tuple:
    """What a world's laws depend on: its name and its rows (a world built anew has equal rows)."""
    if hasattr(world, "sequence_law"):
        rows = (world.target.law(), world.draft.law())
        shape = (world.prompt_state, world.length, world.draft_length)
    else:
        rows = (np.asarray(world.target_law(), dtype=np.float64), np.asarray(world.draft_law(), dtype=np.float64))
        shape = ()
    return (world.name, shape, *(np.ascontiguousarray(r).tobytes() for r in rows))


_LAWS: dict[tuple, np.ndarray | float] = {}


def _memo(kind: str, spec: RuleSpec, world, compute):
    key = (kind, spec, _world_key(world))
    if key not in _LAWS:
        _LAWS[key] = compute()
    return _LAWS[key]


def loop_sequence_law(spec: RuleSpec, world) -> np.ndarray:
    """The exact law of a context world's first ``length`` tokens when its draft and target are
    driven through the speculative loop (k drafts a call, the output cut at ``length``) and every
    call is verified by ``spec``; indexed like ``world.sequence_law()``."""
    return _memo("loop", spec, world, lambda: _loop_sequence_law(spec, world))


def _loop_sequence_law(spec: RuleSpec, world) -> np.ndarray:
    vocab, length = world.vocab_size, world.length
    law = np.zeros(vocab ** length)
    steps: dict[int, tuple] = {}
    # the generations in progress: their tokens so far (base V), how many, their state, probability
    code = np.zeros(1, dtype=np.int64)
    filled = np.zeros(1, dtype=np.int64)
    state = np.array([world.prompt_state], dtype=np.int64)
    prob = np.ones(1)
    while code.size:
        parts = []
        for s in np.unique(state):
            if int(s) not in steps:
                steps[int(s)] = _loop_step(spec, world, int(s))
            out_code, out_len, out_prob, out_state = steps[int(s)]
            here = state == s
            new_len = filled[here, None] + out_len[None]
            new_code = code[here, None] * vocab ** out_len[None] + out_code[None]
            new_prob = prob[here, None] * out_prob[None]
            done = new_len >= length
            cut = new_code // vocab ** np.maximum(new_len - length, 0)  # tokens past ``length`` are cut
            np.add.at(law, cut[done], new_prob[done])
            parts.append((new_code[~done], new_len[~done], np.broadcast_to(out_state[None], done.shape)[~done],
                          new_prob[~done]))
        code, filled, state, prob = (np.concatenate([part[i] for part in parts]) for i in range(4))
    return law


def reference_sequence_law(world, greedy: bool) -> np.ndarray:
    """The target's own law of a context world's first ``length`` tokens: sampling, or greedy."""
    rows = world.target.law()
    return world.sequence_law(_one_hot_argmax(rows) if greedy else rows)


def output_tv(spec: RuleSpec, world) -> float:
    """The exact TV between what ``spec`` makes the user receive on ``world`` and the target's own
    law: on a context world the law of a whole generation through the loop; on a step world the
    output completed from the target (an exact rule's is the target's; 0 up to rounding)."""
    def compute() -> float:
        if hasattr(world, "sequence_law"):
            return 0.5 * float(np.abs(loop_sequence_law(spec, world)
                                      - reference_sequence_law(world, spec.rule.greedy)).sum())
        completion = completion_law(spec, world.target_law(), world.draft_law())
        return 0.5 * float(np.abs(completion - product_law(reference_rows(world.target_law(), spec.rule.greedy))).sum())

    return _memo("tv", spec, world, compute)
