"""The cost of a served speculative-decoding system: the same requests to the audited server
(speculation on) and to a reference serving the same model with speculation off, timed one at a
time (``exactcheck cost URL --reference URL2``).

**The requests.** ``requests`` requests per sampling setting; request i of a setting takes prompt
i mod len(prompts) (token ids: a text prompt is tokenized once, by the audited server, and both
servers get the ids), ``new_tokens`` tokens, the setting's sampling fields and a seed derived from
the root seed, the setting and i. Each dialect writes the body (``Endpoint.body``: llama.cpp's
``/completion``, OpenAI's or mlx-lm's ``/v1/completions``), so the two servers get the same prompt,
sampling, seed and length, and differ only in what a dialect adds (an OpenAI model name).

**The order.** One request in flight at a time. The two requests of a pair are sent back to back,
and the pairs cycle through the settings (request 0 of every setting, then request 1, ...). Request
i of setting s goes to the audited server first when i + s is even, else to the reference first:
within every setting the first server alternates request by request, and over the run each server
is first as often as second (with two settings: A B, B A, B A, A B, A B, ...). A drift over the run
(a warming cache, a busy machine) and an order effect within a pair weigh on both servers alike
and on every setting alike. One warm-up request to each server comes first and is not recorded.

**The time** of a request is the client's wall time from sending it to its last byte
(``Exchange.seconds``: connection, queueing, prefill and decoding, and any retry the client made:
``retried`` says how many). Figures per server (``summarise``, statistics in
``exactcheck.stats.timing``): the latency's median and mean with intervals, output tokens per
second (Σ tokens / Σ seconds), and the audited / reference ratios of latency and of tokens per
second, paired by request. The servers' own speculation counters (``draft_counts.CounterSource``:
per request where the dialect reports them, else the server-wide ``/metrics`` before and after)
give drafted and accepted tokens and the acceptance rate; the settings each server declares
(``speculation_settings``) are kept beside them.

**Bounded.** The number of requests is fixed before the first is sent (2 warm-ups + 2 × requests ×
settings); each has a time-out (``timeout``) and at most ``retries`` retries.

**A server that dies** once the timed requests are under way (a ``server_fault``: 5xx or a
dropped connection after every retry, a time-out, an answer that is not JSON) ends the run with
what was measured: ``stopped`` names the server and its role, the error, the answers so far and
the request in flight as a ``curl`` line; the command then exits 1. Before the first timed request
nothing has been measured: a URL that never answered, the wrong API, a prompt the server cannot
tokenize, a failed warm-up, and at any time a request the server refused (4xx) or a missing
``--reference``, are one line (``UsageError``, exit 2).
"""
from __future__ import annotations

import os
import platform
from dataclasses import asdict, dataclass
from typing import Sequence

from exactcheck.errors import UsageError
from exactcheck.options import derive_seed
from exactcheck.audit_run import AuditRun
from exactcheck.progress import Progress
from exactcheck.report.served_cost_report import SERVED_COST_SCHEMA
from exactcheck.cost.reproduce import served_cost_line
from exactcheck.endpoints.apis import open_endpoint
from exactcheck.endpoints.client import Client, EndpointError, curl_line
from exactcheck.endpoints.draft_counts import CounterSource
from exactcheck.endpoints.endpoint import GREEDY_SAMPLING, Endpoint, Sampling
from exactcheck.endpoints.requests import DEFAULT_PROMPTS
from exactcheck.stats.timing import CONFIDENCE, Estimate, mean_interval, median_interval, ratio_of_rates, ratio_of_sums

__all__ = ["DEFAULT_COST_SAMPLINGS", "CostRequest", "TimedRequest", "plan_requests", "warm_up",
           "measure", "summarise", "run_served_cost", "sampling_spec", "ORDER", "TIME"]

DEFAULT_COST_SAMPLINGS = (GREEDY_SAMPLING, Sampling())  # greedy, and temperature 1 untruncated
ROLES = ("audited", "reference")
ORDER = ("one request in flight at a time; the two requests of a pair back to back, the pairs cycling through the "
         "settings; request i of setting s to the audited server first when i + s is even, else to the reference "
         "first, so within every setting the first server alternates request by request and over the run each "
         "server is first as often as second (two settings: A B, B A, B A, A B, ...); one warm-up request to each "
         "server first, not recorded")
SERVER_WIDE = ("the server-wide /metrics counters, read after the warm-ups and after the last request (other traffic "
               "counts too)")
TIME = ("the client's wall time of one request, from sending it to the last byte of its answer (connection, "
        "queueing, prefill and decoding; a retried request includes its failed tries and the wait between them)")


@dataclass(frozen=True)
class CostRequest:
    """One pair's request: the same for both servers."""

    pair: int
    setting: int  # index into the samplings
    prompt: int  # index into the prompts
    seed: int
    audited_first: bool


@dataclass(frozen=True)
class TimedRequest:
    """One request sent to one server, timed."""

    pair: int
    setting: int
    prompt: int
    seed: int
    server: str  # "audited" or "reference"
    order: int  # its place in the run (0: the first request after the warm-ups)
    latency_s: float
    tokens: int
    output: tuple[int, ...]
    draft_n: int | None
    draft_accepted: int | None
    retried: int


def plan_requests(prompts: int, settings: int, requests: int, seed: int) -> list[CostRequest]:
    """Every pair, in the order sent (module docstring): pair i of every setting, then pair i + 1."""
    plan = []
    for i in range(requests):
        for s in range(settings):
            pair = len(plan)
            plan.append(CostRequest(pair, s, i % prompts, derive_seed(seed, f"cost/{s}/{i}") % (1 << 31),
                                    audited_first=(i + s) % 2 == 0))
    return plan


def _send(endpoint: Endpoint, body: dict) -> tuple[float, object, int]:
    """(seconds, completion, retries) of one request: the dialect writes and reads it, the client times it."""
    stats = endpoint.client.stats
    before = stats.retried
    exchange = endpoint.client.post(endpoint.base, endpoint.path, body)
    return exchange.seconds, endpoint.read(exchange), stats.retried - before


def _refused(endpoint: Endpoint, exc: EndpointError) -> UsageError:
    return UsageError(f"{endpoint.base}: {exc}")


def warm_up(endpoints: dict[str, Endpoint], prompt: Sequence[int], sampling: Sampling, new_tokens: int,
            seed: int = 0) -> None:
    """One request to each server, not timed: its first request pays for what later ones find ready.
    A failure here is one line (exit 2): nothing has been measured yet."""
    for role in ROLES:
        endpoint = endpoints[role]
        try:
            _send(endpoint, endpoint.body(prompt, new_tokens, sampling, derive_seed(seed, "warm-up") % (1 << 31)))
        except EndpointError as exc:
            raise UsageError(f"the {role} server cannot be measured: {exc}") from None


def measure(endpoints: dict[str, Endpoint], prompts: Sequence[Sequence[int]], samplings: Sequence[Sampling],
            plan: Sequence[CostRequest], new_tokens: int, progress: Progress | None = None
            ) -> tuple[list[TimedRequest], dict | None]:
    """Send ``plan``; (the timed requests, why the run stopped early: None when it did not). A
    refused request (not the server's fault) is a ``UsageError``."""
    records: list[TimedRequest] = []
    role = ROLES[0]
    try:
        for request in plan:
            for role in (ROLES if request.audited_first else ROLES[::-1]):
                endpoint = endpoints[role]
                body = endpoint.body(prompts[request.prompt], new_tokens, samplings[request.setting], request.seed)
                seconds, completion, retried = _send(endpoint, body)
                records.append(TimedRequest(request.pair, request.setting, request.prompt, request.seed, role,
                                            len(records), seconds, len(completion.tokens), tuple(completion.tokens),
                                            completion.draft_n, completion.draft_accepted, retried))
                if progress is not None:
                    progress.step(f"pair {request.pair + 1} of {len(plan)}")
    except EndpointError as exc:
        if not exc.server_fault:  # the server refused what was asked: the user's settings
            raise _refused(endpoints[role], exc) from None
        return records, dict(reason="server", role=role, server=endpoints[role].base, error=str(exc),
                             answered=len(records), requests=[curl_line(url, body) for url, body in exc.requests])
    except KeyboardInterrupt:
        return records, dict(reason="interrupted", role=None, server=None, error="interrupted (Ctrl-C or SIGTERM)",
                             answered=len(records), requests=[])
    return records, None


# ---- the figures ---------------------------------------------------------------------------------

def _complete_pairs(records: Sequence[TimedRequest]) -> list[tuple[TimedRequest, TimedRequest]]:
    """(audited, reference) of every pair both servers answered, in the order sent."""
    by_pair: dict[int, dict[str, TimedRequest]] = {}
    for r in records:
        by_pair.setdefault(r.pair, {})[r.server] = r
    return [(v["audited"], v["reference"]) for _, v in sorted(by_pair.items()) if len(v) == 2]


def _speculation(requests: Sequence[TimedRequest], totals: tuple[int, int] | None, seed: int) -> dict:
    """The server's own counters over ``requests`` (``totals``: the server-wide counters' change
    over the run, where the server keeps them so)."""
    if totals is not None:
        drafted, accepted = totals
        rate = accepted / drafted if drafted else None
        return dict(source=SERVER_WIDE, drafted=drafted, accepted=accepted,
                    requests_drafting=None, acceptance=None if rate is None else Estimate(
                        rate, float("nan"), float("nan"), CONFIDENCE, "accepted / drafted tokens, server-wide counters "
                        "(no interval: one reading for the whole run)").to_dict())
    if not any(r.draft_n is not None for r in requests):
        return dict(source=None, drafted=None, accepted=None, requests_drafting=0, acceptance=None)
    drafted = [r.draft_n or 0 for r in requests]
    accepted = [r.draft_accepted or 0 for r in requests]
    acceptance = ratio_of_sums(accepted, drafted, seed=seed, what="accepted / drafted tokens") \
        if sum(drafted) else None
    return dict(source=CounterSource.PER_REQUEST.value, drafted=sum(drafted), accepted=sum(accepted),
                requests_drafting=sum(d > 0 for d in drafted),
                acceptance=None if acceptance is None else acceptance.to_dict())


def _group(label: str, pairs: list[tuple[TimedRequest, TimedRequest]], totals: dict, seed: int) -> dict:
    out = {"setting": label, "pairs": len(pairs)}
    for i, role in enumerate(ROLES):
        rows = [p[i] for p in pairs]
        seconds = [r.latency_s for r in rows]
        tokens = [r.tokens for r in rows]
        out[role] = {"latency_median_s": median_interval(seconds).to_dict(),
                     "latency_mean_s": mean_interval(seconds).to_dict(),
                     "tokens_per_s": ratio_of_sums(tokens, seconds, seed=seed,
                                                   what="output tokens / seconds").to_dict(),
                     "tokens": sum(tokens), "retried": sum(r.retried for r in rows),
                     "speculation": _speculation(rows, totals.get(role), seed)}
    audited, reference = ([p[i] for p in pairs] for i in range(2))
    out["latency_ratio"] = ratio_of_sums([a.latency_s for a in audited], [r.latency_s for r in reference], seed=seed,
                                         what="audited latency / reference latency (sum over pairs / sum)").to_dict()
    out["throughput_ratio"] = ratio_of_rates([a.tokens for a in audited], [a.latency_s for a in audited],
                                             [r.tokens for r in reference], [r.latency_s for r in reference],
                                             seed=seed, what="audited tokens/s / reference tokens/s").to_dict()
    out["audited_slower"] = sum(a.latency_s > r.latency_s for a, r in pairs)
    out["identical_outputs"] = sum(a.output == r.output for a, r in pairs)
    return out


def summarise(records: Sequence[TimedRequest], sampling_labels: Sequence[str], totals: dict | None = None,
              seed: int = 0) -> dict:
    """The report's figures over the pairs both servers answered: all settings together, then each
    (``totals``: role -> the server-wide counters' change, for the whole run only)."""
    pairs = _complete_pairs(records)
    summary = {"all": _group("all settings", pairs, totals or {}, seed)}
    summary["by_setting"] = [_group(label, [p for p in pairs if p[0].setting == s], {}, seed)
                             for s, label in enumerate(sampling_labels)]
    return summary


# ---- the run -------------------------------------------------------------------------------------

def sampling_spec(sampling: Sampling) -> str:
    """What ``--sampling`` takes for ``sampling`` (``Sampling.parse`` reads it back)."""
    return "greedy" if sampling.greedy else sampling.spec() or "temperature=1"


def _opened(api: str, url: str, client: Client, model: str | None, role: str) -> Endpoint:
    try:
        return open_endpoint(api, url, client, model=model)
    except EndpointError as exc:
        raise UsageError(f"the {role} server cannot be measured: {exc}") from None


def _tokenized(endpoint: Endpoint, text: str) -> tuple[int, ...]:
    try:
        return tuple(endpoint.tokenize(text))
    except EndpointError as exc:
        raise UsageError(f"the audited server could not tokenize the prompt {text[:40]!r} ({exc}): give prompts as "
                         f"token ids (--prompt-ids)") from None


def _totals(endpoint: Endpoint) -> tuple[int, int] | None:
    try:
        return endpoint.speculation_totals()
    except EndpointError:
        return None


def run_served_cost(url: str, *, reference: str | None, api: str = "auto", model: str | None = None,
                    prompts: Sequence = DEFAULT_PROMPTS, samplings: Sequence[Sampling] = DEFAULT_COST_SAMPLINGS,
                    requests: int = 8, new_tokens: int = 32, seed: int = 0, timeout: float = 60.0, retries: int = 2,
                    progress: bool = True, reproduce: str | None = None, transport=None) -> dict:
    """Measure the served system at ``url`` against ``reference`` (module docstring); the report's
    JSON (``SERVED_COST_SCHEMA``). ``prompts``: texts (tokenized by the audited server) or token-id
    tuples; ``reproduce``: the command line that reruns it (default: written from these arguments);
    ``transport``: answers without HTTP (``serve.client.Client``)."""
    from exactcheck.version import __version__
    if not reference:
        raise UsageError("a served cost needs --reference URL2: the same model served with speculation off")
    if reference.rstrip("/") == url.rstrip("/"):
        raise UsageError(f"--reference ({reference}) is the audited server: give a server of the same model with "
                         f"speculation off")
    for name, value in (("--prompts", requests), ("--new-tokens", new_tokens)):
        if not (isinstance(value, int) and value >= 1):
            raise UsageError(f"{name} ({value!r}) must be a positive integer")
    if not samplings or not prompts:
        raise UsageError("a served cost needs at least one prompt and one sampling setting")
    if reproduce is None:
        reproduce = served_cost_line(
            url, reference, api=api, model=model, prompts=() if tuple(prompts) == DEFAULT_PROMPTS else prompts,
            samplings=() if tuple(samplings) == DEFAULT_COST_SAMPLINGS else [sampling_spec(s) for s in samplings],
            requests=requests, new_tokens=new_tokens, seed=seed, timeout=None if timeout == 60.0 else timeout)
    load = [_load()]
    client = Client(None, concurrency=1, timeout=timeout, retries=retries, transport=transport)
    bar = None
    try:
        endpoints = {"audited": _opened(api, url, client, model, "audited"),
                     "reference": _opened(api, reference, client, model, "reference")}
        ids = [tuple(p) if not isinstance(p, str) else _tokenized(endpoints["audited"], p) for p in prompts]
        if any(not p for p in ids):
            raise UsageError("a prompt tokenized to no token")
        declared = {role: e.speculation_settings() for role, e in endpoints.items()}
        plan = plan_requests(len(ids), len(samplings), requests, seed)
        warm_up(endpoints, ids[0], samplings[0], new_tokens, seed)
        start = {role: _totals(e) for role, e in endpoints.items()}
        # a measurement, not a test: the run core's bar, no checks, no Holm
        run = AuditRun((), None, seed, lambda _world: "", progress=progress)
        bar = run.bar(2 * len(plan), unit="request", desc="exactcheck: cost")
        records, stopped = measure(endpoints, ids, samplings, plan, new_tokens, bar)
        end = {role: _totals(e) if stopped is None else None for role, e in endpoints.items()}
    finally:
        if bar is not None:
            bar.close()
        client.close()
    load.append(_load())
    totals = {role: (end[role][0] - start[role][0], end[role][1] - start[role][1])
              for role in ROLES if start[role] is not None and end[role] is not None}
    labels = [s.describe() for s in samplings]
    complete = len(_complete_pairs(records))
    return {
        "schema": SERVED_COST_SCHEMA,
        "servers": {role: {"url": e.base, "endpoint": e.describe(), "declared_settings": _plain(declared[role])}
                    for role, e in endpoints.items()},
        "settings": {"samplings": labels, "prompts": [list(p) for p in ids], "requests_per_setting": requests,
                     "new_tokens": new_tokens, "seed": seed, "timeout_s": timeout, "retries": retries,
                     "planned_pairs": len(plan), "complete_pairs": complete},
        "order": ORDER,
        "records": [{**asdict(r), "output": list(r.output)} for r in records],
        "summary": summarise(records, labels, totals, seed),
        "stopped": stopped,
        "denominators": {"time": TIME, "client": f"{platform.machine()}, {platform.platform()}, {os.cpu_count()} CPUs",
                         "load_average": load, "python": platform.python_version(), "exactcheck": __version__},
        "traffic": client.stats.line(),
        "reproduce": reproduce,
    }


def _load() -> float | None:
    """The client machine's load average over the last minute (where the servers share it, what
    else ran beside them); None where the system does not say."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _plain(value):
    """``value`` as JSON can hold it (a server's declared settings may hold anything)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)
