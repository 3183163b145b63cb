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
    base = f"http://{HOST}:{port}"
    log = tempfile.TemporaryFile(mode="w+b")
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def tail() -> str:
        log.seek(0)
        return log.read()[-3000:].decode(errors="replace")

    try:
        deadline = time.monotonic() + health_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {proc.returncode} before /health:\n{tail()}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=2.0) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama-server not healthy after {health_timeout:.0f} s:\n{tail()}")
            time.sleep(0.05)
        if started is not None:
            started(proc)
        yield base
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        log.close()


__all__ = ["llama_server", "llama_server_binary", "llama_server_path", "server_args", "post_json",
           "get_json", "free_port", "cache_root", "HOST", "LLAMA_SERVER_VERSION"]
