"""Speculative decoding between a draft and a target with different tokenizers: exactcheck's
references, written from the paper, and their mutants.

Timor et al., "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025, arXiv 2502.05202), give three algorithms; two are here:

- ``TokenLevelIntersection`` (TLI): the draft samples only among the tokens both vocabularies
  spell alike (its law restricted to them and renormalised), each candidate is mapped to the
  target's id for the same string, and the target verifies with standard speculative sampling
  against that mapped q. The q reported for a candidate is the law it was drawn from, so the output
  law is the target's law of target token sequences, whatever the draft is shown.
- ``StringLevelExactMatch`` (SLEM): the draft samples freely in its own vocabulary; its text is
  re-tokenised with the target's tokenizer (canonically); the target then samples its own token at
  each position and keeps a candidate only when its sample equals it (exact match). Every emitted
  token is a draw from the target's row at the emitted prefix, so the law is again the target's
  law of token sequences, non-canonical spellings included.

The third, SLRS (string-level rejection sampling), accepts a drafted string with the ratio of the
target's and the draft's probabilities of producing that string, summed over every tokenisation
of it: ``exactcheck.e2e.string_rejection``.

The draft is driven on its own ids: the committed target tokens are decoded to text
(special tokens skipped) and that text encoded with the draft's tokenizer, every round. No KV cache
(each forward recomputes its prefix), so only the laws judge these loops.

Both follow the two-vocabulary generator contract (``exactcheck.contracts.generator``:
``different_tokenizers = True``, keywords ``target_tokenizer`` and ``draft_tokenizer``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from exactcheck.contracts.generator import Capabilities, DecodingPolicy, DraftRecord, Generation
from exactcheck.e2e.loop import stop_at
from exactcheck.contracts.reference_verifier import ReferenceVerifier

__all__ = ["TwoVocabularyLoop", "TokenLevelIntersection", "StringLevelExactMatch", "shared_token_map", "draft_policy",
           "last_logits", "TWO_VOCAB_MUTANTS",
           "QWrittenInVocabOrder", "DraftOnlyMassInQ", "TargetOnlyTokensInQ", "CommittedTokensRetokenised",
           "DraftStopInTargetIds"]


def shared_token_map(target_tokenizer, draft_tokenizer, draft_vocab_size: int) -> torch.Tensor:
    """[V_draft] int64: the target id of each draft id's string, -1 where the target has no such
    token (read by string from both ``get_vocab()`` maps, never by iteration order)."""
    target = target_tokenizer.get_vocab()
    mapping = torch.full((draft_vocab_size,), -1, dtype=torch.int64)
    for token, draft_id in draft_tokenizer.get_vocab().items():
        if draft_id < draft_vocab_size and token in target:
            mapping[draft_id] = target[token]
    return mapping


def _in_target_ids(q_draft: torch.Tensor, mapping: torch.Tensor, vocab_t: int) -> torch.Tensor:
    """The draft's row over the shared tokens, written at their target ids (not renormalised)."""
    q = torch.zeros(vocab_t, dtype=torch.float64, device=q_draft.device)
    shared = mapping >= 0
    q[mapping[shared]] = q_draft[shared]
    return q


def draft_policy(policy: DecodingPolicy) -> DecodingPolicy:
    """The policy's sampling settings without what is stated in target ids (bias, bans, stops, a
    mask): how the draft samples in its own vocabulary."""
    return dataclasses.replace(policy, logit_bias=(), banned_tokens=(), stop_tokens=(), mask=None, name=None)


def last_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids[None], use_cache=False).logits[0, -1]


@dataclass(frozen=True)
class TwoVocabularyLoop:
    """What both references share: the draft's context from the committed text, the target's rows."""

    draft_length: int = 3
    different_tokenizers = True

    def draft_context(self, sequence: torch.Tensor, target_tokenizer, draft_tokenizer, device) -> torch.Tensor:
        text = target_tokenizer.decode(sequence.tolist(), skip_special_tokens=True)
        ids = draft_tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.tensor(ids, dtype=torch.int64, device=device)

    def target_rows(self, target, sequence: torch.Tensor, candidates: list[int], policy: DecodingPolicy,
                    prompt: int) -> torch.Tensor:
        """The policy's law at the committed sequence and after each candidate: [m + 1, V] float64."""
        ids = torch.cat([sequence, torch.tensor(candidates, dtype=torch.int64, device=sequence.device)])
        logits = target(input_ids=ids[None], use_cache=False).logits[0, -(len(candidates) + 1):]
        generated = tuple(sequence[prompt:].tolist())
        prefixes = [generated + tuple(candidates[:j]) for j in range(len(candidates) + 1)]
        return policy.probabilities(logits, prefixes)


@dataclass(frozen=True)
class TokenLevelIntersection(TwoVocabularyLoop):
    """TLI: the draft restricted to the shared tokens, its q mapped into target ids, verified by
    standard speculative sampling (``exactcheck.contracts.reference_verifier.ReferenceVerifier``)."""

    name: str = "exactcheck TLI reference (token-level intersection, Timor et al. 2025)"
    capabilities = Capabilities(cache=False, reports_draft_q=True, grammar_masks=False)

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed, *, target_tokenizer,
                 draft_tokenizer) -> Generation:
        device = target.device
        generator = torch.Generator(device=device).manual_seed(seed)
        vocab_t, vocab_d = target.config.vocab_size, draft.config.vocab_size
        mapping = shared_token_map(target_tokenizer, draft_tokenizer, vocab_d).to(device)
        to_draft = {int(t): d for d, t in enumerate(mapping.tolist()) if t >= 0}
        sequence, prompt = input_ids[0].to(device), input_ids.shape[1]
        records: list[DraftRecord] = []
        with torch.no_grad():
            while sequence.numel() - prompt < max_new_tokens:
                context = self.draft_context(sequence, target_tokenizer, draft_tokenizer, device)
                candidates, rows, stop = [], [], False
                for _ in range(self.draft_length):
                    if context.numel() == 0:
                        break
                    q_draft = draft_policy(policy).probabilities(last_logits(draft, context)[None])[0]
                    law = self.sampling_law(q_draft, mapping, vocab_t)
                    if not law.sum() > 0:
                        break  # no shared mass: nothing to draft this round
                    q = self.target_q(law, q_draft, mapping, vocab_t, draft_tokenizer)
                    x = int(torch.multinomial(law, 1, generator=generator))
                    candidates.append(x)
                    rows.append(q)
                    context = torch.cat([context, torch.tensor([to_draft[x]], device=device)])
                    if self.draft_stops(to_draft[x], x, policy):
                        stop = True
                        break
                records += [DraftRecord(x, row.cpu()) for x, row in zip(candidates, rows)]
                p = self.target_rows(target, sequence, candidates, policy, prompt)
                if candidates:
                    q_rows = torch.stack(rows)
                    out = ReferenceVerifier()(p[None].float(), q_rows[None].float(),
                                              torch.tensor([candidates], device=device), generator)[0]
                    emitted = out[out >= 0]
                else:
                    emitted = torch.multinomial(p[0].float(), 1, generator=generator)
                emitted = emitted[: max_new_tokens - (sequence.numel() - prompt)]
                keep, stopped = stop_at(emitted, policy)
                stopped = stopped or stop  # (only DraftStopInTargetIds: the draft's "stop" ends the generation)
                sequence = torch.cat([sequence, emitted[:keep]])
                if stopped:
                    break
        return Generation(sequence[None], drafts=tuple(records))

    # -- the steps a mutant overrides ---------------------------------------------------------
    def sampling_law(self, q_draft: torch.Tensor, mapping: torch.Tensor, vocab_t: int) -> torch.Tensor:
        """The law a candidate (a target id) is drawn from: the draft's law restricted to the
        shared tokens, renormalised, in target ids (all zeros when no shared token has mass)."""
        q = _in_target_ids(q_draft, mapping, vocab_t)
        total = q.sum()
        return q / total if total > 0 else q

    def target_q(self, law: torch.Tensor, q_draft: torch.Tensor, mapping: torch.Tensor, vocab_t: int,
                 draft_tokenizer) -> torch.Tensor:
        """The q reported and verified with, given the sampling ``law``: for the exact loop, the law."""
        return law

    def draft_stops(self, draft_id: int, target_id: int, policy: DecodingPolicy) -> bool:
        """Whether drafting ends at this candidate: the exact loop drafts on (a stop token among
        the candidates ends the output when it is emitted, ``stop_at``)."""
        return False


@dataclass(frozen=True)
class StringLevelExactMatch(TwoVocabularyLoop):
    """SLEM: the draft's text re-tokenised canonically for the target; the target's own samples
    kept while they equal the candidates (exact match)."""

    name: str = "exactcheck SLEM reference (string-level exact match, Timor et al. 2025)"
    capabilities = Capabilities(cache=False, grammar_masks=False)

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed, *, target_tokenizer,
                 draft_tokenizer) -> torch.Tensor:
        device = target.device
        generator = torch.Generator(device=device).manual_seed(seed)
        sequence, prompt = input_ids[0].to(device), input_ids.shape[1]
        with torch.no_grad():
            while sequence.numel() - prompt < max_new_tokens:
                context = self.draft_context(sequence, target_tokenizer, draft_tokenizer, device)
                drafted = []
                for _ in range(self.draft_length):
                    if context.numel() == 0:
                        break
                    q = draft_policy(policy).probabilities(last_logits(draft, context)[None])[0]
                    d = int(torch.multinomial(q.float(), 1, generator=generator))
                    drafted.append(d)
                    context = torch.cat([context, torch.tensor([d], device=device)])
                text = draft_tokenizer.decode(drafted, skip_special_tokens=True)
                candidates = list(target_tokenizer(text, add_special_tokens=False)["input_ids"])[: self.draft_length]
                p = self.target_rows(target, sequence, candidates, policy, prompt)
                emitted = []
                for j in range(len(candidates) + 1):
                    x = int(torch.multinomial(p[j].float(), 1, generator=generator))
                    emitted.append(x)
                    if j == len(candidates) or x != candidates[j]:
                        break
                emitted = torch.tensor(emitted, dtype=torch.int64, device=device)
                emitted = emitted[: max_new_tokens - (sequence.numel() - prompt)]
                keep, stopped = stop_at(emitted, policy)
                sequence = self.commit(sequence, emitted[:keep], prompt, target_tokenizer)
                if stopped:
                    break
        return sequence[None][:, : prompt + max_new_tokens]

    def commit(self, sequence: torch.Tensor, emitted: torch.Tensor, prompt: int, target_tokenizer) -> torch.Tensor:
        return torch.cat([sequence, emitted])


# -- mutants: the bug class of vocabulary translation --------------------------------------------

@dataclass(frozen=True)
class QWrittenInVocabOrder(TokenLevelIntersection):
    """The q of each shared token is written to another token: the target positions are taken in
    draft-id order, the values in the draft tokenizer's ``get_vocab()`` order (a hash order for a
    real fast tokenizer; alphabetical in the worlds), as transformers' pruned-head translator does
    (candidate_generator.py ``get_target_logits``). The candidates are drawn from the right law; the
    q verified with is not it."""

    name: str = "mutant: q_written_in_vocab_order"

    def target_q(self, law, q_draft, mapping, vocab_t, draft_tokenizer):
        order = [d for d in draft_tokenizer.get_vocab().values() if d < mapping.numel() and mapping[d] >= 0]
        positions = mapping[mapping >= 0]  # target ids, in draft-id order
        q = torch.zeros(vocab_t, dtype=torch.float64, device=q_draft.device)
        q[positions] = q_draft[torch.tensor(order, device=q_draft.device)]
        return q / q.sum()


@dataclass(frozen=True)
class DraftOnlyMassInQ(TokenLevelIntersection):
    """Draft-only mass left in q: the mapped q is not renormalised after the draft-only tokens are
    dropped (it sums to less than 1), so every candidate's ratio p/q is inflated."""

    name: str = "mutant: draft_only_mass_in_q"

    def target_q(self, law, q_draft, mapping, vocab_t, draft_tokenizer):
        return _in_target_ids(q_draft, mapping, vocab_t)


@dataclass(frozen=True)
class TargetOnlyTokensInQ(TokenLevelIntersection):
    """Target-only tokens given q > 0: the q verified with spreads a fifth of its mass over the
    tokens the draft cannot propose (a smoothed translation), so the residual under-weights them."""

    name: str = "mutant: target_only_tokens_in_q"

    def target_q(self, law, q_draft, mapping, vocab_t, draft_tokenizer):
        q = law
        only = torch.ones(vocab_t, dtype=torch.bool, device=q.device)
        only[mapping[mapping >= 0]] = False
        if only.any():
            q = 0.8 * q + 0.2 * only.double() / only.sum()
        return q


@dataclass(frozen=True)
class DraftStopInTargetIds(TokenLevelIntersection):
    """The draft's stop check in the wrong id space: drafting compares the draft's own ids with
    the target's stop tokens, and a round whose drafting hit such a "stop" ends the
    generation after that round, though no stop token was emitted."""

    name: str = "mutant: draft_stop_in_target_ids"

    def draft_stops(self, draft_id, target_id, policy):
        return draft_id in policy.stop_tokens


@dataclass(frozen=True)
class CommittedTokensRetokenised(StringLevelExactMatch):
    """A non-canonical re-tokenisation taken as canonical: after each round the generated text is
    re-tokenised with the target's tokenizer and its canonical tokens replace the ones the target
    emitted (a target path that spells "ab" as "a" + "b" becomes "ab")."""

    name: str = "mutant: committed_tokens_retokenised"

    def commit(self, sequence, emitted, prompt, target_tokenizer):
        generated = torch.cat([sequence[prompt:], emitted]).tolist()
        text = target_tokenizer.decode(generated, skip_special_tokens=False)
        ids = target_tokenizer(text, add_special_tokens=False)["input_ids"]
        return torch.cat([sequence[:prompt], torch.tensor(ids, dtype=torch.int64, device=sequence.device)])


TWO_VOCAB_MUTANTS = (QWrittenInVocabOrder(), DraftOnlyMassInQ(), TargetOnlyTokensInQ(), DraftStopInTargetIds(),
                     CommittedTokensRetokenised())
