"""Exact verifiers written differently from ``exactcheck.contracts.reference_verifier``.

Each one is a correct speculative-sampling step (Leviathan et al.) that an engine engineer might
write: other uniform conventions (u or 1 - u, strict or not), dtypes (float32, float64 uniforms;
half-precision logits), forms (ratio, product, log space), residual draws (inverse CDF,
``torch.multinomial``, exponential race, Gumbel-max), uniforms drawn at once or lazily per
position, parts or the whole step in TorchScript or ``torch.compile``, logits in (softmax in
float32, or log space in float64), and a per-row loop over a batch-1 function on torch's global
generator. exactcheck must find no exactness defect in any of them; findings that
are not about exactness (a subject that does not reproduce under its seed) are reported in their
own category. ``property_tests/step/test_trust.py`` audits each one (the two compiled ones only in the
slow run: compiling takes longer than the audit), and
``benchmarks/correct_corpus.py`` audits each under many seeds.

Every verifier guards the two boundary cases real code must get right: a draft token with
p = 0 is never accepted at any reachable uniform, and a residual max(0, p - q) that sums to 0
(p == q up to rounding) falls back to p itself.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from exactcheck.contracts.verifier import PADDING, from_logits

__all__ = ["CORRECT_VERIFIERS", "REPRODUCIBILITY_ONLY", "fused_step"]


def _at(rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """rows[b, i, tokens[b, i]] for the first tokens.shape[1] positions."""
    return rows[:, :tokens.shape[1]].gather(2, tokens[..., None])[..., 0]


def _final_rows(p: torch.Tensor, q: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """float64 law of the token after n accepted drafts: normalised max(0, p_n - q_n) (p_n
    itself when that is all zero), or p_k after k acceptances."""
    k = q.shape[1]
    rows = torch.arange(p.shape[0])
    pn = p[rows, n].double()
    qn = torch.where((n < k)[:, None], q[rows, n.clamp(max=k - 1)].double(), torch.zeros_like(pn))
    residual = (pn - qn).clamp(min=0)
    empty = residual.sum(1) <= 0
    residual[empty] = pn[empty]
    return residual / residual.sum(1, keepdim=True)


def _assemble(tokens: torch.Tensor, n: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    batch, k = tokens.shape
    out = torch.full((batch, k + 1), PADDING, dtype=torch.int64, device=tokens.device)
    keep = torch.arange(k, device=tokens.device)[None] < n[:, None]
    out[:, :k] = torch.where(keep, tokens, PADDING)
    return out.scatter_(1, n[:, None], last[:, None].to(torch.int64))


def _inverse_cdf_pick(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """#{j : cdf_j <= u * total}, never past the last token of positive mass."""
    cdf = rows.cumsum(1)
    token = (cdf <= (u * cdf[:, -1])[:, None]).sum(1)
    positive_last = rows.shape[1] - 1 - (rows.flip(1) > 0).to(torch.int8).argmax(1)
    return torch.minimum(token, positive_last)


def _leading(accepted: torch.Tensor) -> torch.Tensor:
    return accepted.to(torch.int64).cumprod(1).sum(1)


def _first_positive(rows: torch.Tensor) -> torch.Tensor:
    return (rows > 0).to(torch.int8).argmax(1)


# -- acceptance conventions -----------------------------------------------------------------------

def mirrored_uniform_product(target_probs, draft_probs, draft_tokens, generator):
    """u = 1 - torch.rand (float32, so u is in (0, 1]); accept when u * q <= p; the correction
    by inverse CDF with the same mirrored convention (first token whose cumulative mass reaches u)."""
    batch, k = draft_tokens.shape
    u = 1.0 - torch.rand(batch, k, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading((u.double() * q <= p) & (p > 0))
    rows = _final_rows(target_probs, draft_probs, n)
    v = 1.0 - torch.rand(batch, generator=generator, device=draft_tokens.device).double()
    cdf = rows.cumsum(1)
    last = torch.searchsorted(cdf, (v * cdf[:, -1])[:, None], right=False)[:, 0]
    last = torch.where(last >= rows.shape[1], rows.shape[1] - 1 - (rows.flip(1) > 0).to(torch.int8).argmax(1), last)
    return _assemble(draft_tokens, n, last)


def mirrored_float64_ratio(target_probs, draft_probs, draft_tokens, generator):
    """u = 1 - torch.rand (float64, so u is in (0, 1]) against min(1, p/q) in float64, strict;
    the correction by inverse CDF on the mirrored uniform too."""
    batch, k = draft_tokens.shape
    u = 1.0 - torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u < torch.clamp(p / q, max=1.0))
    rows = _final_rows(target_probs, draft_probs, n)
    v = 1.0 - torch.rand(batch, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    return _assemble(draft_tokens, n, _inverse_cdf_pick(rows, v))


def float32_ratio_strict(target_probs, draft_probs, draft_tokens, generator):
    """float32 uniforms against min(1, p/q) computed in float32, strict; the correction by
    ``torch.multinomial`` on the float32 residual."""
    batch, k = draft_tokens.shape
    u = torch.rand(batch, k, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).float(), _at(draft_probs, draft_tokens).float()
    n = _leading(u < torch.clamp(p / q, max=1.0))
    rows = _final_rows(target_probs, draft_probs, n).float()
    last = torch.multinomial(rows, 1, generator=generator)[:, 0]
    return _assemble(draft_tokens, n, last)


def float64_nonstrict_guarded(target_probs, draft_probs, draft_tokens, generator):
    """float64 uniforms, u <= p/q (non-strict, so p = 0 is excluded explicitly); the correction
    by inverse CDF counting the cumulative values at or below u."""
    batch, k = draft_tokens.shape
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading((u <= p / q) & (p > 0))
    rows = _final_rows(target_probs, draft_probs, n)
    v = torch.rand(batch, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    return _assemble(draft_tokens, n, _inverse_cdf_pick(rows, v))


def _exponential_race(rows: torch.Tensor, generator) -> torch.Tensor:
    """argmax of rows / E with E ~ Exp(1) (float32): the race's winner has law ``rows``. Zero-mass
    tokens never take part (an exponential of exactly 0 would make 0/0)."""
    e = torch.empty(rows.shape, dtype=torch.float32, device=rows.device).exponential_(generator=generator)
    score = torch.where(rows > 0, rows / e.double(), torch.full_like(rows, -1.0))
    return score.argmax(1)


def log_space(target_probs, draft_probs, draft_tokens, generator):
    """Acceptance in log space, log u < log p - log q (float64; log 0 = -inf rejects p = 0); the
    correction by an exponential race."""
    batch, k = draft_tokens.shape
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(torch.log(u) < torch.log(p) - torch.log(q))
    return _assemble(draft_tokens, n, _exponential_race(_final_rows(target_probs, draft_probs, n), generator))


def gumbel_max_residual(target_probs, draft_probs, draft_tokens, generator):
    """Acceptance with float64 uniforms; the correction by Gumbel-max over V float32 uniforms,
    argmax(log r - log(-log u)), over the tokens of positive mass only. If every positive token
    drew u = 0 exactly (every score -inf) it takes the first positive token."""
    batch, k = draft_tokens.shape
    device = draft_tokens.device
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u * q < p)
    rows = _final_rows(target_probs, draft_probs, n)
    g = -torch.log(-torch.log(torch.rand(rows.shape, generator=generator, device=device).double()))
    score = torch.where(rows > 0, rows.log() + g, torch.full_like(rows, -torch.inf))
    best = score.max(1)
    last = torch.where(best.values > -torch.inf, best.indices, _first_positive(rows))
    return _assemble(draft_tokens, n, last)


def exponential_race(target_probs, draft_probs, draft_tokens, generator):
    """float32 uniforms compared with the ratio; the correction by an exponential race over the
    residual (the trick vLLM's sampler uses), guarded against 0/0."""
    batch, k = draft_tokens.shape
    u = torch.rand(batch, k, generator=generator, device=draft_tokens.device).double()
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u < p / q)
    return _assemble(draft_tokens, n, _exponential_race(_final_rows(target_probs, draft_probs, n), generator))


def lazy_per_position(target_probs, draft_probs, draft_tokens, generator):
    """Uniforms drawn lazily, one float32 uniform per still-running row per position, stopping
    when every row has rejected; the correction by ``torch.multinomial`` on float64 rows."""
    batch, k = draft_tokens.shape
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = torch.zeros(batch, dtype=torch.int64, device=draft_tokens.device)
    running = torch.ones(batch, dtype=torch.bool, device=draft_tokens.device)
    for i in range(k):
        idx = running.nonzero()[:, 0]
        if idx.numel() == 0:
            break
        u = torch.rand(idx.numel(), generator=generator, device=draft_tokens.device).double()
        ok = u * q[idx, i] < p[idx, i]
        n[idx[ok]] += 1
        running[idx[~ok]] = False
    rows = _final_rows(target_probs, draft_probs, n)
    return _assemble(draft_tokens, n, torch.multinomial(rows, 1, generator=generator)[:, 0])


@torch.jit.script
def _scripted_inverse_cdf(rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Compiled when this module is imported, as TorchScript in engines is."""
    u = torch.rand(rows.shape[0], dtype=torch.float64, generator=generator, device=rows.device)
    cdf = rows.cumsum(1)
    token = (cdf <= (u * cdf[:, -1]).unsqueeze(1)).sum(1)
    positive_last = rows.shape[1] - 1 - (rows.flip([1]) > 0).to(torch.int8).argmax(1)
    return torch.minimum(token, positive_last)


def jit_residual(target_probs, draft_probs, draft_tokens, generator):
    """The correction draw is a ``torch.jit.script`` function drawing its own uniform from the
    generator: exactcheck cannot force that draw (it only sees the generator move)."""
    batch, k = draft_tokens.shape
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u * q < p)
    return _assemble(draft_tokens, n, _scripted_inverse_cdf(_final_rows(target_probs, draft_probs, n), generator))


@functools.lru_cache(maxsize=1)
def _compiled_inverse_cdf():
    return torch.compile(_inverse_cdf_pick, dynamic=True)


def compiled_residual(target_probs, draft_probs, draft_tokens, generator):
    """The inverse-CDF pick of the correction runs as a ``torch.compile``d kernel (Inductor);
    its uniform is drawn outside it. The first call compiles (about 20 s on a 2-core CPU)."""
    batch, k = draft_tokens.shape
    device = draft_tokens.device
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=device)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u * q < p)
    v = torch.rand(batch, dtype=torch.float64, generator=generator, device=device)
    return _assemble(draft_tokens, n, _compiled_inverse_cdf()(_final_rows(target_probs, draft_probs, n), v))


def _readable(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Per row: no NaN, infinite or negative entry along ``dim``."""
    return ((values >= 0) & (values < float("inf"))).all(dim)


def fused_step(target_probs, draft_probs, draft_tokens, u, v):
    """The reference's step after its uniforms, written for ``torch.compile``: (output, valid),
    valid [B] saying per row that no entry read was NaN, infinite or negative and that no draft
    token had draft probability 0. Written for the compiler, so it does not call ``_leading`` or
    ``_final_rows``: the accepted length unrolled over the k positions (a cumprod is not fused),
    the zero-residual fallback a ``where`` (not a masked assignment), validity per row (a
    reduction to one scalar is not fused with the row reductions beside it: 20 ms of 75 at
    V = 32, B = 200,000). The pick mirrors the reference (normalise, then cumulative sum), not
    ``_inverse_cdf_pick``, so the tokens are the reference's."""
    batch, k = draft_tokens.shape
    vocab = target_probs.shape[-1]
    p32, q32 = _at(target_probs, draft_tokens), _at(draft_probs, draft_tokens)
    accepted = u * q32.double() < p32.double()
    leading = accepted[:, 0]
    n = leading.to(torch.int64)
    for i in range(1, k):
        leading = leading & accepted[:, i]
        n = n + leading
    rows = torch.arange(batch, device=draft_tokens.device)
    pn32, qn32 = target_probs[rows, n], draft_probs[rows, n.clamp(max=k - 1)]
    pn = pn32.double()
    qn = torch.where((n < k)[:, None], qn32.double(), torch.zeros_like(pn))
    residual = (pn - qn).clamp(min=0)
    residual = torch.where(residual.sum(1, keepdim=True) > 0, residual, pn)
    cdf = (residual / residual.sum(1, keepdim=True)).cumsum(1)
    token = (cdf <= v[:, None]).sum(1)
    token = torch.where(token >= vocab, (cdf < cdf[:, -1:]).sum(1), token)  # rounding past the total
    valid = _readable(p32, 1) & _readable(q32, 1) & (q32 > 0).all(1) & _readable(pn32, 1) & _readable(qn32, 1)
    return _assemble(draft_tokens, n, token), valid


@functools.lru_cache(maxsize=1)
def _compiled_step():
    return torch.compile(fused_step)


def compiled_step(target_probs, draft_probs, draft_tokens, generator):
    """The whole step after the uniforms (acceptance, residual, inverse-CDF pick, assembly) as one
    ``torch.compile``d graph that Inductor fuses into a few kernels; the uniforms are drawn
    outside it in the reference's order, so its tokens are the reference's up to float64
    rounding. The throughput benchmark's ``--compile`` subject. The first call for each
    vocabulary and draft length compiles (about 10 s on a 2-core CPU); past torch's limit of 8
    compiled shapes (an audit's many worlds) torch runs it eagerly, as ``fused_step``."""
    batch, k = draft_tokens.shape
    device = draft_tokens.device
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=device)
    v = torch.rand(batch, dtype=torch.float64, generator=generator, device=device)
    out, valid = _compiled_step()(target_probs, draft_probs, draft_tokens, u, v)
    if not bool(valid.all()):
        raise ValueError("a probability read is NaN, infinite or negative, or a draft token has draft "
                         "probability 0")
    return out


# -- logits in (through from_logits), as engines hand them ------------------------------------------

def _softmax_verifier(compute_dtype):
    def verify(target_logits, draft_logits, draft_tokens, generator):
        dtype = compute_dtype or target_logits.dtype
        p = torch.softmax(target_logits.to(dtype), -1)
        q = torch.softmax(draft_logits.to(dtype), -1)
        return float32_ratio_strict(p, q, draft_tokens, generator)
    return verify


logits_float32_softmax = from_logits(_softmax_verifier(torch.float32))
logits_float32_softmax.__name__ = "logits_float32_softmax"
logits_float32_softmax.__doc__ = "Takes logits, softmax in float32, then the float32-ratio step."
def _log_softmax_verify(target_logits, draft_logits, draft_tokens, generator):
    """Acceptance in log space straight from the logits: log u < log_softmax(t)_x - log_softmax(d)_x
    (float64); the correction by an exponential race on the float64 rows."""
    batch, k = draft_tokens.shape
    log_p = torch.log_softmax(target_logits.double(), -1)
    log_q = torch.log_softmax(draft_logits.double(), -1)
    u = torch.rand(batch, k, dtype=torch.float64, generator=generator, device=draft_tokens.device)
    n = _leading(torch.log(u) < _at(log_p, draft_tokens) - _at(log_q, draft_tokens))
    return _assemble(draft_tokens, n, _exponential_race(_final_rows(log_p.exp(), log_q.exp(), n), generator))


logits_log_softmax = from_logits(_log_softmax_verify)
logits_log_softmax.__name__ = "logits_log_softmax"


# -- other sources of randomness ---------------------------------------------------------------------

def _one_row_global(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """A batch-1 step on torch's global generator (as transformers' ``_speculative_sampling``)."""
    k = tokens.shape[0]
    u = torch.rand(k, dtype=torch.float64)
    pi, qi = p[:k].double().gather(1, tokens[:, None])[:, 0], q.double().gather(1, tokens[:, None])[:, 0]
    n = int(_leading((u * qi < pi)[None])[0])
    rows = _final_rows(p[None], q[None], torch.tensor([n]))
    last = torch.multinomial(rows, 1)[0]
    return _assemble(tokens[None], torch.tensor([n]), last)[0]


def global_rng_per_row(target_probs, draft_probs, draft_tokens, generator):
    """A per-row loop over a batch-1 function drawing from torch's global generator; it ignores
    the generator it is handed, so it is exact but does not reproduce under the audit's seed."""
    return torch.stack([_one_row_global(target_probs[b], draft_probs[b], draft_tokens[b])
                        for b in range(draft_tokens.shape[0])])


@torch.jit.script
def _scripted_global_uniforms(batch: int, k: int) -> torch.Tensor:
    """k acceptance uniforms and one for the last token per row, from torch's global generator."""
    return torch.rand(batch, k + 1, dtype=torch.float64)


def reseeded_global_script(target_probs, draft_probs, draft_tokens, generator):
    """vLLM V0's pattern through a reproducible adapter: the engine draws from torch's global
    generator inside TorchScript; the adapter seeds that generator from the one it is handed
    (one draw) and restores it afterwards, so nothing looks moved after the call. Rows share
    one stream; each row's law is exact."""
    batch, k = draft_tokens.shape
    seed = int(torch.rand((), dtype=torch.float64, generator=generator) * 2.0 ** 53)
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        u = _scripted_global_uniforms(batch, k).to(draft_tokens.device)
    finally:
        torch.random.set_rng_state(state)
    p, q = _at(target_probs, draft_tokens).double(), _at(draft_probs, draft_tokens).double()
    n = _leading(u[:, :k] * q < p)
    return _assemble(draft_tokens, n, _inverse_cdf_pick(_final_rows(target_probs, draft_probs, n), u[:, k]))


def _numpy_uniforms(draw):
    """An exact step whose uniforms come from ``draw(shape)`` (numpy float64 in [0, 1))."""
    def verify(target_probs, draft_probs, draft_tokens, generator):
        batch, k = draft_tokens.shape
        u = torch.from_numpy(draw((batch, k)))
        p, q = _at(target_probs, draft_tokens).double().cpu(), _at(draft_probs, draft_tokens).double().cpu()
        n = _leading(u * q < p)
        rows = _final_rows(target_probs.cpu(), draft_probs.cpu(), n).numpy()
        cdf = rows.cumsum(1)
        last = np.minimum((cdf <= (draw(batch) * cdf[:, -1])[:, None]).sum(1),
                          rows.shape[1] - 1 - (rows[:, ::-1] > 0).argmax(1))
        return _assemble(draft_tokens.cpu(), n, torch.from_numpy(last)).to(draft_tokens.device)
    return verify


def numpy_unseeded(target_probs, draft_probs, draft_tokens, generator):
    """Exact, with every random number from an unseeded numpy Generator (fresh OS entropy): it
    ignores the generator it is handed, so nothing exactcheck forces reaches it."""
    rng = np.random.default_rng()
    return _numpy_uniforms(rng.random)(target_probs, draft_probs, draft_tokens, generator)


def numpy_global(target_probs, draft_probs, draft_tokens, generator):
    """Exact, with every random number from numpy's global generator (``np.random.random``, as
    older numpy code does): it ignores the generator it is handed, and a draw there moves the
    global generator's position without necessarily refilling its key."""
    return _numpy_uniforms(np.random.random)(target_probs, draft_probs, draft_tokens, generator)


def numpy_random_state(target_probs, draft_probs, draft_tokens, generator):
    """Exact, drawing from a ``np.random.RandomState()`` made on each call (legacy numpy, seeded
    from OS entropy): no snapshot sees it; only its output, which changes between identical
    forced calls, gives it away."""
    state = np.random.RandomState()
    return _numpy_uniforms(state.random_sample)(target_probs, draft_probs, draft_tokens, generator)


_KEPT = np.random.default_rng(2024)


def kept_numpy_generator(target_probs, draft_probs, draft_tokens, generator):
    """Exact, drawing from a numpy Generator seeded once at import and kept: the same numbers in
    every process, but its state moves from call to call, out of sight of every snapshot."""
    return _numpy_uniforms(_KEPT.random)(target_probs, draft_probs, draft_tokens, generator)


CORRECT_VERIFIERS = {f.__name__: f for f in (
    mirrored_uniform_product, mirrored_float64_ratio, float32_ratio_strict, float64_nonstrict_guarded, log_space,
    gumbel_max_residual, exponential_race, lazy_per_position, jit_residual, compiled_residual, compiled_step,
    logits_float32_softmax, logits_log_softmax, global_rng_per_row, reseeded_global_script, numpy_unseeded,
    numpy_global, numpy_random_state, kept_numpy_generator)}
"""Name -> exact verifier. Each is importable as ``exactcheck.corpus.verifiers:NAME``."""

REPRODUCIBILITY_ONLY = ("global_rng_per_row", "numpy_unseeded", "numpy_global", "numpy_random_state",
                        "kept_numpy_generator")
"""Corpus members whose only finding should be in the reproducibility category (they ignore the
generator they are handed)."""
