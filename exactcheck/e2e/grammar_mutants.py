"""Structured-output mutants of the reference loop (issue 68; field notes section 8: vLLM #36138,
#44993, #48516, #48228, SGLang #21723, openvino.genai #4081, ollama #18105).

Each overrides one step of ``exactcheck.e2e.loop.ReferenceSpeculativeLoop`` to get the grammar
mask wrong where a speculative block crosses a grammar event: a rejected draft, a position past
the block's first, the bonus token, the grammar's end, a reasoning boundary. ``found_on`` names
the structured worlds where the quick audit finds each one (``toy_models.structured``,
``toy_models.grammar``; ``benchmarks/structured_output.py mutants`` measures them).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from exactcheck.e2e.loop import ReferenceSpeculativeLoop

__all__ = ["MatcherNotRolledBack", "FirstMaskForBlock", "BonusUnmasked", "TokensPastAccept",
           "ConstraintOneTokenLate", "GRAMMAR_MUTANTS"]


def _unmasked(policy):
    return dataclasses.replace(policy, mask=None)


def _rows_unmasked_where(logits, policy, prefixes, lifted: list[bool]) -> torch.Tensor:
    """The policy's rows, with the mask lifted from the rows where ``lifted``."""
    rows = policy.probabilities(logits, prefixes)
    if any(lifted):
        index = torch.tensor(lifted, device=logits.device)
        kept = [p for p, off in zip(prefixes, lifted) if off]
        rows[index] = _unmasked(policy).probabilities(logits[index], kept).to(rows.dtype)
    return rows


@dataclass(frozen=True)
class MatcherNotRolledBack(ReferenceSpeculativeLoop):
    """The grammar matcher is advanced through the drafts to mask the verified positions and never
    rolled back: after a rejection it keeps the rejected drafts it consumed, then takes the
    correction, and every later mask is computed from that prefix."""

    name: str = "mutant: matcher_not_rolled_back"
    found_on = ("json_v13_k3", "choice_v9", "think_choice_v9")

    def verified_prefixes(self, generated, drafts, policy, counters):
        if policy.mask is None:
            return super().verified_prefixes(generated, drafts, policy, counters)
        state = _advance_past_last_round(counters, generated)
        consumed: list[int] = []
        for token in drafts:  # a matcher takes a draft only where the grammar allows it
            if token not in policy.mask(state + tuple(consumed)):
                break
            consumed.append(token)
        counters["matcher_drafts"] = tuple(consumed)
        return [state + tuple(consumed[:j]) for j in range(len(drafts) + 1)]


def _advance_past_last_round(counters: dict, generated: tuple) -> tuple:
    """The matcher's tokens now: last round's, the drafts it consumed then (none rolled back),
    and the committed tokens after the accepted ones (the correction, or the bonus)."""
    state, consumed = counters.get("matcher", ()), counters.get("matcher_drafts", ())
    new = generated[counters.get("matcher_seen", 0):]
    accepted = 0
    while accepted < min(len(consumed), len(new)) and consumed[accepted] == new[accepted]:
        accepted += 1
    state = state + consumed + new[accepted:]
    counters["matcher"], counters["matcher_seen"] = state, len(generated)
    return state


@dataclass(frozen=True)
class FirstMaskForBlock(ReferenceSpeculativeLoop):
    """The mask of the block's first position is reused for every verified position and the
    bonus (one bitmask filled per round, not one per position)."""

    name: str = "mutant: first_mask_for_block"
    found_on = ("json_v13_k3", "choice_v9", "think_choice_v9")

    def verified_prefixes(self, generated, drafts, policy, counters):
        return [generated] * (len(drafts) + 1)


@dataclass(frozen=True)
class BonusUnmasked(ReferenceSpeculativeLoop):
    """The verified positions are masked; the bonus row (after every draft is accepted) is the
    plain target row. (``choice_v9`` cannot show it: its answers end by the fourth token.)"""

    name: str = "mutant: bonus_unmasked"
    found_on = ("json_v13_k3", "think_choice_v9")

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "draft" or policy.mask is None:
            return policy.probabilities(logits, prefixes)
        return _rows_unmasked_where(logits, policy, prefixes, [False] * (len(prefixes) - 1) + [True])


@dataclass(frozen=True)
class TokensPastAccept(ReferenceSpeculativeLoop):
    """The engine stops masking once the grammar can only end (its mask allows nothing but a stop
    token): drafted tokens after the grammar's accept point are verified against the plain target
    and emitted, so the answer does not stop where the grammar does."""

    name: str = "mutant: tokens_past_accept"
    found_on = ("json_v13_k3", "choice_v9", "think_choice_v9")

    def policy_rows(self, logits, policy, prefixes, role):
        if policy.mask is None:
            return policy.probabilities(logits, prefixes)
        stops = set(policy.stop_tokens)
        ended = [bool(prefix) and prefix[-1] in stops for prefix in prefixes]
        lifted = [not end and set(policy.mask(tuple(prefix))) <= stops for prefix, end in zip(prefixes, ended)]
        return _rows_unmasked_where(logits, policy, prefixes, lifted)


@dataclass(frozen=True)
class ConstraintOneTokenLate(ReferenceSpeculativeLoop):
    """After the reasoning end (the mask's ``end_of_thinking`` token) the constraint is switched on
    one token late: the first answer token is drawn from the free (unmasked) law, in draft and
    target rows alike."""

    name: str = "mutant: constraint_one_token_late"
    found_on = ("think_choice_v9",)

    def policy_rows(self, logits, policy, prefixes, role):
        end = getattr(policy.mask, "end_of_thinking", None)
        if end is None:
            return policy.probabilities(logits, prefixes)
        return _rows_unmasked_where(logits, policy, prefixes, [bool(p) and p[-1] == end for p in prefixes])


GRAMMAR_MUTANTS = (MatcherNotRolledBack(), FirstMaskForBlock(), BonusUnmasked(), TokensPastAccept(),
                   ConstraintOneTokenLate())
