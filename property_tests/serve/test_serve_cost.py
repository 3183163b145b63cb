"""``exactcheck cost URL --reference URL2``: the cost of a served speculative-decoding system.

Against the toy served model (``toy_models.served_lm``, speculative and plain) behind a small proxy
on 127.0.0.1 that logs every completion request in the order it arrives, sleeps a fixed time before
answering, and can die after N answers: the same requests reach both servers in the stated order
(A B, B A, ...), the figures are the ones the records give (ratios and intervals, on known
latencies), a server that dies mid-run is exit 1 with the partial report written, and a user's
mistake is one line and exit 2. The statistics (``exactcheck.stats.timing``) are checked on known
numbers. One long test runs the real llama-server, a draft model against the same server without.
"""
from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from scipy import stats

from exactcheck.cli import main
from exactcheck.errors import UsageError
from exactcheck.endpoints import client as client_module
from exactcheck.cost.served import plan_requests, run_served_cost
from exactcheck.contracts.loopback import LoopbackServer
from exactcheck.endpoints.endpoint import GREEDY_SAMPLING, Sampling
from exactcheck.stats.timing import mean_interval, median_interval, ratio_of_rates, ratio_of_sums
from toy_models.served_lm import ToyServedModel, served_model

PROMPTS = ((5, 6, 7), (10, 11, 3, 10))


# ---- a proxy that logs, sleeps and can die ------------------------------------------------------

class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str, upstream: str, log: list, delay: float, dies_after: int | None):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.name, self.upstream, self.log, self.delay, self.dies_after = name, upstream, log, delay, dies_after
        self.answered = 0
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _relay(self, body: bytes | None) -> None:
        request = urllib.request.Request(self.server.upstream + self.path, data=body,
                                         method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, data = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._relay(None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/completion":
            return self._relay(body)
        server = self.server
        with server.lock:
            dead = server.dies_after is not None and server.answered >= server.dies_after
            server.answered += 1
            server.log.append((server.name, json.loads(body)))
        if dead:  # an engine error, then nothing listens
            data = b'{"error": "EngineDeadError"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            threading.Thread(target=_close, args=(server,), daemon=True).start()
            return
        time.sleep(server.delay)
        self._relay(body)


def _close(server: _Proxy) -> None:
    server.shutdown()
    server.server_close()  # refused from now on


class proxy(LoopbackServer):
    poll_interval = 0.05

    def __init__(self, name: str, upstream: str, log: list, delay: float = 0.0, dies_after: int | None = None):
        self.server = _Proxy(name, upstream, log, delay, dies_after)


@pytest.fixture(scope="module")
def toys():
    model = ToyServedModel()
    with served_model(model) as speculative, served_model(model.as_plain()) as plain:
        yield speculative.url, plain.url


@pytest.fixture
def fast_retries(monkeypatch):
    init = client_module.Client.__init__

    def fast(self, *args, **keywords):
        keywords["backoff"] = 0.01
        init(self, *args, **keywords)
    monkeypatch.setattr(client_module.Client, "__init__", fast)


def _run(audited: str, reference: str, **keywords) -> dict:
    settings = dict(prompts=PROMPTS, samplings=(GREEDY_SAMPLING, Sampling()), requests=4, new_tokens=6, seed=3,
                    progress=False, timeout=5.0)
    return run_served_cost(audited, reference=reference, **{**settings, **keywords})


# ---- the requests --------------------------------------------------------------------------------

def test_the_same_requests_reach_both_servers_in_alternating_order(toys):
    log: list = []
    with proxy("audited", toys[0], log) as a, proxy("reference", toys[1], log) as b:
        data = _run(a.url, b.url)
    assert [name for name, _ in log[:2]] == ["audited", "reference"]  # the warm-ups, one each
    timed = log[2:]
    assert len(timed) == 2 * 4 * 2 and data["settings"]["complete_pairs"] == 8
    for pair in range(8):
        first, second = timed[2 * pair], timed[2 * pair + 1]
        request, setting = divmod(pair, 2)  # request i of setting s: the audited server first when i + s is even
        assert (first[0], second[0]) == (("audited", "reference") if (request + setting) % 2 == 0
                                         else ("reference", "audited"))
        assert first[1] == second[1]  # byte for byte the same body: prompt, sampling, seed, length
        assert first[1]["n_predict"] == 6 and first[1]["prompt"] == list(PROMPTS[(pair // 2) % 2])
    # the pairs cycle through the settings; every pair has its own seed
    assert [body["temperature"] for _, body in timed[::2]] == [0.0, 1.0] * 4
    assert len({body["seed"] for _, body in timed[::2]}) == 8
    records = data["records"]
    assert [r["order"] for r in records] == list(range(16))
    assert all(r["tokens"] == 6 and r["retried"] == 0 for r in records)
    by_pair = {}
    for r in records:
        by_pair.setdefault(r["pair"], {})[r["server"]] = r
    assert all(p["audited"]["seed"] == p["reference"]["seed"] for p in by_pair.values())
    # greedy is the same tokens on both (the toy speculates exactly), counted, not judged
    assert data["summary"]["by_setting"][0]["identical_outputs"] == 4
    audited = data["summary"]["all"]["audited"]["speculation"]
    assert audited["source"].startswith("the server's own counters per request") and audited["drafted"] > 0
    assert data["summary"]["all"]["reference"]["speculation"]["source"] is None
    assert data["servers"]["audited"]["declared_settings"]["speculative"] is True


def test_server_wide_counters_are_read_after_the_warm_ups_and_at_the_end():
    """Through OpenAI's API as vLLM serves it: counters only server-wide, in /metrics."""
    model = ToyServedModel(api="vllm")
    with served_model(model) as speculative, served_model(model.as_plain()) as plain:
        data = _run(speculative.url, plain.url, samplings=(Sampling(),))
        drafted_in_run = model.totals[0]
    audited, reference = (data["summary"]["all"][role]["speculation"] for role in ("audited", "reference"))
    assert audited["source"].startswith("the server-wide /metrics counters") and 0 < audited["drafted"]
    assert audited["drafted"] < drafted_in_run  # the warm-up's drafts are not counted
    assert audited["acceptance"]["estimate"] == audited["accepted"] / audited["drafted"]
    assert reference["drafted"] == 0 and reference["acceptance"] is None
    assert "OpenAI /v1/completions" in data["servers"]["audited"]["endpoint"]


def test_the_reproduce_line_sends_the_same_requests_again(toys, tmp_path, capsys):
    import shlex
    data = _run(toys[0], toys[1], samplings=(Sampling(temperature=0.7, top_k=3),), requests=2)
    line = data["reproduce"]
    assert line.startswith(f"exactcheck cost {toys[0]} --reference {toys[1]} --prompt-ids 5,6,7 ")
    assert main(shlex.split(line)[1:] + ["--report", str(tmp_path), "--quiet"]) == 0
    again = json.loads(next(tmp_path.glob("cost-served-*.json")).read_text())
    assert again["reproduce"] == line
    sent = lambda d: [(r["server"], r["seed"], r["prompt"], r["setting"]) for r in d["records"]]  # noqa: E731
    assert sent(again) == sent(data) and again["settings"]["samplings"] == ["temperature 0.7, top-k 3"]
    assert capsys.readouterr().out.startswith("Latency audited / reference ")


def test_the_plan_is_fixed_before_the_first_request():
    plan = plan_requests(prompts=2, settings=3, requests=5, seed=0)
    assert len(plan) == 15 and [r.pair for r in plan] == list(range(15))
    assert [r.setting for r in plan[:6]] == [0, 1, 2, 0, 1, 2] and [r.prompt for r in plan[:6]] == [0, 0, 0, 1, 1, 1]
    assert [r.audited_first for r in plan[:6]] == [True, False, True, False, True, False]
    for s in range(3):  # within every setting the first server alternates
        assert [r.audited_first for r in plan if r.setting == s] == [(i + s) % 2 == 0 for i in range(5)]
    two = plan_requests(prompts=1, settings=2, requests=4, seed=0)
    assert [r.audited_first for r in two] == [True, False, False, True, True, False, False, True]
    assert plan == plan_requests(prompts=2, settings=3, requests=5, seed=0)
    assert plan != plan_requests(prompts=2, settings=3, requests=5, seed=1)


# ---- the figures ---------------------------------------------------------------------------------

def test_ratio_and_intervals_on_known_latencies(toys):
    """The audited server answers after 50 ms, the reference after 150 ms: every figure is what the
    records give. (The ratio itself, 1/3 plus what the toy and HTTP add to both, is not asserted: on a
    busy machine that overhead has no bound, and a test of ours never hangs on the machine's load.)"""
    log: list = []
    with proxy("audited", toys[0], log, delay=0.05) as a, proxy("reference", toys[1], log, delay=0.15) as b:
        data = _run(a.url, b.url, samplings=(Sampling(),), requests=8)
    overall = data["summary"]["all"]
    ratio = overall["latency_ratio"]
    audited = np.array([r["latency_s"] for r in data["records"] if r["server"] == "audited"])
    reference = np.array([r["latency_s"] for r in data["records"] if r["server"] == "reference"])
    assert audited.min() >= 0.05 and reference.min() >= 0.15
    assert ratio["low"] <= ratio["estimate"] <= ratio["high"]
    assert ("faster" in main_headline(data)) == (ratio["high"] < 1), (ratio, main_headline(data))
    assert math.isclose(ratio["estimate"], audited.sum() / reference.sum(), rel_tol=1e-12)
    assert math.isclose(overall["audited"]["latency_mean_s"]["estimate"], audited.mean(), rel_tol=1e-12)
    assert math.isclose(overall["reference"]["latency_median_s"]["estimate"], np.median(reference), rel_tol=1e-12)
    assert math.isclose(overall["audited"]["tokens_per_s"]["estimate"], 6 * 8 / audited.sum(), rel_tol=1e-12)
    assert math.isclose(overall["throughput_ratio"]["estimate"], reference.sum() / audited.sum(), rel_tol=1e-12)
    assert overall["audited_slower"] == int((audited > reference).sum())


def main_headline(data: dict) -> str:
    from exactcheck.report.served_cost_report import served_cost_headline
    return served_cost_headline(data)


def test_a_ratio_every_pair_shares_has_that_ratio_as_its_interval():
    audited, reference = [0.1, 0.2, 0.3, 0.4], [0.2, 0.4, 0.6, 0.8]
    ratio = ratio_of_sums(audited, reference)
    assert (ratio.estimate, ratio.low, ratio.high) == (0.5, 0.5, 0.5)
    rates = ratio_of_rates([8] * 4, audited, [8] * 4, reference)
    assert math.isclose(rates.estimate, 2.0) and math.isclose(rates.low, 2.0) and math.isclose(rates.high, 2.0)
    spread = ratio_of_sums([1, 2, 3, 4, 5, 6], [2, 2, 2, 2, 2, 2], seed=1)
    assert spread.estimate == 21 / 12 and spread.low < spread.estimate < spread.high


def test_the_mean_has_students_interval_and_the_median_an_order_statistic_one():
    mean = mean_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t(0.975, 2) * s / sqrt(n), s = 1
    assert mean.estimate == 2.0 and math.isclose(mean.low, 2 - half) and math.isclose(mean.high, 2 + half)
    rng = np.random.default_rng(0)
    x = rng.exponential(size=40)
    median = median_interval(x)
    # [x_(j), x_(41-j)] covers with probability 1 - 2 P(B <= j - 1): the largest j with that >= 0.95
    j = max(j for j in range(1, 21) if 1 - 2 * stats.binom.cdf(j - 1, 40, 0.5) >= 0.95)
    assert (median.low, median.high) == (np.sort(x)[j - 1], np.sort(x)[40 - j]) and median.confidence >= 0.95
    few = median_interval([3.0, 1.0, 2.0])
    assert (few.estimate, few.low, few.high) == (2.0, 1.0, 3.0) and few.confidence == 0.75  # 1 - 2^(1-3)
    assert math.isnan(mean_interval([1.0]).low) and math.isnan(ratio_of_sums([], []).estimate)


# ---- a server that dies, a user's mistake --------------------------------------------------------

def test_a_server_dying_mid_run_exits_1_with_the_partial_report(toys, tmp_path, capsys, fast_retries):
    log: list = []
    with proxy("audited", toys[0], log) as a, proxy("reference", toys[1], log, dies_after=8) as b:
        code = main(["cost", a.url, "--reference", b.url, "--prompt-ids", "5,6,7", "--prompts", "8",
                     "--new-tokens", "4", "--timeout", "3", "--report", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "Stopped early: the reference server" in out and "stopped answering after" in out
    (report,) = tmp_path.glob("cost-served-*.json")
    data = json.loads(report.read_text())
    stop = data["stopped"]
    assert stop["role"] == "reference" and stop["server"] == b.url and "no answer after" in stop["error"]
    assert stop["requests"][0].startswith(f"curl -s {b.url}/completion")
    # the reference answered its warm-up and pairs 0-6; pair 7 (audited first) lost its reference request
    assert data["settings"]["complete_pairs"] == 7 < data["settings"]["planned_pairs"] == 16
    assert data["summary"]["all"]["pairs"] == 7 and len(data["records"]) == 15
    assert [r["server"] for r in data["records"] if r["pair"] == 7] == ["audited"]
    markdown = report.with_suffix(".md").read_text()
    assert "**Stopped early**" in markdown and report.with_suffix(".html").exists()
    assert main(["render", str(report)]) == 0


@pytest.mark.parametrize("argv, words", [
    (["cost", "URL"], "needs --reference URL2"),
    (["cost", "URL", "--reference", "http://127.0.0.1:9"], "the reference server cannot be measured"),
    (["cost", "http://127.0.0.1:9", "--reference", "REF"], "the audited server cannot be measured"),
    (["cost", "URL", "--reference", "URL"], "is the audited server"),
    (["cost", "URL", "--reference", "REF", "--world", "three_token"], "--world: not for a served system"),
    (["cost", "URL", "--reference", "REF", "--sampling", "temperature=hot"], "--sampling 'temperature=hot'"),
    (["cost", "URL", "--reference", "REF", "--prompts", "1"], "--prompts must be at least 2"),
    (["cost", "reference-loop", "--reference", "REF"], "--reference: only for a served system"),
    (["cost", "--model", "gpt-5"], "--model 'gpt-5': expected one of"),
])
def test_a_users_mistake_is_one_line_and_exit_2(toys, argv, words, capsys, fast_retries):
    argv = [{"URL": toys[0], "REF": toys[1]}.get(a, a) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0] and words in err[0], err


def test_a_refused_request_is_the_users_mistake(toys):
    """A 4xx (here a prompt the server cannot read) is what the user asked, not a server fault."""
    with pytest.raises(UsageError, match="HTTP 400"):
        _run(toys[0], toys[1], prompts=((5, 6, 10 ** 6),))


# ---- the real llama-server -----------------------------------------------------------------------

@pytest.mark.long
def test_llama_server_with_a_draft_model_against_itself_without():
    from serve_fixtures import llama_server, llama_server_binary
    llama_server_binary()
    pytest.importorskip("gguf")
    from toy_models.gguf_models import write_pair
    begun = time.monotonic()
    target, draft = write_pair(seed=0)
    with llama_server(target, draft=draft, draft_max=3) as audited, llama_server(target) as reference:
        data = run_served_cost(audited, reference=reference, prompts=((5, 6, 7, 8), (30, 31, 5, 6, 30, 31, 5, 6)),
                               requests=6, new_tokens=32, progress=False, timeout=30.0)
    assert data["stopped"] is None and data["settings"]["complete_pairs"] == 12
    overall = data["summary"]["all"]
    assert all(r["tokens"] == 32 for r in data["records"])
    spec = overall["audited"]["speculation"]
    assert spec["drafted"] > 0 and 0 < spec["accepted"] <= spec["drafted"]
    assert overall["reference"]["speculation"]["drafted"] in (None, 0)
    assert data["summary"]["by_setting"][0]["identical_outputs"] == 6  # greedy: the same tokens, on or off
    ratio = overall["latency_ratio"]
    assert ratio["low"] <= ratio["estimate"] <= ratio["high"]
    assert time.monotonic() - begun < 60
