"""The serve audit against llama-cpp-python's real OpenAI server (``python -m llama_cpp.server``,
llama-cpp-python 0.3.36 built from its sdist, CPU only, by ``bash .ci/llama-cpp-python`` into
~/.cache/exactcheck/llama-cpp-python-venv, or the python named by EXACTCHECK_LLAMA_CPP_PYTHON) on the
tiny GGUF Llama of ``toy_models.bpe_models.write_bpe_gguf`` (a byte-level BPE trained locally: 320 ids,
132 of them sharing their text with another). Skips, saying so, without that python. Every fact is
read against llama-cpp-python's source in docs/serving.md, "llama-cpp-python's server".

- the plain server against itself passes (ids read back from logprob texts, shared texts merged);
- prompt-lookup speculation (``--draft_model prompt-lookup-decoding``, 3 tokens) against the plain
  server passes: sample-and-match is exact (the drafter is shown to draft on this prompt);
- the ``hotter`` proxy in front of the prompt-lookup server is found.

False alarms: quick audits at alpha 1e-3 of exact paths (one in a thousand at most; seeded requests
replay their seed, so a given run is repeatable); the hotter proxy moves the law by TV ~0.3.
Servers listen on 127.0.0.1 on free ports, start once per module and are always stopped; every
request loop is bounded (the audits' requests are planned before they start, max_samples 1200).
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from serve_fixtures import HOST, cache_root, free_port, started_server

from exactcheck.endpoints.apis import detect_api, open_endpoint
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.mutants import proxy
from exactcheck.serve.runner import run_serve_audit

pytestmark = pytest.mark.long

START_TIMEOUT_S = 180.0
# 200 characters of English (toy_models.bpe_models.CORPUS): prompt lookup drafts where a sampled token occurred in it
PROMPT = __import__("toy_models.bpe_models", fromlist=["CORPUS"]).CORPUS[:200]
AUDIT = dict(level="quick", seed=0, progress=False, prompts=(PROMPT,), samplings=(Sampling(),), max_samples=1200,
             n_probs=320, traffic="sequential")


def lcp_python() -> str:
    """The python with llama-cpp-python's server (EXACTCHECK_LLAMA_CPP_PYTHON, else the cached venv), or pytest.skip."""
    python = os.environ.get("EXACTCHECK_LLAMA_CPP_PYTHON") or str(
        cache_root() / "llama-cpp-python-venv" / "bin" / "python")
    if not Path(python).is_file():
        pytest.skip(f"no llama-cpp-python at {python}: install it with `bash .ci/llama-cpp-python` (builds llama.cpp "
                    f"from the sdist: about 3 minutes of 2 idle cores, 20 on busy ones) or name one with "
                    f"EXACTCHECK_LLAMA_CPP_PYTHON")
    try:
        subprocess.run([python, "-c", "import llama_cpp.server.app"], check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"{python} cannot import llama_cpp.server ({type(exc).__name__}): rerun `bash .ci/llama-cpp-python`")
    return python


def lcp_server(python: str, gguf: Path, *, lookup: int | None = None):
    port = free_port()
    args = [python, "-m", "llama_cpp.server", "--model", str(gguf), "--host", HOST, "--port", str(port),
            "--n_ctx", "512", "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False"]
    if lookup:
        args += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(lookup)]
    return started_server(args, "llama_cpp.server", ready_path="/v1/models", port=port, timeout=START_TIMEOUT_S)


@pytest.fixture(scope="module")
def python():
    return lcp_python()


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from toy_models.bpe_models import bpe_tokenizer_dir, write_bpe_gguf
    return write_bpe_gguf(seed=0), str(bpe_tokenizer_dir())


@pytest.fixture(scope="module")
def servers(python, model):
    with lcp_server(python, model[0]) as plain, lcp_server(python, model[0], lookup=3) as lookup:
        yield plain, lookup


def _by_check(result) -> dict:
    return {v.check: v for v in result.verdicts}


def test_llama_cpp_python_is_detected_and_its_tokenizer_is_the_directorys(servers, model):
    plain, _ = servers
    client = Client(retries=0)
    assert detect_api(client, plain) == "llama-cpp-python"
    endpoint = open_endpoint("auto", plain, client, model=model[1])
    assert endpoint.specials == 1 and endpoint.version == "0.3.36"
    with pytest.raises(EndpointError, match="HTTP 500"):  # a token-id prompt: pydantic's error, answered as a 500
        client.post(plain, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 1})


def test_the_plain_server_against_itself_passes(servers, model):
    plain, _ = servers
    result = run_serve_audit(plain, model=model[1], **AUDIT)
    assert result.passed, [v.describe() for v in result.failed]
    verdicts = _by_check(result)
    assert verdicts["p0-t1/continuation"].outcome.value == "exact"
    assert verdicts["p0-t1/logprob_fidelity"].outcome.value == "exact"


def test_prompt_lookup_drafts_on_this_prompt(python, model):
    """No counters in its answers: the drafter is called in process, as the server builds it."""
    script = (
        "import sys, llama_cpp\nfrom llama_cpp.llama_speculative import LlamaPromptLookupDecoding as L\n"
        "drafted = []\nclass Counting(L):\n    def __call__(self, ids, **kw):\n        out = super().__call__(ids, **kw)\n"
        "        drafted.append(len(out))\n        return out\n"
        "llm = llama_cpp.Llama(sys.argv[1], n_ctx=512, n_threads=1, verbose=False, draft_model=Counting(num_pred_tokens=3))\n"
        "for seed in range(10):\n"
        "    llm.create_completion(sys.argv[2], max_tokens=3, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, "
        "repeat_penalty=1.0, seed=seed)\n"
        "print(sum(1 for d in drafted if d > 0), len(drafted))\n")
    out = subprocess.run([python, "-c", script, str(model[0]), PROMPT], capture_output=True, text=True, timeout=300)
    positive, calls = map(int, out.stdout.split())
    assert calls >= 10 and positive >= 3, out.stdout + out.stderr[-2000:]  # measured: 7 of 27 calls drafted


def test_prompt_lookup_speculation_passes_and_a_hotter_proxy_is_found(servers, model):
    plain, lookup = servers
    result = run_serve_audit(lookup, reference=plain, model=model[1], **AUDIT)
    assert result.passed, [v.describe() for v in result.failed]
    assert _by_check(result)["p0-t1/continuation"].outcome.value == "exact"
    with proxy("hotter", lookup) as p:
        hotter = run_serve_audit(p.url, reference=plain, api="llama-cpp-python", model=model[1], **AUDIT)
    law = _by_check(hotter)["p0-t1/continuation"]
    assert not hotter.passed and law.outcome.value == "defect" and "hotter" in law.summary, law.summary
