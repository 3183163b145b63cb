"""The serve audit against mlx-lm's real server (``mlx_lm.server``, mlx-lm 0.32.2 on MLX 0.32.4's CPU
build, installed by ``bash .ci/mlx-lm`` into ~/.cache/exactcheck/mlx-venv, or the python named by
EXACTCHECK_MLX_PYTHON) on the tiny local Llama of toy_models/hf_served_models.py (vocabulary 64,
ids 3..63 the words w3..w63; the draft: the same architecture from another seed). Skips, saying
so, without that python. Every finding is read against mlx-lm's source in docs/serving.md,
"mlx-lm's server".

- plain, prompt cache off (``--prompt-cache-size 0``), against itself: passes;
- plain, default prompt cache, against that reference: passes; against itself the one-token
  requests of the law's expansion send a prompt equal to an earlier prompt and answer, an exact
  prompt-cache hit the server cannot serve (tested directly: the connection closes; unseeded, the
  generation thread dies);
- a draft model (``--draft-model``, ``--num-draft-tokens 3``), prompt cache off, against the plain
  server: passes (sample-and-match is exact);
- a draft model with the default prompt cache: a prompt sent again is served with a token missing
  from its context (the cache is saved one token short of its key), so the law, the logprobs and
  greedy output are wrong: the audit fails it.

Servers listen on 127.0.0.1, on free ports, and are always stopped; every wait is bounded and
every audit's requests are planned before it starts (capped by max_samples).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serve_fixtures import HOST, cache_root, free_port, started_server

from exactcheck.endpoints.apis import detect_api, open_endpoint
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.runner import run_serve_audit

pytestmark = pytest.mark.long

START_TIMEOUT_S = 180.0  # a loaded 2-core machine: about 3 s idle
PROMPT = [5, 6, 7]
AUDIT = dict(level="quick", seed=0, progress=False, prompts=(tuple(PROMPT),),
             samplings=(Sampling(), Sampling(temperature=0.7, top_k=8)), max_samples=1200, traffic="sequential")


def mlx_python() -> str:
    """The python with mlx-lm (EXACTCHECK_MLX_PYTHON, else the cached venv), or pytest.skip."""
    python = os.environ.get("EXACTCHECK_MLX_PYTHON") or str(cache_root() / "mlx-venv" / "bin" / "python")
    if not Path(python).is_file():
        pytest.skip(f"no mlx-lm python at {python}: install it with `bash .ci/mlx-lm` (about 20 s; 85 s on a busy "
                    f"machine) or name one with EXACTCHECK_MLX_PYTHON")
    try:
        subprocess.run([python, "-c", "import mlx.core, mlx_lm"], check=True, capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        pytest.skip(f"{python} cannot import mlx.core and mlx_lm ({type(exc).__name__}): rerun `bash .ci/mlx-lm`")
    return python


@contextlib.contextmanager
def mlx_server(python: str, model: Path, *, draft: Path | None = None, cache: bool = True,
               hf_cache: str | None = None):
    """``mlx_lm server`` on 127.0.0.1; yields its base URL; always stopped. ``cache=False``:
    ``--prompt-cache-size 0``. ``hf_cache``: the server's HF_HUB_CACHE (its /v1/models scans it:
    absent, it answers an empty body)."""
    port = free_port()
    args = [python, "-m", "mlx_lm", "server", "--model", str(model), "--host", HOST, "--port", str(port),
            "--log-level", "WARNING"]
    if draft is not None:
        args += ["--draft-model", str(draft), "--num-draft-tokens", "3"]
    if not cache:
        args += ["--prompt-cache-size", "0"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=hf_cache or os.path.join(tempfile.gettempdir(),
                                                                                      "exactcheck-no-hf-cache"))
    with started_server(args, "mlx_lm server", ready_path="/health", port=port, timeout=START_TIMEOUT_S,
                        env=env, poll_s=0.1) as base:
        yield base


def post(base: str, body: dict, timeout: float = 60.0) -> dict:
    request = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.loads(r.read())


def words(ids) -> str:
    return " ".join(f"w{i}" for i in ids)


def top_law(answer: dict) -> dict[int, float]:
    return {e["id"]: e["logprob"] for e in answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]}


@pytest.fixture(scope="module")
def python():
    return mlx_python()


@pytest.fixture(scope="module")
def models():
    pytest.importorskip("transformers")
    from toy_models.hf_served_models import write_llama
    return write_llama(seed=0), write_llama(seed=1)


@pytest.fixture(scope="module")
def plain(python, models, tmp_path_factory):
    """The target alone, prompt cache off, with a Hugging Face cache directory (so /v1/models lists it)."""
    hf_cache = tmp_path_factory.mktemp("hf-hub")
    with mlx_server(python, models[0], cache=False, hf_cache=str(hf_cache)) as base:
        yield base


def _laws(result) -> dict:
    return {v.check: v for v in result.verdicts}


def test_mlx_lm_is_detected_and_its_logprob_lists_are_read_by_id(plain, models):
    """auto finds mlx-lm; its model directory is found through /v1/models; with top_logprobs the
    server's content entries are the first of each unsorted top list, not the generated tokens
    (server.py generate_response), so ids are read only from requests without it."""
    client = Client()
    assert detect_api(client, plain) == "mlx-lm"
    endpoint = open_endpoint("auto", plain, client)  # the directory from /v1/models
    assert endpoint.directory == Path(models[0]).resolve() and endpoint.eos_ids == {2} and endpoint.specials == 0
    assert "raw probabilities (top 11)" in endpoint.describe() and "no speculation counters" in endpoint.describe()
    with pytest.raises(EndpointError, match="reports raw probabilities"):
        open_endpoint("mlx-lm", plain, client, reference_probabilities="post-sampling")
    body = {"prompt": "w5 w6 w7", "max_tokens": 3, "temperature": 1.0, "seed": 3, "logprobs": True}
    plain_ids = post(plain, body)["choices"][0]
    with_top = post(plain, dict(body, top_logprobs=5))["choices"][0]
    assert plain_ids["text"] == with_top["text"] == words(e["id"] for e in plain_ids["logprobs"]["content"])
    assert all(e["id"] == e["top_logprobs"][0]["id"] for e in with_top["logprobs"]["content"])
    assert [e["id"] for e in with_top["logprobs"]["content"]] != [e["id"] for e in plain_ids["logprobs"]["content"]]
    with pytest.raises(EndpointError, match="HTTP 404"):  # token-id prompts: the tokenizer refuses a list
        client.post(plain, "/v1/completions", dict(body, prompt=PROMPT))


def test_the_plain_server_against_itself_passes(plain):
    result = run_serve_audit(plain, **AUDIT)  # api auto, the model directory from /v1/models
    assert result.passed, [v.describe() for v in result.failed]
    laws = _laws(result)
    assert "mlx-lm /v1/completions" in result.reference
    assert all(laws[f"{w}/continuation"].outcome.value == "exact" for w in ("p0-t1", "p0-temperature0_7-top_k8"))
    assert all(laws[f"{w}/logprob_fidelity"].outcome.value == "exact" for w in ("p0-t1", "p0-temperature0_7-top_k8"))
    ran = laws["p0-t1/speculation_ran"]
    assert ran.outcome.value == "inconclusive" and "no draft counted" in ran.summary
    assert laws["server/declared_settings"].outcome.value == "inconclusive"


def test_a_penalty_world_is_not_judged_and_says_why(plain):
    """mlx-lm's penalties read only the part of the prompt its prompt cache did not hold, so the
    history depends on earlier requests: a penalty world is "not judged" with that reason, and the
    audit of the plain server still passes (docs/serving.md, "Penalties in the serve law")."""
    result = run_serve_audit(plain, **dict(AUDIT, samplings=(Sampling(repetition_penalty=1.3),), max_samples=300))
    assert result.passed, [v.describe() for v in result.failed]
    law = next(v for v in result.verdicts if v.check.endswith("/continuation"))
    assert law.outcome.value == "inconclusive" and "prompt cache" in law.summary, law.summary


def test_the_default_plain_server_is_exact_and_cannot_serve_an_exact_prompt_cache_hit(python, models, plain):
    with mlx_server(python, models[0]) as default:
        client = Client(retries=1, backoff=0.1)
        with pytest.raises(EndpointError, match="empty body.*--model DIR"):  # /v1/models: no HF cache directory
            open_endpoint("auto", default, client)
        result = run_serve_audit(default, reference=plain, model=str(models[0]), **AUDIT)
        assert result.passed, [v.describe() for v in result.failed]
        assert all(v.outcome.value == "exact" for v in result.verdicts if v.law == "continuation")
        # a prompt equal to an earlier prompt and its answer: fetch_nearest_cache's exact hit leaves
        # nothing to prefill (models/cache.py), generate_step raises, the connection closes
        first = post(default, {"prompt": "w9 w10 w11", "max_tokens": 3, "temperature": 1.0, "seed": 1,
                               "logprobs": True})["choices"][0]
        assert first["finish_reason"] == "length"  # no end-of-text token: the text is the whole cached key
        again = words([9, 10, 11] + [e["id"] for e in first["logprobs"]["content"]])
        with pytest.raises(EndpointError) as dropped:
            client.post(default, "/v1/completions", {"prompt": again, "max_tokens": 1, "seed": 2, "logprobs": True})
        assert dropped.value.server_fault
        assert client.get(default, "/health") == {"status": "ok"}
        # unseeded, the request is batched and the same hit kills the generation thread for good
        with pytest.raises(EndpointError):
            client.post(default, "/v1/completions", {"prompt": again, "max_tokens": 1, "logprobs": True})
        with pytest.raises(EndpointError, match="HTTP 503"):
            client.get(default, "/health")


def test_draft_model_speculation_keeps_the_law_with_the_prompt_cache_off(python, models, plain):
    with mlx_server(python, models[0], draft=models[1], cache=False) as speculating:
        result = run_serve_audit(speculating, reference=plain, model=str(models[0]), **AUDIT)
    assert result.passed, [v.describe() for v in result.failed]
    laws = [v for v in result.verdicts if v.law == "continuation"]
    assert len(laws) == 2 and all(v.outcome.value == "exact" for v in laws), [v.describe() for v in laws]
    assert all(v.outcome.value == "exact" for v in result.verdicts if v.law == "logprob_fidelity")


def test_draft_model_speculation_with_the_prompt_cache_serves_a_context_missing_a_token(python, models, plain):
    """speculative_generate_step rewinds the target's cache to the tokens it processed, one short of
    the answer when its last token is the verify step's own (generate.py), while the server keys the
    saved cache by the prompt and every token answered (server.py _serve_single): a prompt sent again
    is served with its second-to-last token missing."""
    with mlx_server(python, models[0], draft=models[1]) as speculating:
        short = 0
        for seed in range(4):
            prompt = [10 + seed, 20 + seed, 30 + seed, 40 + seed]
            post(speculating, {"prompt": words(prompt), "max_tokens": 3, "temperature": 1.0, "seed": seed,
                               "logprobs": True})
            one = {"max_tokens": 1, "temperature": 0.0, "seed": 0, "logprobs": True, "top_logprobs": 5}
            served = top_law(post(speculating, dict(one, prompt=words(prompt))))
            right = top_law(post(plain, dict(one, prompt=words(prompt))))
            missing = top_law(post(plain, dict(one, prompt=words(prompt[:-2] + prompt[-1:]))))
            if served != right:
                assert set(served) == set(missing) and all(math.isclose(served[t], missing[t], abs_tol=1e-5)
                                                           for t in served), (seed, served, missing)
                short += 1
        assert short >= 1
        result = run_serve_audit(speculating, reference=plain, model=str(models[0]),
                                 **dict(AUDIT, samplings=AUDIT["samplings"][:1], max_samples=400))
    laws = _laws(result)
    assert not result.passed and laws["p0-t1/continuation"].outcome.value == "defect", laws["p0-t1/continuation"].summary
