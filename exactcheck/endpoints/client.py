"""An HTTP client one can point at a paid endpoint: bounded, retried, journalled, resumable.

- bounded: at most ``concurrency`` requests in flight, each with a ``timeout``; the number of
  requests an audit sends is fixed by its plan before it starts;
- retried: a 429, a 5xx, a refused or dropped connection or a time-out is retried with
  exponential backoff (``retries`` times); a request that still fails is an ``EndpointError``,
  never a sample;
- journalled: every answer is appended, as it arrives, to a JSON-lines journal keyed by a hash
  of (endpoint, path, body); a later run with the same journal (``--resume``) takes the answers it
  holds instead of sending those requests again, so an interrupted audit pays for nothing twice
  and, with the same seed, reaches the same verdicts;
- interruptible: Ctrl-C (or SIGTERM) stops sending, lets the requests in flight finish (each
  within its time-out) and journals them, then passes the interrupt on.

Standard library only (``urllib``); requests go to the URLs the user gave, nowhere else.
"""
from __future__ import annotations

import concurrent.futures as futures
import hashlib
import json
import os
import shlex
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from exactcheck.errors import ExactcheckError

__all__ = ["EndpointError", "Client", "Exchange", "ClientStats", "curl_line", "read_events", "MAX_ANSWER_BYTES"]

_RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


class EndpointError(ExactcheckError):
    """An endpoint that could not be used: down, the wrong model, an answer that is not the API's
    (one line for the user, exit 2), or a request that failed after every retry.

    ``server_fault``: the server failed a request it had to answer (5xx or a dropped or refused
    connection after every retry, a time-out, an answer that is not JSON, too large, or that never
    ends): once the audit is under way this is a finding of the server, not the user's mistake.
    ``requests``: the requests in flight when it failed, (url, body) each, the failing one first."""

    def __init__(self, message: str, *, server_fault: bool = False, requests: tuple = ()):
        super().__init__(message)
        self.server_fault, self.requests = server_fault, tuple(requests)

    def with_requests(self, requests) -> "EndpointError":
        return EndpointError(str(self), server_fault=self.server_fault, requests=tuple(requests))


MAX_ANSWER_BYTES = 64 << 20  # an answer larger than this is the server's fault, never read whole


def curl_line(url: str, body: dict | None) -> str:
    """The request as a ``curl`` command that sends it again."""
    if body is None:
        return f"curl -s {shlex.quote(url)}"
    text = json.dumps({k: v for k, v in body.items() if not k.startswith("exactcheck_")}, separators=(",", ":"))
    return f"curl -s {shlex.quote(url)} -H 'Content-Type: application/json' -d {shlex.quote(text)}"


@dataclass(frozen=True)
class Exchange:
    """One request and its answer (JSON), as sent and as journalled."""

    base: str
    path: str
    body: dict
    answer: dict
    seconds: float
    from_journal: bool = False
    # when it was in flight (``time.monotonic``): sent and answered; None for an answer from the journal
    sent_at: float | None = None
    answered_at: float | None = None

    @property
    def key(self) -> str:
        return request_key(self.base, self.path, self.body)


def request_key(base: str, path: str, body: dict) -> str:
    text = json.dumps([base.rstrip("/"), path, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass
class ClientStats:
    sent: int = 0
    from_journal: int = 0
    retried: int = 0
    seconds: float = 0.0
    tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def line(self) -> str:
        rate = self.sent / self.seconds if self.seconds else 0.0
        return (f"{self.sent:,} requests sent ({rate:,.0f}/s), {self.from_journal:,} taken from the journal, "
                f"{self.retried:,} retried, {self.tokens:,} tokens generated")


class Client:
    """Requests to one or more endpoints, through one journal (``journal``: a path or None)."""

    def __init__(self, journal: str | Path | None = None, *, concurrency: int = 8, timeout: float = 60.0,
                 retries: int = 4, backoff: float = 0.5, resume: bool = False, progress=None, transport=None):
        # ``transport(base, path, body) -> dict``: answers without HTTP (an in-process served model,
        # for measurements over many seeds); None: HTTP to ``base``
        self.transport = transport
        self.concurrency, self.timeout, self.retries, self.backoff = concurrency, timeout, retries, backoff
        self.stats = ClientStats()
        self.progress = progress
        self.journal_path = Path(journal) if journal is not None else None
        self._held: dict[str, dict] = {}
        self._write_lock = threading.Lock()
        self._in_flight: dict[int, tuple[str, dict]] = {}  # the requests sent and not yet answered
        self._journal = None
        if self.journal_path is not None:
            self.journal_path.parent.mkdir(parents=True, exist_ok=True)
            if resume and self.journal_path.exists():
                self._held = _read_journal(self.journal_path)
            elif not resume and self.journal_path.exists():
                self.journal_path.unlink()  # a fresh audit starts a fresh journal
            self._journal = open(self.journal_path, "a", encoding="utf-8")

    def close(self) -> None:
        if self._journal is not None:
            self._journal.flush()
            os.fsync(self._journal.fileno())
            self._journal.close()
            self._journal = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, base: str, path: str, *, listing: bool = False) -> dict | list:
        """A GET (server facts: /health, /props, /v1/models; ``listing``: a JSON list is an answer too,
        as llama.cpp's /slots); not journalled, not retried past the first."""
        answer = self._send(base, path, None, listing=listing)
        return answer

    def get_text(self, base: str, path: str) -> str:
        """A GET whose answer is text (Prometheus ``/metrics``); not journalled."""
        if self.transport is not None:
            answer = self.transport(base, path, None)
            if not isinstance(answer, str):
                raise EndpointError(f"{base.rstrip('/')}{path} did not answer text")
            return answer
        try:
            with urllib.request.urlopen(base.rstrip("/") + path, timeout=self.timeout) as response:
                return response.read().decode("utf-8", "replace")
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            raise EndpointError(f"{base.rstrip('/')}{path}: {getattr(exc, 'reason', exc)}") from None

    def post(self, base: str, path: str, body: dict) -> Exchange:
        return self.post_many(base, path, [body])[0]

    def post_many(self, base: str, path: str, bodies: Iterable[dict]) -> list[Exchange]:
        """Each body POSTed (journalled answers reused), at most ``concurrency`` at once; the
        exchanges in the order of ``bodies``."""
        return self.post_mixed([(base, path, body) for body in bodies])

    def post_mixed(self, requests: Iterable[tuple[str, str, dict]], concurrency: int | None = None) -> list[Exchange]:
        """Each (base, path, body) POSTed in the order given, at most ``concurrency`` (default the
        client's) in flight at once, whatever endpoint each goes to (mixed traffic: several worlds'
        requests, completions and chat, in one stream); journalled answers reused; the exchanges in
        the order given."""
        requests = list(requests)
        limit = min(concurrency or self.concurrency, self.concurrency)
        results: list[Exchange | None] = [None] * len(requests)
        pending = []
        for i, (base, path, body) in enumerate(requests):
            held = self._held.get(request_key(base, path, body))
            if held is not None:
                results[i] = Exchange(base, path, body, held["answer"], held.get("seconds", 0.0), True)
                with self.stats.lock:
                    self.stats.from_journal += 1
                self._advance(1)
            else:
                pending.append(i)
        if not pending:
            return results
        pool = futures.ThreadPoolExecutor(max_workers=max(1, min(limit, len(pending))))
        try:
            running = {}
            queue = iter(pending)
            for i in queue:  # keep at most ``limit`` in flight, so an interrupt loses none of them
                running[pool.submit(self._exchange, *requests[i])] = i
                if len(running) >= limit:
                    done, _ = futures.wait(running, return_when=futures.FIRST_COMPLETED)
                    for f in done:
                        results[running.pop(f)] = f.result()
            for f in futures.as_completed(list(running)):
                results[running.pop(f)] = f.result()
        except EndpointError as exc:  # name the requests that were in flight with the failing one
            with self.stats.lock:
                others = [r for r in self._in_flight.values() if r not in exc.requests]
            raise exc.with_requests(list(exc.requests) + others) from None
        except KeyboardInterrupt:
            for f in running:  # the requests already sent: wait for their answers and journal them
                try:
                    f.result(timeout=self.timeout * (self.retries + 1))
                except BaseException:  # noqa: BLE001 - interrupted anyway
                    pass
            raise
        finally:
            pool.shutdown(wait=True)
        return results

    def _advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.step("requests", n)

    def _exchange(self, base: str, path: str, body: dict) -> Exchange:
        begun = time.monotonic()
        token = object()
        with self.stats.lock:
            self._in_flight[id(token)] = (base.rstrip("/") + path, body)
        try:
            # a body asking several samples may be answered by a JSON list (llama.cpp's /completion
            # with n_cmpl): kept as {"results": [...]}
            answer = self._send(base, path, body, listing=bool(body.get("exactcheck_listing")))
            if isinstance(answer, list):
                answer = {"results": answer}
        except EndpointError as exc:
            raise exc.with_requests([(base.rstrip("/") + path, body)]) from None
        finally:
            with self.stats.lock:
                self._in_flight.pop(id(token), None)
        answered = time.monotonic()
        seconds = answered - begun
        exchange = Exchange(base, path, body, answer, seconds, sent_at=begun, answered_at=answered)
        with self.stats.lock:
            self.stats.sent += 1
            self.stats.seconds += seconds / max(1, self.concurrency)
            self.stats.tokens += sum(len(a.get("tokens") or ()) or _completion_tokens(a)
                                     for a in answer.get("results", answer.get("events", [answer]))
                                     if isinstance(a, dict))
        if self._journal is not None:
            line = json.dumps({"key": exchange.key, "path": path, "body": body, "answer": answer,
                               "seconds": round(seconds, 4)}, separators=(",", ":"))
            with self._write_lock:
                self._journal.write(line + "\n")
                self._journal.flush()
        self._advance(1)
        return exchange

    def _send(self, base: str, path: str, body: dict | None, *, listing: bool = False) -> dict | list:
        if body is not None:  # exactcheck_* keys tell identical requests apart in the journal; never sent
            body = {k: v for k, v in body.items() if not k.startswith("exactcheck_")}
        if self.transport is not None:
            answer = self.transport(base, path, body)
            if not isinstance(answer, dict) and not (listing and isinstance(answer, list)):
                raise EndpointError(f"{base.rstrip('/')}{path} answered a {type(answer).__name__}, not a JSON object")
            return answer
        url = base.rstrip("/") + path
        data = None if body is None else json.dumps(body).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                with self.stats.lock:
                    self.stats.retried += 1
                time.sleep(self.backoff * 2 ** (attempt - 1))
            request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    text = self._read_bounded(response, url).decode("utf-8", "replace")
            except urllib.error.HTTPError as exc:
                detail = exc.read(4096).decode("utf-8", "replace")[:200] if exc.fp is not None else ""
                last = f"HTTP {exc.code} from {url}: {detail.strip()}"
                if exc.code in _RETRY_STATUS:
                    continue
                raise EndpointError(last) from None  # a 4xx: the request refused (the user's settings)
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                reason = getattr(exc, "reason", exc)
                last = f"{url}: {reason}"
                if body is None and attempt >= 1:  # a fact query: the server is down, say so soon
                    break
                continue
            if body is not None and body.get("stream"):  # a streamed answer: its events, in order
                return {"events": read_events(text, url)}
            try:
                answer = json.loads(text)
            except ValueError:
                raise EndpointError(f"{url} did not answer JSON (got {text[:80]!r}): is it an OpenAI-compatible "
                                    f"or llama.cpp server?", server_fault=True) from None
            if not isinstance(answer, dict) and not (listing and isinstance(answer, list)):
                raise EndpointError(f"{url} answered a JSON {type(answer).__name__}, not an object", server_fault=True)
            return answer
        raise EndpointError(f"no answer after {self.retries + 1} tries: {last}", server_fault=True)

    def _read_bounded(self, response, url: str) -> bytes:
        """The body, read within the request's time-out and at most ``MAX_ANSWER_BYTES`` (a body that
        never ends, or of gigabytes, is the server's fault: an ``EndpointError``, never a hang)."""
        deadline = time.monotonic() + self.timeout
        chunks, size = [], 0
        while True:
            chunk = response.read1(1 << 16) if hasattr(response, "read1") else response.read(1 << 16)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise EndpointError(f"{url} answered more than {MAX_ANSWER_BYTES >> 20} MiB", server_fault=True)
            if time.monotonic() > deadline:
                raise EndpointError(f"{url} was still sending its answer after {self.timeout:g} s (a body that "
                                    "never ends)", server_fault=True)
            chunks.append(chunk)


def read_events(text: str, url: str = "the server") -> list[dict]:
    """The events of a server-sent-event stream (``text/event-stream``): each ``data: {...}`` line's
    JSON, in order, up to ``data: [DONE]`` (OpenAI's end) or the end of the answer (llama.cpp's);
    a line that is not JSON is the server's fault (an ``EndpointError``)."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("data:"):
            continue  # comments, event names, blank separators
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise EndpointError(f"{url} streamed an event that is not JSON ({data[:80]!r})", server_fault=True) from None
        if not isinstance(event, dict):
            raise EndpointError(f"{url} streamed a JSON {type(event).__name__}, not an event object", server_fault=True)
        events.append(event)
    return events


def _completion_tokens(answer: dict) -> int:
    usage = answer.get("usage")
    value = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def _read_journal(path: Path) -> dict[str, dict]:
    """The journal's answers by key; a last line cut short by an interrupt is ignored."""
    held = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "key" in entry and isinstance(entry.get("answer"), dict):
                held[entry["key"]] = entry
    return held
