"""Hypothesis strategies for verifier inputs that break naive implementations.

Large tensors are not drawn element by element: a strategy draws a ``VerifyCase`` — vocabulary
size, draft length, batch, the kind of target rows, how the draft rows relate to them, which
draft tokens to propose, and a seed — and ``VerifyCase.tensors()`` builds the float32 inputs from
it deterministically. Shrinking therefore minimises the *case* (smaller V, k and batch, plainer
rows), and a case is its own reproducer.

    from hypothesis import given
    from exactcheck.step.strategies import verify_cases

    @given(verify_cases())
    def test_my_verifier_never_emits_forbidden_tokens(case):
        target, draft, tokens = case.tensors()
        ...
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np
import torch
from hypothesis import strategies as st

__all__ = ["VerifyCase", "verify_cases", "probability_rows", "ROW_KINDS", "RELATIONS",
           "DRAFT_CHOICES", "VOCAB_SIZES", "INPUT_DTYPES", "row_generators", "edge_corpus"]

# simplest first: hypothesis shrinks sampled_from towards the start of each list
VOCAB_SIZES = (2, 1, 3, 5, 8, 64, 8193, 151_936)
ROW_KINDS = ("dirichlet", "zeros", "ties", "one_hot", "head_zero", "denormal", "fp16", "bf16")
RELATIONS = ("independent", "equal", "nearly_equal", "one_ulp_above", "disjoint",
             "mass_where_p_zero", "tiny_q")
DRAFT_CHOICES = ("any", "forbidden", "tiny_q")
# the dtype the rows are handed in (float32 first: hypothesis shrinks towards it); half rows are
# the float32 rows rounded, with every draft token kept at q > 0
INPUT_DTYPES = ("float32", "float32", "float32", "float16", "bfloat16")
MAX_ELEMENTS = 1 << 18  # cap on batch * (k+1) * V for one case (V = 151,936 stays, at B = k = 1)


def _rows(rng: np.random.Generator, count: int, vocab: int, kind: str) -> np.ndarray:
    """``count`` normalised float64 rows of one kind (before the float32 cast)."""
    if kind == "one_hot":
        rows = np.zeros((count, vocab))
        rows[np.arange(count), rng.integers(vocab, size=count)] = 1.0
        return rows
    if kind == "ties":
        rows = rng.integers(1, 3, size=(count, vocab)).astype(np.float64)
    else:  # skewed: many small entries, a few large ones (cheap for V = 151,936)
        rows = rng.random((count, vocab)) ** 4 + 1e-30
    if kind in ("zeros", "denormal") and vocab > 1:
        holes = rng.random((count, vocab)) < 0.5
        holes[np.arange(count), rng.integers(vocab, size=count)] = False
        rows[holes] = 1e-40 * rows[holes] / rows.max() if kind == "denormal" else 0.0
    if kind == "head_zero" and vocab > 1:  # token 0 forbidden, as padding ids often are
        rows[:, 0] = 0.0
    rows /= rows.sum(1, keepdims=True)
    if kind in ("fp16", "bf16"):
        dtype = torch.float16 if kind == "fp16" else torch.bfloat16
        rows = torch.from_numpy(rows).to(dtype).double().numpy()
        rows[rows.sum(1) == 0, 0] = 1.0
    return rows


@dataclass(frozen=True)
class VerifyCase:
    """One verifier input, as parameters. ``tensors()`` builds it."""

    vocab_size: int
    draft_length: int
    batch: int
    row_kind: str
    relation: str
    draft_choice: str
    seed: int
    dtype: str = "float32"

    def tensors(self, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k]) in the case's
        dtype (float32 unless it says float16 / bfloat16) / int64. Every draft token has q > 0
        (it could have been proposed). Fresh tensors each call (small cases are built once and
        copied)."""
        small = self.batch * (self.draft_length + 1) * self.vocab_size <= _CACHED_ELEMENTS
        built = _built(self) if small else self._build()
        return tuple(t.clone().to(device) for t in built)

    def _build(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng(self.seed)
        batch, k, vocab = self.batch, self.draft_length, self.vocab_size
        p = _rows(rng, batch * (k + 1), vocab, self.row_kind).reshape(batch, k + 1, vocab)
        p32 = torch.tensor(p, dtype=torch.float32)
        target = p32[:, :k]
        relation = self.relation if vocab > 1 else "equal"
        if relation == "equal":
            q32 = target.clone()
        elif relation in ("nearly_equal", "one_ulp_above"):
            up = torch.nextafter(target, torch.full_like(target, 2.0))
            down = torch.nextafter(target, torch.zeros_like(target))
            alternate = torch.arange(vocab) % 2 == 0
            q32 = up if relation == "one_ulp_above" else torch.where(alternate, up, down)
            q32 = torch.where(target > 0, q32, torch.zeros_like(q32))
        else:
            q = _rows(rng, batch * k, vocab, "dirichlet").reshape(batch, k, vocab)
            allowed = p[:, :k] > 0
            if relation == "disjoint" and (~allowed).any(-1).all():
                q = np.where(allowed, 0.0, q)
            elif relation == "mass_where_p_zero":
                q = np.where(allowed, 0.5 * q / np.maximum((q * allowed).sum(-1, keepdims=True), 1e-300), q)
            elif relation == "tiny_q":  # 1e-7 on the target's likely tokens and its forbidden ones
                tiny = (p[:, :k] >= np.median(p[:, :k], -1, keepdims=True)) | (p[:, :k] == 0)
                keep = q.argmax(-1)[..., None] == np.arange(vocab)
                tiny &= ~keep
                rest = np.where(tiny, 0.0, q)
                q = np.where(tiny, 1e-7, rest / rest.sum(-1, keepdims=True)
                             * (1 - 1e-7 * tiny.sum(-1, keepdims=True)))
            q = q / q.sum(-1, keepdims=True)
            q32 = torch.tensor(q, dtype=torch.float32)
        if self.dtype != "float32":  # rounded once; drafts are chosen where q stayed positive
            p32, q32 = p32.to(getattr(torch, self.dtype)), q32.to(getattr(torch, self.dtype))
        tokens = self._drafts(rng, p32[:, :k].float(), q32.float())
        return p32, q32, tokens

    def _drafts(self, rng, p32: torch.Tensor, q32: torch.Tensor) -> torch.Tensor:
        support = q32 > 0
        if self.draft_choice == "forbidden":
            preferred = support & (p32 == 0)
        elif self.draft_choice == "tiny_q":
            preferred = support & (q32 < 1e-6)
        else:
            preferred = support
        choice = torch.where(preferred.any(-1, keepdim=True), preferred, support)
        noise = torch.from_numpy(rng.random(choice.shape)).float()
        return torch.where(choice, noise + 1.0, noise - 1.0).argmax(-1)

    def to_dict(self) -> dict:
        return asdict(self)


_CACHED_ELEMENTS = 1 << 16


@functools.lru_cache(maxsize=4096)
def _built(case: VerifyCase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return case._build()


@st.composite
def verify_cases(draw, vocab_sizes=VOCAB_SIZES, max_draft_length: int = 16, max_batch: int = 8,
                 row_kinds=ROW_KINDS, relations=RELATIONS, draft_choices=DRAFT_CHOICES,
                 input_dtypes=INPUT_DTYPES):
    """``VerifyCase``s covering zeros, ties, denormals, one-hot rows, fp16/bf16-rounded rows,
    p == q bitwise, q within one ulp of p, q one ulp above p everywhere (zero residual), disjoint
    supports, draft mass where p = 0, tiny q, drafts on forbidden or tiny-q tokens, vocabulary
    sizes 1 to 151,936 and draft lengths 1 to 16."""
    vocab = draw(st.sampled_from(vocab_sizes))
    k = draw(st.integers(1, max_draft_length))
    batch = draw(st.integers(1, max_batch))
    while batch * (k + 1) * vocab > MAX_ELEMENTS and (batch > 1 or k > 1):
        batch, k = (batch // 2, k) if batch > 1 else (batch, k // 2)
    return VerifyCase(vocab, k, batch, draw(st.sampled_from(row_kinds)),
                      draw(st.sampled_from(relations)), draw(st.sampled_from(draft_choices)),
                      draw(st.integers(0, 2**31 - 1)), draw(st.sampled_from(input_dtypes)))


def edge_corpus() -> list[VerifyCase]:
    """A fixed set of small cases, one per row kind and draft relation (with the draft choice
    that relation is about), checked before any random search so that each edge class is met
    deterministically."""
    choice = {"disjoint": "forbidden", "mass_where_p_zero": "forbidden", "tiny_q": "forbidden"}
    cases = [VerifyCase(3, 2, 2, kind, relation, choice.get(relation, "any"), 0)
             for relation in RELATIONS for kind in ROW_KINDS]
    cases += [VerifyCase(3, 2, 2, kind, "independent", "forbidden", 0) for kind in ROW_KINDS]
    cases += [VerifyCase(3, 2, 2, "dirichlet", relation, "any", 0, dtype)
              for dtype in ("float16", "bfloat16") for relation in ("independent", "equal", "tiny_q")]
    return cases


def probability_rows(vocab_size: int, kind: str | None = None, count: int = 1):
    """Strategy for float32 probability rows ``[count, V]`` of one of ``ROW_KINDS``."""
    kinds = st.just(kind) if kind else st.sampled_from(ROW_KINDS)
    return st.builds(lambda k, seed: torch.tensor(
        _rows(np.random.default_rng(seed), count, vocab_size, k), dtype=torch.float32),
        kinds, st.integers(0, 2**31 - 1))


def row_generators(batch: int):
    """Strategy for per-row generators: a list of ``torch.Generator`` (seeded) or ``None``
    (the row uses the shared generator), at least one of each when batch > 1."""
    seeds = st.lists(st.one_of(st.none(), st.integers(0, 2**31 - 1)), min_size=batch, max_size=batch)
    return seeds.map(lambda xs: [None if s is None else torch.Generator().manual_seed(s) for s in xs])
