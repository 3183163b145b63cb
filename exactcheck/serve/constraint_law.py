"""The law of a constrained world (structured output): the target's law masked by the constraint at
every prefix and renormalised, from the reference's raw probabilities.

At each prefix of an answer the constraint allows some tokens (``constraints.allowed_tokens``: the
local engine over the text of the prefix, read from the server's own pieces, ``Endpoint.
continuation_texts``); an end-of-generation token is allowed where the text is a whole answer, and
the answer ends there (``continuation_law.expand`` with ``ends``). The reference is asked its raw
law (temperature 1, no truncation, end of generation not masked, no constraint: its one-token
requests are the target alone), and the mask meets the sampler chain in the engine's order
(``Endpoint.constraint_order``):

- "mask-first" (vLLM, SGLang: the grammar's bitmask on the logits, then the chain): the chain of the
  masked, renormalised raw law;
- "check-then-resample" (llama.cpp's ``common_sampler_sample``: the chain samples; a token the grammar
  rejects is sampled again with the grammar applied first): ``chain(x) 1[x allowed] + chain(rejected)
  chain(masked)(x)``. At temperature 1 without truncation both are the masked raw law.

Where the raw list leaves mass unlisted, an unlisted token could be allowed: not determinable (raise
``--n-probs`` to the vocabulary). An answer that leaves the constraint falls in no cell (probability
0): a finding only where the server's own text for it is the text the audit reads for its tokens
(``confirmed_outside``), the guard stop strings use; else the world is not judged, with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from exactcheck.endpoints.constraints import Constraint, Matcher, allowed_tokens, matcher
from exactcheck.endpoints.continuation_law import ContinuationLaw, NextTokenLaw, expand
from exactcheck.endpoints.endpoint import RAW, Completion, Endpoint, Sampling
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw

__all__ = ["ConstraintMask", "masked_law", "constrained_law", "outside", "confirmed_outside"]


@dataclass
class ConstraintMask:
    """The constraint's local engine over one server's tokens after one prompt: each token's piece (read
    once, from the server), the end-of-generation ids, and the text of a prefix of the answer."""

    constraint: Constraint
    match: Matcher
    reference: Endpoint
    prompt: tuple[int, ...]
    eog: frozenset[int]
    pieces: dict[int, str] = field(default_factory=dict)

    @classmethod
    def build(cls, constraint: Constraint, reference: Endpoint, prompt: Sequence[int],
              eog: frozenset[int]) -> "ConstraintMask":
        return cls(constraint, matcher(constraint), reference, tuple(prompt), frozenset(eog))

    def read(self, tokens) -> None:
        """The pieces of ``tokens`` not read yet (one request batch)."""
        missing = sorted({int(t) for t in tokens} - set(self.pieces) - self.eog)
        if missing:
            texts = self.reference.constraint_pieces(self.prompt, missing)
            self.pieces.update(zip(missing, texts))

    def text(self, prefix: Sequence[int]) -> str:
        self.read(prefix)
        return "".join(self.pieces[t] for t in prefix if t not in self.eog)

    def allowed(self, prefix: Sequence[int], candidates) -> frozenset[int]:
        """Which of ``candidates`` the constraint allows after ``prefix``."""
        self.read(candidates)
        pieces = {t: self.pieces[t] for t in candidates if t not in self.eog}
        return allowed_tokens(self.match, self.text(prefix), pieces, self.eog & set(candidates))


def masked_law(raw: NextTokenLaw, allowed: frozenset[int], sampling: Sampling, order: str) -> NextTokenLaw:
    """The law of the next token under ``sampling`` with the mask ``allowed``, from the raw law, in the
    engine's ``order`` (module docstring)."""
    chain_settings = replace(sampling, constraint=None, stop=())
    if raw.other > 0:
        raise NotDeterminable(f"the reference listed {len(raw.probabilities)} tokens and left {raw.other:.3g} of the "
                              f"mass unlisted: whether an unlisted token is allowed is not known (raise --n-probs to "
                              f"the vocabulary)")
    kept = {t: p for t, p in raw.probabilities.items() if t in allowed}
    total = sum(kept.values())
    if total <= 0:
        raise NotDeterminable("the constraint allows no token the reference gives positive probability here")
    masked = sampling_law_from_raw(NextTokenLaw({t: p / total for t, p in kept.items()}, 0.0), chain_settings)
    if order == "mask-first":
        return masked
    chain = sampling_law_from_raw(raw, chain_settings)
    rejected = sum(p for t, p in chain.probabilities.items() if t not in allowed) + chain.other
    law = {t: chain.probabilities.get(t, 0.0) * (t in allowed) + rejected * masked.probabilities.get(t, 0.0)
           for t in set(chain.probabilities) | set(masked.probabilities)}
    return NextTokenLaw({t: p for t, p in law.items() if p > 0}, 0.0)


def constrained_law(reference: Endpoint, mask: ConstraintMask, sampling: Sampling, length: int, n_probs: int,
                    min_mass: float, max_calls: int, order: str) -> ContinuationLaw:
    """The constrained world's law of its first ``length`` tokens (an answer ends at an end of
    generation, which the mask allows only where the constraint is complete)."""
    prompt = list(mask.prompt)
    asked = replace(sampling, constraint=None)

    def next_token(prefix: tuple[int, ...]) -> NextTokenLaw:
        raw = reference.next_token_laws(prompt, [prefix], asked, n_probs, kind=RAW)[0]
        return masked_law(raw, mask.allowed(prefix, raw.probabilities), sampling, order)

    return expand(next_token, length, min_mass=min_mass, max_calls=max_calls, ends=lambda p: p[-1] in mask.eog)


def outside(answers: Sequence[Completion], mask: ConstraintMask) -> list[Completion]:
    """The answers whose tokens leave the constraint, by the audit's reading of their text: a token the
    mask does not allow after its prefix (an end of generation before the text is whole, a piece that
    makes the text unviable, a token after an end of generation)."""
    mask.read(t for a in answers for t in a.tokens)
    out = []
    for answer in answers:
        text, ended = "", False
        for token in answer.tokens:
            if ended:
                break
            if token in mask.eog:
                ended = True
                if not mask.match.complete(text):
                    break
                continue
            piece = mask.pieces[token]
            if not piece or not mask.match.viable(text + piece):
                break
            text += piece
        else:
            continue
        out.append(answer)
    return out


def confirmed_outside(wrong: Sequence[Completion], mask: ConstraintMask) -> tuple[str | None, str]:
    """(why the answers ``wrong`` (``outside``) cannot be a finding, or None; words for the finding).
    Each must have come back with the text the audit reads for its tokens: the server's own text then
    leaves the constraint too."""
    first = wrong[0]
    words = (f"{len(wrong):,} answer{'s' * (len(wrong) != 1)} outside the constraint ({mask.constraint.describe()}; "
             f"e.g. {list(first.tokens)[:12]}, text {mask.text(first.tokens)!r})")
    for answer in wrong:
        read = mask.text(answer.tokens)
        if answer.text is None:
            return (f"{words}, and the server returned no text to confirm the audit's reading of their pieces"), words
        if answer.text != read:
            return (f"{words}; the server returned text {answer.text!r} with {list(answer.tokens)[:12]}, where the "
                    f"audit reads {read!r}: its reading of the pieces is not the server's"), words
    return None, words
