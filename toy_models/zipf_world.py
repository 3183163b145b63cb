"""A large-vocabulary conditional world: V = 50,000, 64-token sequences, laws never enumerated.

The target is a position-dependent bigram model. At position t after token y the context hash
h(y, t) picks a shift s and a temperature level l; the target row is a Zipf law over ranks,
tempered to level l, laid on the vocabulary rotated by s:

    p(x | y, t) = z_l(r),   r = (x + s) mod V,   z_l(r) proportional to (r + 1)^(-a / T_l)

The draft is the same row reweighted by a rank modulation m(r) = exp(0.6 sin(phi r)) (phi
irrational, so m takes distinct values and the draft/target ratio has no ties):
q(x | y, t) = z_l(r) m(r) / Z_l. Both rows come as float64 tensors [B, V] from
``target_rows`` / ``draft_rows`` (the teacher-forced conditionals a chain-rule check needs).

Because every row is a rotation of one of a few tables, the per-token quantities the chain-rule
checks use (CDF below a token in either order, moments per position) also have an O(1) form,
``token_statistics``; a test checks it against the generic O(V) computation on the rows.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

__all__ = ["ZipfWorld", "zipf_world"]

_TEMPERATURES = (0.8, 0.9, 1.0, 1.15, 1.3)
_PHI = math.sqrt(2) * math.pi / 7


@dataclass(frozen=True, eq=False)
class ZipfWorld:
    """Teacher-forced conditionals over a large vocabulary (see module docstring)."""

    name: str
    vocab_size: int
    length: int
    draft_length: int
    exponent: float
    seed: int
    bos: int = 0  # the token before position 0

    @property
    def description(self) -> str:
        return (f"position-dependent bigram Zipf LM, V={self.vocab_size:,}, {self.length}-token "
                f"sequences, k={self.draft_length}; conditionals as tensors, law not enumerable")

    # ---- tables (float64, one row per temperature level) ----
    @functools.cached_property
    def _tables(self) -> dict[str, torch.Tensor]:
        ranks = torch.arange(self.vocab_size, dtype=torch.float64)
        levels = torch.tensor(_TEMPERATURES, dtype=torch.float64)
        logits = -self.exponent * torch.log1p(ranks)[None, :] / levels[:, None]
        target = torch.softmax(logits, -1)  # z_l(r), decreasing in r
        modulation = torch.exp(0.6 * torch.sin(_PHI * ranks))
        draft = target * modulation
        draft = draft / draft.sum(-1, keepdim=True)
        ratio_order = torch.argsort(modulation, descending=True, stable=True)  # by q/p, descending
        position_in_ratio = torch.empty_like(ratio_order)
        position_in_ratio[ratio_order] = torch.arange(self.vocab_size)
        below_p = torch.cumsum(target, -1) - target  # mass of ranks before r (p order)
        in_ratio = target[:, ratio_order]
        below_ratio = (torch.cumsum(in_ratio, -1) - in_ratio)[:, position_in_ratio]
        log_t = torch.log(target)
        log_ratio = torch.log(draft) - log_t
        top = draft.argmax(-1)
        return {
            "target": target, "draft": draft, "below_p": below_p, "below_ratio": below_ratio,
            "log_t": log_t, "log_ratio": log_ratio, "top": top,
            "entropy": -(target * log_t).sum(-1), "surprisal_sq": (target * log_t ** 2).sum(-1),
            "llr_mean": (target * log_ratio).sum(-1), "llr_sq": (target * log_ratio ** 2).sum(-1),
            "top_p": target.gather(1, top[:, None])[:, 0],
        }

    def context(self, previous: torch.Tensor, position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(shift, level) for each (previous token, position)."""
        h = (previous.to(torch.int64) * 1_000_003 + position.to(torch.int64) * 7_919 + self.seed * 104_729)
        h = (h * 2_654_435_761) % 2_147_483_647
        return h % self.vocab_size, (h // self.vocab_size) % len(_TEMPERATURES)

    @functools.lru_cache(maxsize=4)
    def _windows(self, table: str, dtype: torch.dtype) -> torch.Tensor:
        """The table repeated twice along the ranks, viewed as [levels, V + 1, V] windows: the
        row with shift s is window s (one copy per row, no index tensor)."""
        doubled = torch.cat([self._tables[table].to(dtype)] * 2, 1)
        return doubled.unfold(1, self.vocab_size, 1)

    def _rows(self, table: str, previous: torch.Tensor, position: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
        shift, level = self.context(previous, position)
        return self._windows(table, dtype)[level.cpu(), shift.cpu()].to(previous.device)

    def target_rows(self, previous: torch.Tensor, position: torch.Tensor,
                    dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """p(. | previous token, position) as [B, V]; float64 is the exact law, float32 the
        same values rounded (what a subject receives)."""
        return self._rows("target", previous, position, dtype)

    def draft_rows(self, previous: torch.Tensor, position: torch.Tensor,
                   dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """q(. | previous token, position) as [B, V]."""
        return self._rows("draft", previous, position, dtype)

    def token_statistics(self, previous: torch.Tensor, position: torch.Tensor,
                         token: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-token quantities of ``exactcheck.stats.chain_rule`` in O(1) per token (float64)."""
        shift, level = self.context(previous, position)
        t = {k: v.to(token.device) for k, v in self._tables.items()}
        rank = (token + shift) % self.vocab_size
        top_token = (t["top"][level] - shift) % self.vocab_size
        return {
            "p": t["target"][level, rank],
            "below_p": t["below_p"][level, rank],
            "below_ratio": t["below_ratio"][level, rank],
            "surprisal": -t["log_t"][level, rank],
            "surprisal_mean": t["entropy"][level],
            "surprisal_var": t["surprisal_sq"][level] - t["entropy"][level] ** 2,
            "llr": t["log_ratio"][level, rank],
            "llr_mean": t["llr_mean"][level],
            "llr_var": t["llr_sq"][level] - t["llr_mean"][level] ** 2,
            "agree": (token == top_token).double(),
            "agree_mean": t["top_p"][level],
        }

    def sample(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` sequences drawn exactly from the target law (ancestral sampling by rank)."""
        cdf = torch.cumsum(self._tables["target"], -1)
        seq = torch.empty(n, self.length, dtype=torch.int64)
        previous = torch.full((n,), self.bos, dtype=torch.int64)
        for pos in range(self.length):
            shift, level = self.context(previous, torch.full((n,), pos))
            u = torch.rand(n, dtype=torch.float64, generator=generator)
            rank = torch.empty(n, dtype=torch.int64)
            for lv in range(len(_TEMPERATURES)):
                rows = level == lv
                rank[rows] = torch.searchsorted(cdf[lv], u[rows] * cdf[lv, -1], right=True)
            rank = rank.clamp(max=self.vocab_size - 1)
            previous = (rank - shift) % self.vocab_size
            seq[:, pos] = previous
        return seq


@functools.lru_cache(maxsize=4)
def zipf_world(vocab: int = 50_000, length: int = 64, draft_length: int = 4,
               exponent: float = 1.1, seed: int = 41) -> ZipfWorld:
    """The built-in large-vocabulary world (cached: its tables take a moment to build)."""
    return ZipfWorld(f"zipf_v{vocab}_l{length}_k{draft_length}", vocab, length, draft_length,
                     exponent, seed)
