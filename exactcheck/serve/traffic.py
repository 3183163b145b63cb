"""The traffic a serve audit sends, and what the server met.

An engine meets mixed traffic: requests with different prompts, prompt lengths, sampling settings,
seeds, with and without logprobs, seeded and unseeded, in flight at once and sharing its batches.
Bugs of batch composition live there (a batch's rows sampled with one row's settings, one random
stream for a batch, a row handed another row's accepted count), and a batch of identical requests
cannot show them. So by default (``mixed``) every world's sampled requests go out in one stream,
interleaved, up to ``--concurrency`` in flight; ``sequential`` keeps the older order, one world
after another. Each answer is judged against its own world's law either way: the statistics do
not change, only which requests share the engine's batches.

``interleaved`` orders the stream (seeded: the same audit sends the same order); ``TrafficMix``
says what the server met, read from when each request was in flight (how many at once, and how
often each world's requests were in flight beside another world's: the engine could batch them
together); ``concurrent_pairs`` pairs a world's requests that were in flight together, for the
test that concurrent requests are independent draws (``exactcheck.stats.pairs``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

__all__ = ["TRAFFIC", "MIXED", "SEQUENTIAL", "interleaved", "TrafficMix", "traffic_mix", "concurrent_pairs"]

MIXED, SEQUENTIAL = "mixed", "sequential"
TRAFFIC = (MIXED, SEQUENTIAL)


def interleaved(counts: Sequence[tuple[str, int]], seed: int) -> list[tuple[str, int]]:
    """Every (world, i), i < the world's count, in one stream that spreads each world over all of
    it: at each position a world is drawn with probability proportional to the requests it has
    still to send, so every stretch of the stream mixes the worlds in their proportions; each
    world's own requests keep their order (``i`` rising). Seeded: the same order every run."""
    rng = random.Random(seed)
    left = {world: n for world, n in counts if n > 0}
    sent = {world: 0 for world in left}
    order = []
    while left:
        worlds = list(left)
        world = rng.choices(worlds, weights=[left[w] for w in worlds])[0]
        order.append((world, sent[world]))
        sent[world] += 1
        left[world] -= 1
        if not left[world]:
            del left[world]
    return order


@dataclass(frozen=True)
class TrafficMix:
    """What the server met: the order (``mode``), the most requests the audit may have in flight
    (``concurrency``) and the most it had (``reached``), and per world its timed requests and the
    share of them in flight at the same time as another world's (``beside``)."""

    mode: str
    concurrency: int
    reached: int
    worlds: tuple[tuple[str, int, float], ...]  # (world, requests timed, share in flight beside another world's)
    untimed: int = 0  # answers taken from the journal: no time in flight

    def line(self) -> str:
        if not self.worlds:
            return f"{self.mode} traffic: no sampled request timed"
        beside = ", ".join(f"{world} {share:.0%}" for world, _, share in self.worlds)
        order = ("every world's sampled requests interleaved in one stream" if self.mode == MIXED
                 else "one world's sampled requests after another's")
        return (f"{self.mode} traffic: {order}, up to {self.concurrency} in flight ({self.reached} reached); "
                f"each world's requests in flight beside another world's: {beside}"
                + (f"; {self.untimed:,} answers from the journal, untimed" if self.untimed else ""))


def traffic_mix(mode: str, concurrency: int, timed: Sequence[tuple[str, float | None, float | None]]) -> TrafficMix:
    """``timed``: (world, sent, answered) per sampled request (None: answered from the journal)."""
    spans = sorted((s, a, world) for world, s, a in timed if s is not None and a is not None)
    untimed = sum(1 for _, s, a in timed if s is None or a is None)
    beside = [False] * len(spans)
    active: list[tuple[float, str, int]] = []  # (answered, world, index) of the requests still in flight
    reached = 0
    for i, (sent, answered, world) in enumerate(spans):
        active = [entry for entry in active if entry[0] > sent]
        for _, other, j in active:
            if other != world:
                beside[i] = beside[j] = True
        active.append((answered, world, i))
        reached = max(reached, len(active))
    counts: dict[str, list[int]] = {}
    for (_, _, world), flag in zip(spans, beside):
        counts.setdefault(world, [0, 0])
        counts[world][0] += 1
        counts[world][1] += flag
    worlds = tuple((world, n, shared / n) for world, (n, shared) in counts.items())
    return TrafficMix(mode, concurrency, reached, worlds, untimed)


def concurrent_pairs(spans: Sequence[tuple[float | None, float | None]]) -> list[tuple[int, int]]:
    """Disjoint pairs (i, j) of one world's requests that were in flight together: in the order they
    were sent, each request not yet paired is paired with the next one sent before it was answered
    (no request in two pairs). ``spans``: (sent, answered) of each request, None where untimed."""
    order = sorted((s, a, i) for i, (s, a) in enumerate(spans) if s is not None and a is not None)
    pairs, used = [], set()
    for k, (sent, answered, i) in enumerate(order):
        if i in used:
            continue
        for sent_j, _, j in order[k + 1:]:
            if sent_j >= answered:
                break
            if j not in used:
                pairs.append((i, j))
                used.update((i, j))
                break
    return pairs
