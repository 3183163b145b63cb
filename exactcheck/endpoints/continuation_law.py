"""The exact law of a short continuation, from a reference's next-token laws.

A served model has no table we own; what we can have is the reference server's law of the next
token after any prefix (its post-sampling probabilities: the sampler chain the user set, applied
by the engine itself with speculation off). The law of the first L tokens follows by the chain
rule. ``expand`` walks the prefix tree most probable first, asking the reference for the next-token
law of each prefix it expands, and stops at a mass or call budget. What it does not expand is
merged, never guessed:

- a prefix left unexpanded is one cell: every continuation that starts with it, of exact mass the
  prefix's probability;
- the tokens the reference did not list at an expanded prefix (outside its top N) are one cell,
  "that prefix, then any other token", of mass one minus what it listed.

So the cells partition every continuation and each cell's probability is exact (up to the
reference's own float32 arithmetic, renormalised per prefix), whatever the budget: a coarser law
is still the law of a function of the output. A sample maps to its cell by walking the tree.

A prefix whose law the reference cannot be asked (``Unaskable``: a text-prompt server, where the
prefix has no text that reads back as its ids) is left unexpanded in the same way, one pooled cell
of its exact mass, and counted (``ContinuationLaw.unaskable``, ``note``); the root cannot be pooled
(a law of one cell judges nothing), so an unaskable prompt is raised to the caller.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

__all__ = ["NextTokenLaw", "ContinuationLaw", "expand", "Unaskable"]


class Unaskable(Exception):
    """The law after this prefix cannot be asked of the reference (its ``reason`` in words): the
    prefix stays one pooled cell of its exact mass (``expand``)."""


@dataclass(frozen=True)
class NextTokenLaw:
    """A reference's law of the next token after a prefix: the tokens it listed with their
    probabilities, and the mass of every token it did not list (``other``)."""

    probabilities: dict[int, float]
    other: float = 0.0
    # the most one unlisted token can weigh, where the list is not a top-N (string-keyed logprobs whose
    # shared strings stay unlisted: ``text_prompts``); None: each unlisted token weighs at most the least listed
    unlisted_at_most: float | None = None

    @classmethod
    def normalised(cls, listed: dict[int, float], listed_all: bool) -> "NextTokenLaw":
        """From the probabilities a server returned (float32 rounding, so they may sum to 1 +- 1e-6):
        with ``listed_all`` every token of non-zero probability is listed and the sum is scaled to
        one; otherwise the mass the list leaves is the ``other`` cell's."""
        listed = {int(t): float(p) for t, p in listed.items() if p > 0}
        total = sum(listed.values())
        if total <= 0:
            raise ValueError("the reference listed no token of positive probability")
        if listed_all or total >= 1.0:
            return cls({t: p / total for t, p in listed.items()}, 0.0)
        return cls(listed, 1.0 - total)

    def top_two_margin(self) -> float | None:
        """The most probable token's lead over the second, None where an unlisted token could be one of them."""
        top = sorted(self.probabilities.values(), reverse=True) + [0.0, 0.0]
        if self.unlisted_at_most is not None and self.other > 0 and self.unlisted_at_most >= top[1]:
            return None
        return top[0] - top[1]


@dataclass
class _Node:
    prefix: tuple[int, ...]
    mass: float
    children: dict[int, "_Node"] = field(default_factory=dict)
    other: float | None = None  # expanded: the mass of "this prefix, then an unlisted token"


@dataclass(frozen=True)
class ContinuationLaw:
    """Cells over continuations of ``length`` tokens, their exact probabilities, and the map from
    a continuation to its cell."""

    length: int
    # (prefix, "full" | "prefix" | "other" | "stopped": an answer ended by a stop string, serve.stop_law)
    cells: tuple[tuple[tuple[int, ...], str], ...]
    expected: np.ndarray
    calls: int  # reference requests made
    laws: dict  # prefix -> NextTokenLaw, every expanded prefix
    # the prefixes the reference could not be asked about (``Unaskable``), each one pooled cell: (prefix, mass)
    unaskable: tuple = ()
    unaskable_reason: str = ""

    def cell_of(self, tokens: Sequence[int]) -> int:
        """The index of the cell a continuation falls in (shorter outputs: an end-of-text stop,
        are cells of their own, found as the prefix they are)."""
        tokens = tuple(int(t) for t in tokens[:self.length])
        index = self._index
        for depth in range(len(tokens) + 1):
            prefix = tokens[:depth]
            law = self.laws.get(prefix)
            if law is None or depth == len(tokens):
                kind = "full" if depth == self.length else "prefix"
                for key in ((prefix, kind), (prefix, "prefix"), (prefix, "stopped")):
                    if key in index:
                        return index[key]
                return len(self.cells)
            if tokens[depth] not in law.probabilities:
                return index.get((prefix, "other"), len(self.cells))
        return len(self.cells)

    @property
    def _index(self) -> dict:
        cached = getattr(self, "_index_cache", None)
        if cached is None:
            cached = {cell: i for i, cell in enumerate(self.cells)}
            object.__setattr__(self, "_index_cache", cached)
        return cached

    def label(self, i: int) -> str:
        if i >= len(self.cells):
            return "any other continuation"
        prefix, kind = self.cells[i]
        text = " ".join(map(str, prefix)) or "(empty)"
        if kind == "prefix" and prefix in self._unaskable:
            return f"[{text} ...] (pooled: the reference cannot be asked about this prefix)"
        return {"full": f"[{text}]", "prefix": f"[{text} ...] (not expanded)", "stopped": f"[{text}] (stopped)",
                "other": f"[{text}, then a token the reference did not list]"}[kind]

    @property
    def _unaskable(self) -> set:
        return {prefix for prefix, _ in self.unaskable}

    @property
    def note(self) -> str:
        """Words for the prefixes pooled because the reference could not be asked about them ("" if none)."""
        if not self.unaskable:
            return ""
        mass = sum(m for _, m in self.unaskable)
        n = len(self.unaskable)
        return (f"{n:,} prefix{'es' * (n != 1)} of mass {mass:.4f} pooled, each one cell of its exact mass, not "
                f"expanded: {self.unaskable_reason}")

    def next_token(self, prefix: Sequence[int]) -> NextTokenLaw | None:
        return self.laws.get(tuple(int(t) for t in prefix))


def expand(next_token: Callable[[tuple[int, ...]], NextTokenLaw], length: int, *, min_mass: float,
           max_calls: int, ends: Callable[[tuple[int, ...]], bool] | None = None) -> ContinuationLaw:
    """The law of the first ``length`` tokens, expanding prefixes most probable first while their
    mass is at least ``min_mass`` and fewer than ``max_calls`` reference calls were made. An
    end-of-text token is a token like any other here (a continuation that stops early is the
    prefix it stopped at; ``next_token`` may return an empty law for a prefix that ends the text).
    A prefix ``next_token`` raises ``Unaskable`` for stays one pooled cell (the root re-raises: a law
    of one cell would judge nothing). ``ends(prefix)``: the prefix ends every answer that reaches it
    (its last token is an end-of-generation token): a whole output of its own, whatever its mass,
    asked of no reference, so an answer running past it maps to no cell (probability 0)."""
    root = _Node((), 1.0)
    heap = [(-1.0, 0, root)]
    order, calls, laws = 1, 0, {}
    unaskable, reason = [], ""
    while heap and calls < max_calls:
        negative, _, node = heapq.heappop(heap)
        if -negative < min_mass:
            heapq.heappush(heap, (negative, 0, node))
            break
        try:
            law = next_token(node.prefix)
        except Unaskable as exc:
            if not node.prefix:
                raise
            unaskable.append((node.prefix, node.mass))
            reason = reason or getattr(exc, "reason", None) or str(exc)
            continue
        calls += 1
        laws[node.prefix] = law
        node.other = node.mass * law.other
        for token, p in law.probabilities.items():
            child = _Node(node.prefix + (token,), node.mass * p)
            node.children[token] = child
            if ends is not None and ends(child.prefix):
                laws[child.prefix] = NextTokenLaw({}, 0.0)  # the answer ends here: nothing follows
                continue
            if len(child.prefix) < length and child.mass > 0:
                heapq.heappush(heap, (-child.mass, order, child))
                order += 1
    cells, expected = [], []
    stack = [root]
    while stack:
        node = stack.pop()
        expanded = node.prefix in laws
        if not expanded:
            kind = "full" if len(node.prefix) == length else "prefix"
            cells.append((node.prefix, kind))
            expected.append(node.mass)
            continue
        if node.other:
            cells.append((node.prefix, "other"))
            expected.append(node.other)
        if not node.children and not node.other:  # the text ends here: the prefix is a whole output
            cells.append((node.prefix, "prefix"))
            expected.append(node.mass)
        stack.extend(sorted(node.children.values(), key=lambda n: n.prefix, reverse=True))
    cells.append(((), "beyond"))  # anything the map finds no cell for: probability 0
    expected.append(0.0)
    expected = np.asarray(expected, dtype=np.float64)
    expected = expected / expected.sum()
    return ContinuationLaw(length, tuple(cells[:-1]), expected, calls, laws, tuple(unaskable), reason)
