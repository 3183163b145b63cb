"""mlx-lm's dialect on the toy served model (``ToyServedModel(api="mlx-lm")``): what the real
``mlx_lm.server`` 0.32.2 answers, as ``exactcheck.endpoints.mlx_lm_api`` reads it (property_tests/
test_serve_mlx.py audits the real server, long), served over HTTP on 127.0.0.1. ``auto`` finds the
dialect, an exact draft-model path passes, and a proxy that samples hotter is found through it.
The word-level tokenizer of ``toy_models.hf_served_models.write_llama`` reads the text prompts
(vocabulary 64: ids 0-2 special, w3 ... w63)."""
from __future__ import annotations

import pytest

from exactcheck.endpoints.apis import detect_api, open_endpoint
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.mutants import PROXY_MUTANTS, proxy
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, served_model

SMALL = dict(level="quick", seed=0, progress=False, prompts=((5, 6, 7),), samplings=(Sampling(),), max_samples=1200,
             traffic="sequential")


@pytest.fixture(scope="module")
def mlx_toy():
    pytest.importorskip("transformers")
    from toy_models.hf_served_models import write_llama
    model = ToyServedModel(vocab=64, api="mlx-lm", tokenizer_dir=str(write_llama(seed=0)))
    with served_model(model) as target, served_model(model.as_plain()) as plain:
        yield target, plain


def _by_check(result) -> dict:
    return {v.check: v for v in result.verdicts}


def test_the_toy_speaks_mlx_lms_dialect_and_an_exact_draft_model_path_passes(mlx_toy):
    target, plain = mlx_toy
    client = Client(retries=0)
    assert detect_api(client, target.url) == "mlx-lm"  # 404 "Not Found", then "logprobs must be of type bool"
    endpoint = open_endpoint("auto", target.url, client)  # the directory from /v1/models
    assert endpoint.eos_ids == {2} and endpoint.specials == 0 and endpoint.vocab_size == 64
    body = {"prompt": "w5 w6 w7", "max_tokens": 3, "temperature": 1.0, "seed": 3, "logprobs": True}
    answer = client.post(target.url, "/v1/completions", body).answer["choices"][0]
    ids = [e["id"] for e in answer["logprobs"]["content"]]
    assert answer["text"] == " ".join(f"w{i}" for i in ids if i != 2)
    with_top = client.post(target.url, "/v1/completions", dict(body, top_logprobs=11)).answer["choices"][0]
    assert all(e["id"] == e["top_logprobs"][0]["id"] and len(e["top_logprobs"]) == 11
               for e in with_top["logprobs"]["content"])  # the first of each top list, not the generated token
    for refused, status in ((dict(body, top_logprobs=12), "HTTP 400"), (dict(body, prompt=[5, 6, 7]), "HTTP 404")):
        with pytest.raises(EndpointError, match=status):
            client.post(target.url, "/v1/completions", refused)
    result = run_serve_audit(target.url, reference=plain.url, **SMALL)
    assert result.passed, [v.describe() for v in result.failed]
    verdicts = _by_check(result)
    assert "mlx-lm /v1/completions" in result.reference
    assert verdicts["p0-t1/continuation"].outcome.value == "exact"
    assert verdicts["p0-t1/logprob_fidelity"].outcome.value == "exact"
    assert verdicts["p0-t1/speculation_ran"].outcome.value == "inconclusive"  # mlx-lm has no counters
    assert target.requests["/v1/completions"] >= 1200


def test_a_hotter_proxy_is_found_through_the_mlx_lm_dialect(mlx_toy):
    target, plain = mlx_toy
    with proxy("hotter", target.url) as p:  # the proxy passes a 404 on as JSON: name the dialect
        result = run_serve_audit(p.url, reference=plain.url, api="mlx-lm", **SMALL)
    verdicts = _by_check(result)
    assert not result.passed
    assert PROXY_MUTANTS["hotter"].caught_by == "continuation"
    assert verdicts["p0-t1/continuation"].outcome.value == "defect", verdicts["p0-t1/continuation"].summary
    # from raw top-11 lists the tokens past the 11th are one cell of large mass: the cause is read over
    # the single-continuation cells only, where hotter answers are less likely than the law says
    assert "hotter" in verdicts["p0-t1/continuation"].summary, verdicts["p0-t1/continuation"].summary
