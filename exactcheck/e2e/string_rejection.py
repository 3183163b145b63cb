"""SLRS, string-level rejection sampling between a draft and a target with different tokenizers
(Timor et al., ICML 2025, arXiv 2502.05202): exactcheck's reference and its mutants.

A round proposes the next ``m`` symbols of text (``m`` is the loop's ``draft_length``). A symbol
is a character, or a special token of the target's taken whole (``<eos>`` is one symbol), so the
target's stop and special tokens are outcomes like any string. Both sides' laws over these
``m``-symbol strings are enumerated:

- ``psi_p(s)``: the probability that the target's continuation starts with ``s``, summed over
  every target tokenisation that covers ``s`` (the last token may run past it) or ends at a stop
  token inside it;
- ``psi_q(s)``: the same for the draft, over its text tokens (its special tokens spell nothing and
  are not proposed: the draft's law restricted to its text tokens and renormalised).

The draft proposes ``s`` by drawing one of its covering paths (the law of drafting token by token
until ``m`` symbols are written), ``s`` is accepted with probability ``min(1, psi_p(s)/psi_q(s))``
(``u < psi_p/psi_q``), and on a rejection a string is drawn from the residual
``max(psi_p - psi_q, 0)``. The accepted string has law ``psi_p``: that is the paper's claim, a law
over text.

**What is committed** (the paper leaves the target tokens open): a target path drawn from the
target's posterior over the paths that cover ``s``, ``P(path | s) = P(path) / psi_p(s)``, all of
its tokens, the one that runs past ``s`` included. Since ``psi_p(s) P(path | s) = P(path)``, every
round commits a target path with the target's own law, so the output is exact as a law of target
token sequences (non-canonical spellings included), not only as a law of text. Committing the
canonical tokenisation of ``s`` instead is the mutant ``slrs_canonical_only``.

Cost: both laws are enumerated every round, ``O(V^m)`` rows (the paper's Figure 1 says the same);
the toy tokenizer worlds keep ``V <= 10`` and ``m <= 3``. The rows of one depth are one batched
forward call. No KV cache; only the laws judge this loop.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from exactcheck.contracts.generator import Capabilities, DecodingPolicy
from exactcheck.e2e.loop import stop_at
from exactcheck.e2e.two_vocab_loop import TwoVocabularyLoop, draft_policy

__all__ = ["CoveringPaths", "covering_paths", "StringLevelRejectionSampling", "SLRS_MUTANTS",
           "SlrsCanonicalOnly", "SlrsDrawnTokenisationQ"]


@dataclass(frozen=True)
class CoveringPaths:
    """Every path of one model's tokens from a context until it spells ``m`` symbols or ends at a
    terminal token: ``paths[i]`` with probability ``probs[i]`` spells ``strings[i]`` (its first
    ``m`` symbols). The paths are prefix-free and their probabilities sum to the mass of the rows
    they were drawn through (1 for a law)."""

    paths: tuple[tuple[int, ...], ...]
    probs: tuple[float, ...]
    strings: tuple[tuple[str, ...], ...]

    def law(self) -> dict[tuple[str, ...], float]:
        """The law of the spelled string: each path's probability summed by string."""
        out: dict[tuple[str, ...], float] = {}
        for s, prob in zip(self.strings, self.probs):
            out[s] = out.get(s, 0.0) + prob
        return out

    def draw(self, generator: torch.Generator, where: list[int] | None = None) -> int:
        """The index of a path drawn in proportion to its probability (among ``where``)."""
        where = list(range(len(self.paths))) if where is None else where
        weights = torch.tensor([self.probs[i] for i in where], dtype=torch.float64)
        return where[int(torch.multinomial(weights, 1, generator=generator))]


def covering_paths(rows_after, symbols: list[tuple[str, ...]], m: int, terminal: frozenset[int]) -> CoveringPaths:
    """Enumerate the paths of ``CoveringPaths`` breadth first. ``rows_after(paths)``: the law
    ([len(paths), V] float64) of the next token after each path (all of one length: one batched
    forward); ``symbols[t]``: what token t spells (at least one symbol); a token in ``terminal``
    (a stop token) ends its path."""
    paths, probs, strings = [], [], []
    frontier = [((), 1.0, ())]
    while frontier:
        rows = rows_after([path for path, _, _ in frontier]).tolist()
        grown = []
        for (path, prob, spelled), row in zip(frontier, rows):
            for t, r in enumerate(row):
                if r <= 0.0:
                    continue
                s = spelled + symbols[t]
                if len(s) >= m or t in terminal:
                    paths.append(path + (t,))
                    probs.append(prob * r)
                    strings.append(s[:m])
                else:
                    grown.append((path + (t,), prob * r, s))
        frontier = grown
    return CoveringPaths(tuple(paths), tuple(probs), tuple(strings))


def _symbols(tokenizer, vocab_size: int) -> list[tuple[str, ...]]:
    """What each id spells: its decoded characters, a special token (or one that decodes to
    nothing) as one symbol, its name."""
    special = set(tokenizer.all_special_ids)
    names = tokenizer.convert_ids_to_tokens(list(range(vocab_size)))
    out = []
    for i in range(vocab_size):
        text = "" if i in special else tokenizer.decode([i])
        out.append(tuple(text) if text else (str(names[i]),))
    return out


@dataclass(frozen=True)
class StringLevelRejectionSampling(TwoVocabularyLoop):
    """SLRS: ``m`` = ``draft_length`` symbols proposed by the draft, accepted with the ratio of the
    two sides' string laws, the residual over strings on a rejection, and a target tokenisation of
    the accepted string drawn from the target's posterior (see the module docstring)."""

    name: str = "exactcheck SLRS reference (string-level rejection sampling, Timor et al. 2025)"
    capabilities = Capabilities(cache=False, grammar_masks=False)

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed, *, target_tokenizer,
                 draft_tokenizer) -> torch.Tensor:
        device = target.device
        generator = torch.Generator(device="cpu").manual_seed(seed)
        m = self.draft_length
        target_symbols = _symbols(target_tokenizer, target.config.vocab_size)
        draft_symbols = _symbols(draft_tokenizer, draft.config.vocab_size)
        draft_text = torch.ones(draft.config.vocab_size, dtype=torch.float64)
        draft_text[[i for i in draft_tokenizer.all_special_ids if i < draft_text.numel()]] = 0.0
        stops = frozenset(policy.stop_tokens)
        sequence, prompt = input_ids[0].to(device), input_ids.shape[1]
        with torch.no_grad():
            while sequence.numel() - prompt < max_new_tokens:
                generated = tuple(sequence[prompt:].tolist())
                p_paths = covering_paths(self._target_rows(target, sequence, generated, policy), target_symbols,
                                         m, stops)
                context = self.draft_context(sequence, target_tokenizer, draft_tokenizer, device)
                q_paths = (covering_paths(self._draft_rows(draft, context, policy, draft_text), draft_symbols, m,
                                          frozenset()) if context.numel() else CoveringPaths((), (), ()))
                psi_p = self.target_string_law(p_paths, target_tokenizer)
                s = self.verify(psi_p, q_paths, generator)
                path = self.commit(p_paths, s, generator, target_tokenizer)
                emitted = torch.tensor(path, dtype=torch.int64, device=device)
                emitted = emitted[: max_new_tokens - (sequence.numel() - prompt)]
                keep, stopped = stop_at(emitted, policy)
                sequence = torch.cat([sequence, emitted[:keep]])
                if stopped:
                    break
        return sequence[None]

    @staticmethod
    def _target_rows(target, sequence, generated, policy: DecodingPolicy):
        def rows(paths):
            ids = torch.cat([sequence[None].expand(len(paths), -1),
                             torch.tensor(paths, dtype=torch.int64, device=sequence.device).reshape(len(paths), -1)], 1)
            logits = target(input_ids=ids, use_cache=False).logits[:, -1]
            return policy.probabilities(logits, [generated + p for p in paths]).cpu()
        return rows

    @staticmethod
    def _draft_rows(draft, context, policy: DecodingPolicy, text_tokens: torch.Tensor):
        def rows(paths):
            ids = torch.cat([context[None].expand(len(paths), -1),
                             torch.tensor(paths, dtype=torch.int64, device=context.device).reshape(len(paths), -1)], 1)
            q = draft_policy(policy).probabilities(draft(input_ids=ids, use_cache=False).logits[:, -1]).cpu()
            q = q * text_tokens
            total = q.sum(-1, keepdim=True)
            return torch.where(total > 0, q / total.clamp_min(1e-300), torch.zeros_like(q))
        return rows

    # -- the steps a mutant overrides ---------------------------------------------------------
    def target_string_law(self, paths: CoveringPaths, target_tokenizer) -> dict[tuple[str, ...], float]:
        """``psi_p``: the target's law of the next ``m`` symbols, every tokenisation summed."""
        return paths.law()

    def proposal_probability(self, q_paths: CoveringPaths, drawn: int, psi_q: dict) -> float:
        """``psi_q`` of the proposed string: every draft tokenisation of it summed, not only the
        path that was drawn."""
        return psi_q[q_paths.strings[drawn]]

    def verify(self, psi_p: dict, q_paths: CoveringPaths, generator: torch.Generator) -> tuple[str, ...]:
        """The accepted string: the draft's proposal with probability ``min(1, psi_p/psi_q)``, else
        a draw from the residual ``max(psi_p - psi_q, 0)`` (from ``psi_p`` itself when the draft
        proposes nothing)."""
        psi_q = q_paths.law()
        if q_paths.paths:
            drawn = q_paths.draw(generator)
            s = q_paths.strings[drawn]
            u = float(torch.rand((), dtype=torch.float64, generator=generator))
            if u * self.proposal_probability(q_paths, drawn, psi_q) < psi_p.get(s, 0.0):
                return s
        strings = sorted(psi_p)
        residual = torch.tensor([max(psi_p[s] - psi_q.get(s, 0.0), 0.0) for s in strings], dtype=torch.float64)
        if not residual.sum() > 0:  # psi_q >= psi_p everywhere yet rejected: only rounding can get here
            residual = torch.tensor([psi_p[s] for s in strings], dtype=torch.float64)
        return strings[int(torch.multinomial(residual, 1, generator=generator))]

    def commit(self, paths: CoveringPaths, s: tuple[str, ...], generator: torch.Generator,
               target_tokenizer) -> tuple[int, ...]:
        """The target tokens committed for ``s``: a covering path drawn from the target's posterior
        given ``s``."""
        return paths.paths[paths.draw(generator, [i for i, t in enumerate(paths.strings) if t == s])]


# -- mutants: the bug class of string-level verification ---------------------------------------

@dataclass(frozen=True)
class SlrsCanonicalOnly(StringLevelRejectionSampling):
    """A non-canonical re-tokenisation taken as canonical: ``psi_p(s)`` is the probability of the
    target's canonical tokenisation of ``s`` alone (not summed over every tokenisation), and the
    canonical tokens are what is committed."""

    name: str = "mutant: slrs_canonical_only"

    def target_string_law(self, paths, target_tokenizer):
        law: dict[tuple[str, ...], float] = {}
        for path, prob, s in zip(paths.paths, paths.probs, paths.strings):
            if path == self._canonical(s, target_tokenizer):
                law[s] = law.get(s, 0.0) + prob
        return law

    def commit(self, paths, s, generator, target_tokenizer):
        return self._canonical(s, target_tokenizer)

    @staticmethod
    def _canonical(s, target_tokenizer) -> tuple[int, ...]:
        return tuple(target_tokenizer("".join(s), add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class SlrsDrawnTokenisationQ(StringLevelRejectionSampling):
    """``psi_q`` of the proposed string taken as the probability of the one draft path that was
    drawn, not summed over every draft tokenisation of the string: where the draft can spell a
    string two ways ("ab" or "a" + "b"), the ratio is too large and the string is accepted too
    often."""

    name: str = "mutant: slrs_drawn_tokenisation_q"

    def proposal_probability(self, q_paths, drawn, psi_q):
        return q_paths.probs[drawn]


SLRS_MUTANTS = (SlrsCanonicalOnly(), SlrsDrawnTokenisationQ())
