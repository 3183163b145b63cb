"""A server that dies or turns hostile mid-audit is a finding of the server, never a usage error:
the audit stops, names the requests in flight as ``curl`` lines, keeps every verdict it has, marks
the rest "not run", and exits 1; ``--resume`` against a restarted server completes it. Each
hostile answer (5xx storm then refused connections, malformed JSON, a body too large, a body that
never ends) is driven through a proxy in front of the toy served model; every wait is bounded."""
from __future__ import annotations

import json
import shlex
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exactcheck.report.verdict import Outcome
from exactcheck.endpoints import client as client_module
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.contracts.loopback import LoopbackServer
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, served_model

SMALL = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), samplings=(Sampling(),), max_samples=400,
             timeout=3.0, traffic="sequential")


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, mode: str, after: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.mode, self.after = upstream, mode, after
        self.posts = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _forward(self, body: bytes | None):
        request = urllib.request.Request(self.server.upstream + self.path, data=body,
                                         method="POST" if body is not None else "GET",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()

    def _send(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(*self._forward(None))

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with self.server.lock:
            self.server.posts += 1
            healthy = self.server.posts <= self.server.after
        if healthy:
            return self._send(*self._forward(body))
        mode = self.server.mode
        if mode == "dies":  # an engine error, then nothing listens (as vLLM after a dead engine)
            self._send(500, b'{"error": "EngineDeadError"}')
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        elif mode == "garbage":
            self._send(200, b"<html>upstream error</html>")
        elif mode == "huge":
            self._send(200, b'{"content": "' + b"x" * (2 << 20) + b'"}')
        elif mode == "endless":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                for _ in range(200):  # bounded here too: 10 s of a trickle
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                pass


class proxy(LoopbackServer):
    poll_interval = 0.05

    def __init__(self, upstream: str, mode: str, after: int):
        self.server = _Proxy(upstream, mode, after)


@pytest.fixture(scope="module")
def toy():
    with served_model(ToyServedModel()) as server:
        yield server


def _finding(result):
    crash = [v for v in result.verdicts if v.check == "process/server_answers"]
    assert len(crash) == 1, [v.check for v in result.verdicts]
    return crash[0]


@pytest.mark.parametrize("mode", [pytest.param("dies", marks=pytest.mark.long), "garbage", "huge", "endless"])
def test_a_server_that_fails_mid_audit_is_its_finding_with_the_requests_named(toy, mode, monkeypatch, tmp_path):
    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 1 << 20)
    monkeypatch.setattr(client_module.Client, "__init__", _fast_retries(client_module.Client.__init__))
    with proxy(toy.url, mode, after=150) as p:
        result = run_serve_audit(p.url, reference=toy.url, journal=str(tmp_path / "journal.jsonl"), **SMALL)
    crash = _finding(result)
    assert crash.outcome is Outcome.CRASHED and not result.passed and not result.undrivable
    assert "the audited server stopped answering valid requests after" in crash.summary
    assert "curl -s http://127.0.0.1:" in crash.summary and crash.reproduce.startswith("curl -s ")
    assert "rerun with --resume" in crash.summary
    expected = {"dies": "no answer after", "garbage": "did not answer JSON", "huge": "more than 1 MiB",
                "endless": "still sending its answer after 3 s"}[mode]
    assert expected in crash.summary, crash.summary
    assert any(v.outcome is Outcome.INCONCLUSIVE and "stopped answering before this check" in v.summary
               for v in result.verdicts)


@pytest.mark.long
def test_resume_against_a_restarted_server_completes_the_audit(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(client_module.Client, "__init__", _fast_retries(client_module.Client.__init__))
    journal = str(tmp_path / "journal.jsonl")
    with proxy(toy.url, "dies", after=150) as p:
        broken = run_serve_audit(p.url, reference=toy.url, journal=journal, **SMALL)
    _finding(broken)
    with proxy(toy.url, "dies", after=10 ** 9) as restarted:  # the same server, restarted (a new port here)
        before = restarted.server.posts
        resumed = run_serve_audit(restarted.url, reference=toy.url, journal=journal, resume=True, **SMALL)
        sent = restarted.server.posts - before
    whole = run_serve_audit(toy.url, reference=toy.url, **SMALL)
    assert resumed.passed, [v.summary for v in resumed.failed]
    assert [(v.check, v.outcome) for v in resumed.verdicts] == [(v.check, v.outcome) for v in whole.verdicts]
    assert sent > 0


def test_a_url_that_never_answered_stays_the_users_mistake():
    from exactcheck.errors import UsageError
    with pytest.raises(UsageError, match="cannot be audited"):
        run_serve_audit("http://127.0.0.1:9", **SMALL)


def _fast_retries(init):
    def fast(self, *args, **keywords):
        keywords.setdefault("backoff", 0.01)
        keywords.setdefault("retries", 2)
        init(self, *args, **keywords)
    return fast


def test_curl_lines_send_the_request_again():
    line = client_module.curl_line("http://127.0.0.1:8080/completion", {"prompt": [1, 2], "n_predict": 3,
                                                                        "exactcheck_tag": "x", "stop": ["it's"]})
    assert line.startswith("curl -s http://127.0.0.1:8080/completion -H 'Content-Type: application/json' -d ")
    words = shlex.split(line)
    assert "exactcheck_tag" not in line and json.loads(words[-1]) == {"prompt": [1, 2], "n_predict": 3, "stop": ["it's"]}


@pytest.mark.long
def test_the_command_exits_1_and_writes_the_partial_report(toy, tmp_path, monkeypatch, capsys):
    from exactcheck.cli import main
    monkeypatch.setattr(client_module.Client, "__init__", _fast_retries(client_module.Client.__init__))
    with proxy(toy.url, "dies", after=150) as p:
        code = main(["serve", p.url, "--reference", toy.url, "--prompt-ids", "1,2", "--max-samples", "400",
                     "--timeout", "3", "--report", str(tmp_path), "--quiet"])
    assert code == 1
    (report,) = tmp_path.glob("*.json")
    data = json.loads(report.read_text())
    crash = next(v for v in data["verdicts"] if v["check"] == "process/server_answers")
    assert crash["outcome"] == "crashed" and crash["reproduce"].startswith("curl -s ")
    assert "rerun with --resume" in crash["summary"]
