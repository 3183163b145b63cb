"""The mutant corpus: verifiers with exactly one deliberate defect each.

Each mutant subclasses ``ReferenceVerifier`` and overrides one step, so the defect is the only
difference from the exact reference. ``exactcheck selftest`` audits every mutant; a suite that
misses one has lost power. Each docstring names the real bug class the mutant stands for
(``../shared/field-notes.md``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.reference_verifier import ReferenceVerifier, final_pq, row_at
from exactcheck.step.rule_references import BlockVerifier, ThresholdVerifier

__all__ = ["Mutant", "MUTANTS", "SMALL_BIAS_MUTANTS", "CONVENTION_PRECISION_MUTANTS", "mutant"]


class TrustDraft(ReferenceVerifier):
    """Every draft token is accepted: the output follows q, not p."""

    def accept(self, u, p, q):
        return torch.ones_like(u, dtype=torch.bool)


class ResampleFromTarget(ReferenceVerifier):
    """After a rejection the correction is drawn from the full target row p, not the residual."""

    def final_rows(self, target, draft_probs, n):
        rows = row_at(target, n).double()
        return rows / rows.sum(1, keepdim=True)


class UnclampedResidual(ReferenceVerifier):
    """The residual p - q is normalised by its positive mass but its negative entries are kept,
    so the cumulative sum dips and the inverse-CDF draw lands on the wrong tokens."""

    def final_rows(self, target, draft_probs, n):
        p, q = (rows.double() for rows in final_pq(target, draft_probs, n))
        positive = (p - q).clamp(min=0).sum(1, keepdim=True)
        return (p - q) / torch.where(positive > 0, positive, 1.0)


class WrongNormaliser(ReferenceVerifier):
    """The residual is divided by sum |p - q| (twice the right constant); the missing half of the
    cumulative mass falls to the last token."""

    def final_rows(self, target, draft_probs, n):
        p, q = (rows.double() for rows in final_pq(target, draft_probs, n))
        residual = (p - q).clamp(min=0)
        return residual / (p - q).abs().sum(1, keepdim=True).clamp(min=1e-300)


class InvertedRatio(ReferenceVerifier):
    """Acceptance probability min(1, q/p) instead of min(1, p/q)."""

    def accept(self, u, p, q):
        return u * p < q


class AcceptIfTargetAtLeastDraft(ReferenceVerifier):
    """Deterministic acceptance: accept iff p(x) >= q(x)."""

    def accept(self, u, p, q):
        return p >= q


class NoStopAtFirstRejection(ReferenceVerifier):
    """Counts every accepted position instead of stopping at the first rejection."""

    def accepted_length(self, accepted):
        return accepted.sum(1)


class BonusFromDraft(ReferenceVerifier):
    """After k acceptances the bonus is drawn from the last draft row q_{k-1}, not p_k."""

    def final_rows(self, target, draft_probs, n):
        rows = super().final_rows(target, draft_probs, n)
        k = draft_probs.shape[1]
        bonus = n == k
        q = draft_probs[bonus, k - 1].double()
        rows[bonus] = q / q.sum(1, keepdim=True)
        return rows


class BonusArgmax(ReferenceVerifier):
    """The bonus token is the argmax of p_k instead of a sample from it."""

    def final_rows(self, target, draft_probs, n):
        rows = super().final_rows(target, draft_probs, n)
        bonus = n == draft_probs.shape[1]
        top = rows[bonus].argmax(1)
        rows[bonus] = torch.nn.functional.one_hot(top, rows.shape[1]).double()
        return rows


class NoBonusToken(ReferenceVerifier):
    """After k acceptances no bonus token is emitted (the step wastes the target's last row)."""

    def assemble(self, draft_tokens, n, last):
        out = super().assemble(draft_tokens, n, last)
        out[n == draft_tokens.shape[1], -1] = -1
        return out


class ShiftedTargetRows(ReferenceVerifier):
    """The target rows are read one position late: draft i is judged against p_{i+1}."""

    def target_rows(self, target_probs):
        return torch.cat([target_probs[:, 1:], target_probs[:, -1:]], 1)


class AcceptOnEqualUniform(ReferenceVerifier):
    """``u <= p/q``: a uniform of exactly 0 accepts a token the target forbids (p = 0).
    A 53-bit uniform is 0 with probability 2^-53, so only boundary randomness can see it."""

    def accept(self, u, p, q):
        return u <= p / q


class ReseededGenerator(ReferenceVerifier):
    """The generator is reseeded with a constant at every call: each row reuses the same random
    numbers at every verify step of its sequence."""

    def acceptance_uniforms(self, batch, k, generator, device, row_generators=None):
        generator.manual_seed(1234)
        return super().acceptance_uniforms(batch, k, generator, device, row_generators)


class SharedUniforms(ReferenceVerifier):
    """The uniform that decided acceptance at the stop position is reused to draw the
    correction or bonus token, so that draw is conditioned on the accept/reject outcome."""

    def final_uniforms(self, batch, generator, device, u_accept, n, row_generators=None):
        k = u_accept.shape[1]
        return u_accept[torch.arange(batch, device=device), n.clamp(max=k - 1)]


class UnguardedZeroResidual(ReferenceVerifier):
    """The residual is divided by its sum without guarding a zero sum: when p and q agree up to
    rounding and a draft is still rejected, the row is NaN and the draw lands on token 0."""

    def final_rows(self, target, draft_probs, n):
        p, q = (rows.double() for rows in final_pq(target, draft_probs, n))
        residual = (p - q).clamp_(min=0)
        return residual / residual.sum(1, keepdim=True)


class ZeroResidualToVocab(ReferenceVerifier):
    """A zero residual is neither guarded nor clamped: its row stays all-zero and the inverse-CDF
    count of entries <= u is V, an out-of-vocabulary id (vLLM's DoS reports)."""

    def final_rows(self, target, draft_probs, n):
        p, q = (rows.double() for rows in final_pq(target, draft_probs, n))
        residual = (p - q).clamp_(min=0)
        mass = residual.sum(1, keepdim=True)
        return residual / torch.where(mass > 0, mass, 1.0)

    def sample_final(self, rows, u):
        return (rows.cumsum(1) <= u[:, None]).sum(1)


class RatioInHalfPrecision(ReferenceVerifier):
    """The acceptance ratio p/q is computed in float16 (ratios off by up to 2^-11; tiny p or q
    underflow)."""

    def accept(self, u, p, q):
        return u < (p.half() / q.half()).double()


class TinyDraftProbabilityAccepted(ReferenceVerifier):
    """Drafts with q < 1e-6 are accepted outright ("the ratio is huge anyway"), including drafts
    the target forbids."""

    def accept(self, u, p, q):
        return (u * q < p) | (q < 1e-6)


class UninitialisedUnseededRows(ReferenceVerifier):
    """With per-row generators, the uniform buffer comes from torch.empty and only the seeded rows
    are filled: unseeded rows read uninitialised memory (vLLM PR #10863)."""

    def acceptance_uniforms(self, batch, k, generator, device, row_generators=None):
        if not row_generators:
            return super().acceptance_uniforms(batch, k, generator, device)
        u = torch.empty(batch, k, dtype=torch.float64, device=device)
        for row, gen in enumerate(row_generators):
            if gen is not None:
                u[row] = torch.rand(k, dtype=torch.float64, generator=gen, device=device)
        return u


class ExponentialRaceNaN(ReferenceVerifier):
    """The correction is drawn by an exponential race, argmax(r / E) with E ~ Exp(1) in float32,
    over the whole row: an exponential of exactly 0 on a zero-mass token makes 0/0 = NaN, which
    argmax takes, so a token the target forbids is emitted (one float32 draw, about 2^-24).
    ``final_uniforms`` hands the generator on and ``sample_final`` draws the exponentials."""

    def final_uniforms(self, batch, generator, device, u_accept, n, row_generators=None):
        return generator

    def sample_final(self, rows, generator):
        e = torch.empty(rows.shape, dtype=torch.float32, device=rows.device).exponential_(generator=generator)
        return (rows / e.double()).argmax(1)


# -- mutants of the other registered rules (each declares the rule it means to follow) -------------

class BlockStopFromCurrentRow(BlockVerifier):
    """Block verification whose stop probability h_j reads the rows of the draft just accepted
    (row j - 1) instead of the next position's (row j): the off-by-one of vllm-ascend PR #7808's
    PyTorch fallback."""

    def stop_probabilities(self, p, q, w):
        return super().stop_probabilities(torch.cat([p[:, :1], p[:, :-1]], 1),
                                          torch.cat([q[:, :1], q[:, :-1]], 1), w)


class BlockCorrectionAtNextPosition(BlockVerifier):
    """Block verification that draws the token after tau accepted drafts from the rows of position
    tau + 1 (weight, target and draft row), not tau's."""

    def block_final_rows(self, target, draft_probs, n, w):
        return super().block_final_rows(target, draft_probs, (n + 1).clamp(max=draft_probs.shape[1]), w)


class BlockAcceptsAtZero(BlockVerifier):
    """Block verification that takes u <= h without excluding h = 0: a uniform of exactly 0 stops
    at a position of stop probability 0, past a draft the target forbids (one float64 draw,
    2^-53; vLLM clamps its uniforms to >= 2^-31 for this)."""

    def stop_position(self, u, h, w):
        passes = u <= h[:, 1:]
        return torch.where(passes, torch.arange(1, h.shape[1], device=u.device), 0).max(1).values


class BlockProductOfUniforms(BlockVerifier):
    """vllm-ascend #7807: the prefix of i drafts is kept when its weight w_i is at least the running
    product of the uniforms u_1 ... u_i (no stop probability h): the token-wise test in disguise
    with block's residual, lossy."""

    def stop_position(self, u, h, w):
        legal = w[:, 1:] >= u.cumprod(1)
        return torch.where(legal, torch.arange(1, w.shape[1], device=u.device), 0).max(1).values


class ThresholdAccMultiplied(ThresholdVerifier):
    """SGLang's acceptance threshold applied the wrong way round (u < p(d) * acc instead of
    u < p(d) / acc): declares threshold_acc 0.5 and accepts four times less often than it says."""

    def accept(self, u, p, q):
        return (p > 0) & ((u < p * self.acc) | (p >= self.single))


@dataclass(frozen=True)
class Mutant:
    name: str
    verifier: ReferenceVerifier
    defect: str

    @property
    def rule(self) -> str:
        """The rule the mutant declares it follows."""
        return self.verifier.acceptance_rule


_CLASSES = {
    "trust_draft": TrustDraft,
    "resample_from_target": ResampleFromTarget,
    "unclamped_residual": UnclampedResidual,
    "wrong_normaliser": WrongNormaliser,
    "inverted_ratio": InvertedRatio,
    "accept_if_p_ge_q": AcceptIfTargetAtLeastDraft,
    "no_stop_at_first_rejection": NoStopAtFirstRejection,
    "bonus_from_draft": BonusFromDraft,
    "bonus_argmax": BonusArgmax,
    "no_bonus_token": NoBonusToken,
    "shifted_target_rows": ShiftedTargetRows,
    "accept_on_equal_uniform": AcceptOnEqualUniform,
    "reseeded_generator": ReseededGenerator,
    "shared_uniforms": SharedUniforms,
    "unguarded_zero_residual": UnguardedZeroResidual,
    "zero_residual_to_vocab": ZeroResidualToVocab,
    "ratio_in_half_precision": RatioInHalfPrecision,
    "tiny_q_accepted": TinyDraftProbabilityAccepted,
    "uninitialised_unseeded_rows": UninitialisedUnseededRows,
    "exponential_race_nan": ExponentialRaceNaN,
    "block_stop_from_current_row": BlockStopFromCurrentRow,
    "block_correction_at_next_position": BlockCorrectionAtNextPosition,
    "block_accepts_at_zero": BlockAcceptsAtZero,
    "block_product_of_uniforms": BlockProductOfUniforms,
    "threshold_acc_multiplied": ThresholdAccMultiplied,
}

MUTANTS: dict[str, Mutant] = {
    name: Mutant(name, cls(), " ".join(cls.__doc__.split())) for name, cls in _CLASSES.items()
}
for _name, _m in MUTANTS.items():
    _m.verifier.name = _name


def importable_name(name: str) -> str:
    """The module attribute a mutant is importable as (``MODULE:CALLABLE`` on the command line)."""
    return name.replace(".", "_").replace("-", "_")


def mutant(name: str) -> ReferenceVerifier:
    """The mutant verifier called ``name``."""
    return MUTANTS[name].verifier


# Convention x precision mutants (issue 44): the acceptance ratio p/q computed in a dtype coarser
# than the rows, compared with u (direct) or with 1 - u (mirrored, ``u = 1 - torch.rand()``). Each
# takes a wrong decision on the uniforms between the coarse ratio and the exact one (a fraction of
# about 2^-11 of p/q for float16, 2^-8 for bfloat16): laws cannot see it (TV about 1e-4), the
# acceptance property must, under either convention and at any drafted position. Not in MUTANTS
# (the selftest's corpus; ``ratio_in_half_precision`` is there, the direct float16 one):
# ``benchmarks/convention_precision.py`` audits these four.

class CoarseRatio(ReferenceVerifier):
    """Accept when u (or 1 - u) < p/q, the ratio computed in ``dtype``."""

    def __init__(self, dtype: torch.dtype, mirrored: bool):
        self.dtype, self.mirrored = dtype, mirrored

    def accept(self, u, p, q):
        u = 1.0 - u if self.mirrored else u
        return u < (p.to(self.dtype) / q.to(self.dtype)).double()


def _coarse(dtype, mirrored) -> Mutant:
    kind = {torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    convention = "u = 1 - torch.rand(), " if mirrored else ""
    name = ("mirrored_" if mirrored else "") + ("ratio_in_half_precision" if dtype is torch.float16
                                                 else "ratio_in_bfloat16")
    return Mutant(name, CoarseRatio(dtype, mirrored),
                  f"{convention}acceptance ratio p/q computed in {kind}")


CONVENTION_PRECISION_MUTANTS: dict[str, Mutant] = {
    "ratio_in_half_precision": MUTANTS["ratio_in_half_precision"],
    **{m.name: m for m in (_coarse(torch.bfloat16, False), _coarse(torch.float16, True), _coarse(torch.bfloat16, True))},
}
for _m in CONVENTION_PRECISION_MUTANTS.values():
    _m.verifier.name = _m.name


# Small-bias mutants: plausible numerical slips whose TV is 0.002 to 0.05, the range the engines'
# own tests cannot see. They are not in MUTANTS (the selftest's must-detect corpus): whether a
# level detects them is a question of budget, measured in benchmarks/power.py.

class ScaledAcceptance(ReferenceVerifier):
    """The acceptance probability is scaled down by a constant (min(1, c p/q) instead of
    min(1, p/q)), as when a probability is computed in a lower precision or with a stale
    normaliser."""

    def __init__(self, factor: float = 0.98):
        self.factor = factor

    def accept(self, u, p, q):
        return u * q < self.factor * p


class LeakyResidual(ReferenceVerifier):
    """The residual is max(0, p - c q) with c < 1: the draft's mass is not fully subtracted."""

    def __init__(self, factor: float = 0.9):
        self.factor = factor

    def final_rows(self, target, draft_probs, n):
        p, q = (rows.double() for rows in final_pq(target, draft_probs, n))
        residual = (p - self.factor * q).clamp(min=0)
        return residual / residual.sum(1, keepdim=True)


class DroppedTailMass(ReferenceVerifier):
    """Target probabilities below a threshold are set to zero and the rows renormalised (a
    'min-p'-style pruning applied where no policy asked for it)."""

    def __init__(self, threshold: float = 1e-4):
        self.threshold = threshold

    def target_rows(self, target_probs):
        rows = torch.where(target_probs < self.threshold, 0.0, target_probs.double())
        return (rows / rows.sum(-1, keepdim=True)).to(target_probs.dtype)


class TargetTemperature(ReferenceVerifier):
    """The target rows are taken to a temperature T != 1 again (p^(1/T), renormalised): a
    temperature applied twice, or to the wrong logits."""

    def __init__(self, temperature: float = 1.05):
        self.temperature = temperature

    def target_rows(self, target_probs):
        rows = target_probs.double().pow(1 / self.temperature)
        return (rows / rows.sum(-1, keepdim=True)).to(target_probs.dtype)


SMALL_BIAS_MUTANTS: dict[str, Mutant] = {
    m.name: m for m in (
        Mutant("acceptance_x0.98", ScaledAcceptance(0.98), "acceptance probability scaled by 0.98"),
        Mutant("acceptance_x0.995", ScaledAcceptance(0.995), "acceptance probability scaled by 0.995"),
        Mutant("residual_p-0.9q", LeakyResidual(0.9), "residual max(0, p - 0.9 q)"),
        Mutant("residual_p-0.97q", LeakyResidual(0.97), "residual max(0, p - 0.97 q)"),
        Mutant("dropped_below_1e-4", DroppedTailMass(1e-4), "target mass below 1e-4 dropped"),
        Mutant("temperature_1.05", TargetTemperature(1.05), "target taken to temperature 1.05"),
    )
}
for _m in SMALL_BIAS_MUTANTS.values():
    _m.verifier.name = _m.name

# importable as exactcheck.step.mutants:NAME (e.g. :trust_draft, :temperature_1_05)
_BY_ATTRIBUTE = {importable_name(m.name): m.verifier
                 for m in (*MUTANTS.values(), *SMALL_BIAS_MUTANTS.values(), *CONVENTION_PRECISION_MUTANTS.values())}


def __getattr__(name: str) -> ReferenceVerifier:
    try:
        return _BY_ATTRIBUTE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
