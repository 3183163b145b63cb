"""Chain-rule checks: whole generated sequences over large vocabularies, laws never enumerated.

When only the per-position conditionals p_t(. | prefix) can be computed (teacher forcing), the
law of a sequence is still pinned down by the chain rule, and these statistics have exactly known
behaviour when every token x_t was drawn from p_t (Rosenblatt 1952; Dunn & Smyth 1996):

- randomised PIT: with F_t the CDF of p_t in a fixed token order, U_t = F_t(x_t^-) + V_t p_t(x_t),
  V_t ~ U(0, 1) independent, the U_t of all positions and sequences are i.i.d. uniform. Two orders:
  by target probability (descending; a sampler that is too hot or too cold moves U) and by the
  draft/target ratio q/p (descending; a sampler biased towards the draft moves U). Tested with the
  Kolmogorov-Smirnov test.
- moment tests: for a function f of (row, token), E[f(x_t) | prefix] and Var[f(x_t) | prefix] are
  known exactly per position, so Z = sum_t (f(x_t) - E_t) / sqrt(sum_t Var_t) is asymptotically
  N(0, 1) (martingale central limit theorem). f = surprisal -log p_t(x); f = log q_t(x)/p_t(x)
  (q clamped at 1e-300 so the moments stay finite; the clamp is part of f, so E and Var stay
  exact); f = 1[x = the draft's most likely token].

The five p-values are combined under Holm. The worlds supply conditionals as tensors
(``target_rows(previous, position)`` / ``draft_rows``, float64 [B, V]); ``token_statistics`` is an
optional O(1) fast path with the same values (checked against the generic path in the tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from scipy import stats


__all__ = ["ChainWorld", "ChainRuleTest", "teacher_forced",
           "chain_rule_tests", "row_statistics", "z_test", "CHAIN_RULE_TESTS"]

CHAIN_RULE_TESTS = ("pit_target_order", "pit_ratio_order", "surprisal", "log_draft_ratio",
                    "draft_top_agreement")
_TINY = 1e-300


class ChainWorld(Protocol):
    name: str
    vocab_size: int
    length: int
    draft_length: int
    bos: int

    def target_rows(self, previous: torch.Tensor, position: torch.Tensor,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor: ...

    def draft_rows(self, previous: torch.Tensor, position: torch.Tensor,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor: ...


@dataclass(frozen=True)
class ChainRuleTest:
    name: str
    statistic: float
    statistic_name: str
    pvalue: float
    tokens: int
    detail: str


def teacher_forced(world: ChainWorld, sequences: torch.Tensor, fast: bool = True,
                   chunk: int = 256) -> dict[str, torch.Tensor]:
    """Per-token quantities [n, L] (float64) of ``sequences`` under the world's conditionals.
    ``fast`` uses the world's ``token_statistics`` when it has one."""
    n, length = sequences.shape
    previous = torch.cat([torch.full((n, 1), world.bos, dtype=torch.int64), sequences[:, :-1]], 1)
    position = torch.arange(length).expand(n, length)
    flat = (previous.reshape(-1), position.reshape(-1), sequences.reshape(-1))
    if fast and hasattr(world, "token_statistics"):
        out = world.token_statistics(*flat)
    else:
        parts = [_generic(world, flat[0][s:s + chunk], flat[1][s:s + chunk], flat[2][s:s + chunk])
                 for s in range(0, n * length, chunk)]
        out = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
    return {key: value.reshape(n, length) for key, value in out.items()}


def _generic(world, previous, position, token) -> dict[str, torch.Tensor]:
    """The O(V) computation from the row tensors."""
    return row_statistics(world.target_rows(previous, position), world.draft_rows(previous, position), token)


def row_statistics(p: torch.Tensor, q: torch.Tensor, token: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token chain-rule quantities from target rows ``p`` and draft rows ``q`` ([N, V]) and
    the emitted ``token`` [N]: PIT parts (ties by id), surprisal and log-ratio with their exact
    conditional moments, draft-top agreement."""
    p, q = p.double(), q.double()
    ids = torch.arange(p.shape[1])[None, :]
    x = token[:, None]
    p_x = p.gather(1, x)
    before = (p > p_x) | ((p == p_x) & (ids < x))
    ratio = torch.where(p > 0, q / torch.where(p > 0, p, 1.0), -math.inf)
    r_x = ratio.gather(1, x)
    before_ratio = (ratio > r_x) | ((ratio == r_x) & (ids < x))
    log_p = torch.where(p > 0, torch.log(torch.where(p > 0, p, 1.0)), 0.0)
    llr = torch.log(q.clamp(min=_TINY)) - log_p
    entropy = -(p * log_p).sum(1)
    llr_mean = (p * llr).sum(1)
    top = q.argmax(1, keepdim=True)
    return {
        "p": p_x[:, 0],
        "below_p": (p * before).sum(1),
        "below_ratio": (p * before_ratio).sum(1),
        "surprisal": -log_p.gather(1, x)[:, 0],
        "surprisal_mean": entropy,
        "surprisal_var": (p * log_p ** 2).sum(1) - entropy ** 2,
        "llr": llr.gather(1, x)[:, 0],
        "llr_mean": llr_mean,
        "llr_var": (p * llr ** 2).sum(1) - llr_mean ** 2,
        "agree": (token == top[:, 0]).double(),
        "agree_mean": p.gather(1, top)[:, 0],
    }


def z_test(name: str, values: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
            what: str) -> ChainRuleTest:
    deviation = float((values - mean).sum())
    spread = math.sqrt(max(float(var.clamp(min=0).sum()), 1e-300))
    z = deviation / spread
    per_token = deviation / values.numel()
    return ChainRuleTest(name, z, "z (martingale CLT)", float(2 * stats.norm.sf(abs(z))),
                         values.numel(), f"{what}: observed - expected = {per_token:+.4g} per token")


def chain_rule_tests(world: ChainWorld, sequences: torch.Tensor, seed: int,
                     fast: bool = True) -> list[ChainRuleTest]:
    """The five chain-rule tests on ``sequences`` (p-values not yet adjusted)."""
    t = teacher_forced(world, sequences, fast=fast)
    gen = torch.Generator().manual_seed(seed)
    tests = []
    for name, below, order in (("pit_target_order", t["below_p"], "target probability"),
                               ("pit_ratio_order", t["below_ratio"], "draft/target ratio")):
        v = torch.rand(below.shape, dtype=torch.float64, generator=gen)
        u = (below + v * t["p"]).reshape(-1).clamp(0, 1).numpy()
        ks = stats.kstest(u, "uniform")
        tests.append(ChainRuleTest(name, float(ks.statistic), "Kolmogorov-Smirnov D", float(ks.pvalue),
                                   u.size, f"PIT in {order} order: mean {u.mean():.4f} (exact 0.5)"))
    tests.append(z_test("surprisal", t["surprisal"], t["surprisal_mean"], t["surprisal_var"],
                         "surprisal -log p(x)"))
    tests.append(z_test("log_draft_ratio", t["llr"], t["llr_mean"], t["llr_var"], "log q(x)/p(x)"))
    agree = t["agree_mean"]
    tests.append(z_test("draft_top_agreement", t["agree"], agree, agree * (1 - agree),
                         "x equals the draft's most likely token"))
    return tests
