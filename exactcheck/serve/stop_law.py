"""The law of answers that end at a stop string, from the law of the first L tokens.

A stop string ends an answer at the first token whose text completes it: the server samples
token by token, and an answer that stopped after j tokens is the first j tokens of the run it
would have continued, so its law is the L-token law (``continuation_law``) pushed through "cut at
the first stop". Which prefixes stop is a property of their text, not of any probability: the
endpoint says what text the server searches (``Endpoint.continuation_texts``, from its own
detokenizer), and each cell of the law becomes

- the prefix it stops at (a ``stopped`` cell: the answer is those tokens), where the text of one of
  its prefixes holds a stop string: cells that stop at the same prefix merge, with the sum of their
  exact masses;
- itself, where none does (a pooled cell, "this prefix, then any other token", keeps its mass
  whatever happens after the prefix: an answer in it maps to it whether it stopped later or not).

An answer that runs past a prefix whose text holds a stop lands in no cell: probability 0, a
deterministic finding (a server returning the tokens of a verify step past the one that completed
the stop). Such an answer is a finding only where the text the server returned with it is the text
the audit reads for its tokens, cut at the stop (``returned_text``): the server's own text then
holds the stop its tokens ran past. Where it is not (a special token the server's stop search
skips, a detokenizer's context), the text the audit read is not the server's and the world is not
judged, with the reason (``exactcheck.serve.runner``).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from exactcheck.endpoints.continuation_law import ContinuationLaw

__all__ = ["stopped_law", "stop_depth", "ends_disagreeing", "returned_text"]


def stop_depth(prefix: tuple[int, ...], texts: dict[tuple[int, ...], str], stops: Sequence[str]) -> int | None:
    """The number of tokens after which an answer starting with ``prefix`` stops (the first j whose
    text holds a stop string), or None where no prefix of it does."""
    for j in range(1, len(prefix) + 1):
        text = texts.get(prefix[:j])
        if text is not None and any(s in text for s in stops):
            return j
    return None


def _prefixes(law: ContinuationLaw) -> list[tuple[int, ...]]:
    seen: dict[tuple[int, ...], None] = {}
    for prefix, _ in law.cells:
        for j in range(1, len(prefix) + 1):
            seen[prefix[:j]] = None
    return list(seen)


def stopped_law(law: ContinuationLaw, text_of: Callable[[list[tuple[int, ...]]], list[str]],
                stops: Sequence[str]) -> tuple[ContinuationLaw, dict[tuple[int, ...], str]]:
    """``law`` with every cell cut at its first stop (module docstring), and the texts it read
    (prefix -> the continuation's text after the prompt, as the server searches it)."""
    prefixes = _prefixes(law)
    texts = dict(zip(prefixes, text_of(prefixes))) if prefixes else {}
    masses: dict[tuple, float] = {}
    for (prefix, kind), mass in zip(law.cells, law.expected[:len(law.cells)]):
        j = stop_depth(prefix, texts, stops)
        cell = (prefix, kind) if j is None else (prefix[:j], "full" if j == law.length else "stopped")
        masses[cell] = masses.get(cell, 0.0) + float(mass)
    cells = tuple(masses)
    expected = np.asarray([*masses.values(), 0.0], dtype=np.float64)  # the last: "beyond", probability 0
    expected = expected / expected.sum()
    return ContinuationLaw(law.length, cells, expected, law.calls, law.laws, law.unaskable,
                           law.unaskable_reason), texts


def ends_disagreeing(tokens: Sequence[Sequence[int]], texts: dict[tuple[int, ...], str], stops: Sequence[str],
                     length: int) -> list[tuple[int, ...]]:
    """The answers (token ids) that end where the texts say they do not: running past a prefix
    whose text holds a stop string, or shorter than ``length`` with every prefix's text known and
    none holding one (an answer whose texts are not all known and hold no stop falls in a pooled
    cell, whose mass does not depend on where it stops)."""
    wrong = []
    for answer in tokens:
        answer = tuple(int(t) for t in answer)
        j = stop_depth(answer, texts, stops)
        if j is not None and len(answer) > j:
            wrong.append(answer)
        elif j is None and len(answer) < length and all(answer[:i] in texts for i in range(1, len(answer) + 1)):
            wrong.append(answer)
    return wrong


def returned_text(text: str, stops: Sequence[str]) -> set[str]:
    """What a server returns as the text of an answer whose continuation text is ``text``: cut
    before a stop string it holds (engines differ on which of several that overlap: each is taken),
    else the whole text."""
    cuts = {text[:text.find(s)] for s in stops if s in text}
    return cuts or {text}
