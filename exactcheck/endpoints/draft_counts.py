"""Drafts counted over a batch of requests, unit by unit: what ``speculation_ran`` tests.

A server counts its drafts per request (llama.cpp's ``timings.draft_n``, which it writes only on a
request that drafted: ``server-task.cpp``, ``if (draft_n > 0)``, so an answer without it drafted
nothing; SGLang's ``meta_info.spec_draft_token_num``, likewise only where ``spec_verify_ct > 0``; a
unit is a request) or
server-wide (vLLM's ``/metrics``: the batch is sent in chunks of ``unit_size`` requests, the
counters read between chunks, and a unit is a chunk). A chunk whose answers came from the journal
(``--resume``) moved no counter, and a last chunk shorter than the others is not like them: their
requests are counted as uncounted, never as units that did not draft. Server-wide counters also
count any other traffic the server has (``exactcheck.stats.rates`` says what that does).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from exactcheck.endpoints.endpoint import Completion, Endpoint, complete_mixed
from exactcheck.stats.rates import units_to_detect_off

__all__ = ["CounterSource", "DraftTally", "send_counted", "send_counted_mixed", "probes_needed"]


class CounterSource(enum.Enum):
    PER_REQUEST = ("the server's own counters per request (timings.draft_n, draft_n_accepted; SGLang's "
                   "meta_info.spec_draft_token_num, spec_accept_token_num; absent on a request that drafted nothing)")
    SERVER_WIDE = "the server-wide /metrics counters, read between chunks of requests (other traffic counts too)"


@dataclass(frozen=True)
class DraftTally:
    """``units``: draft tokens counted in each unit (a request, or a chunk of ``unit_size``)."""

    source: CounterSource
    units: tuple[int, ...]
    unit_size: int
    requests: int
    accepted: int = 0
    uncounted: int = 0  # requests in no unit (server-wide counters: answered from the journal, a short last chunk)

    @property
    def positive(self) -> int:
        """Units that drafted at least once."""
        return sum(d > 0 for d in self.units)

    @property
    def drafted(self) -> int:
        return sum(self.units)

    def unit_words(self, n: int | None = None) -> str:
        n = len(self.units) if n is None else n
        if self.unit_size == 1:
            return f"{n:,} request{'s' * (n != 1)}"
        return f"{n:,} chunk{'s' * (n != 1)} of {self.unit_size} requests"


def send_counted(endpoint: Endpoint, bodies: list[dict], unit_size: int) -> tuple[list[Completion], DraftTally]:
    """Send ``bodies`` to ``endpoint`` (in chunks of ``unit_size`` where its counters are
    server-wide); the completions in order, and the drafts each unit counted."""
    return send_counted_mixed([(endpoint, body) for body in bodies], unit_size)


def send_counted_mixed(requests: list[tuple[Endpoint, dict]], unit_size: int) -> tuple[list[Completion], DraftTally]:
    """``send_counted`` over a stream of (endpoint, body), the endpoints all of one server (its
    completions and chat routes: mixed traffic), in the order given; the drafts each unit counted
    (server-wide counters: each chunk of ``unit_size`` requests of the stream, whichever world each is of)."""
    if not requests:
        return [], DraftTally(CounterSource.PER_REQUEST, (), 1, 0)
    server = requests[0][0]
    start = server.speculation_totals()
    if start is None:  # per request: an answer without a counter drafted nothing
        completions = complete_mixed(requests)
        return completions, DraftTally(CounterSource.PER_REQUEST, tuple(c.draft_n or 0 for c in completions), 1,
                                       len(requests), sum(c.draft_accepted or 0 for c in completions))
    completions: list[Completion] = []
    units, accepted, uncounted = [], 0, 0
    stats = server.client.stats
    for i in range(0, len(requests), unit_size):
        chunk = requests[i:i + unit_size]
        sent = stats.sent
        completions += complete_mixed(chunk)
        now = server.speculation_totals()
        if start is not None and now is not None and len(chunk) == unit_size and stats.sent - sent == len(chunk):
            units.append(now[0] - start[0])
            accepted += now[1] - start[1]
        else:
            uncounted += len(chunk)
        start = now
    return completions, DraftTally(CounterSource.SERVER_WIDE, tuple(units), unit_size, len(requests), accepted,
                                   uncounted)


def probes_needed(law: DraftTally, share: float, minimum: int, law_requests: int) -> int:
    """How many requests that ask for probabilities to send (logprob fidelity reads them all):
    ``minimum``, or as many as ``speculation_ran`` needs to see speculation switched off on them at
    ``share`` at the law requests' drafting rate (whole units), up to a quarter of the law
    requests (past that the verdict says the drafts were too rare to tell)."""
    units = units_to_detect_off(law.positive, len(law.units), share) if law.units else None
    needed = (units or 0) * law.unit_size
    return max(minimum, min(needed, law_requests // 4 // law.unit_size * law.unit_size))
