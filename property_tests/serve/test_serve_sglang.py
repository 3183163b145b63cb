"""SGLang's native dialect (``exactcheck.endpoints.sglang_api``) against a faithful fake of its server
(``property_tests/sglang_fake.py``: the toy served model behind SGLang's ``/generate``, exact by
construction): ``auto`` finds it, an exact speculative server passes a quick audit, a server that
samples hotter is found, the per-request counters are read, and what the dialect lacks is not judged
with its reason. No real SGLang runs here (it needs a GPU build); docs/serving.md says what that leaves."""
from __future__ import annotations

import pytest

from exactcheck.endpoints.apis import DIALECTS, detect_api, open_endpoint
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.draft_counts import CounterSource, send_counted
from exactcheck.endpoints.endpoint import RAW, Sampling
from exactcheck.serve.runner import run_serve_audit
from exactcheck.endpoints.sglang_api import SGLangEndpoint, tempered_kind
from sglang_fake import SGLangToy, sglang_server
from toy_models.served_lm import ToyServedModel, served_model

SMALL = dict(level="quick", seed=0, progress=False, prompts=((5, 6, 7),), max_samples=800, traffic="sequential")


@pytest.fixture(scope="module")
def servers():
    with sglang_server(SGLangToy()) as target, sglang_server(SGLangToy(speculative=False)) as plain:
        yield target, plain


def _by_check(result) -> dict:
    return {v.check: v for v in result.verdicts}


def test_auto_finds_sglang_and_not_the_others(servers):
    target, _ = servers
    client = Client(retries=0)
    assert detect_api(client, target.url) == "sglang"
    with served_model(ToyServedModel(api="vllm", server_info={"speculative_algorithm": "EAGLE"})) as vllm:
        assert detect_api(client, vllm.url) == "openai"  # /get_server_info alone is not SGLang's shape
    with served_model(ToyServedModel()) as llama:
        assert detect_api(client, llama.url) == "llama.cpp"
    assert list(DIALECTS) == ["llama.cpp", "mlx-lm", "llama-cpp-python", "sglang", "openai"]
    endpoint = open_endpoint("auto", target.url, client)
    assert isinstance(endpoint, SGLangEndpoint) and endpoint.model == "toy-sglang"
    assert endpoint.speculation_settings()["speculative_num_draft_tokens"] == 4
    with pytest.raises(EndpointError, match="post-sampling"):
        open_endpoint("sglang", target.url, client, reference_probabilities="post-sampling")


def test_bodies_and_per_request_counters(servers):
    target, _ = servers
    endpoint = open_endpoint("sglang", target.url, Client(retries=0))
    body = endpoint.body([5, 6, 7], 6, Sampling(temperature=0.7, top_k=8), 3, n_probs=4)
    assert body["sampling_params"] == {"max_new_tokens": 6, "temperature": 0.7, "top_p": 1.0, "top_k": 8,
                                       "min_p": 0.0, "ignore_eos": True, "sampling_seed": 3}
    assert body["return_logprob"] and body["top_logprobs_num"] == 4 and body["logprob_start_len"] == -1
    assert endpoint.body([5], 1, Sampling(), 0)["sampling_params"]["top_k"] == -1  # -1: off
    with pytest.raises(EndpointError, match="repeat_last_n"):
        endpoint.body([5], 1, Sampling(repetition_penalty=1.2, repeat_last_n=8), 0)
    completions, tally = send_counted(endpoint, [endpoint.body([5, 6, 7], 8, Sampling(), s) for s in range(20)], 4)
    assert tally.source is CounterSource.PER_REQUEST and len(tally.units) == 20
    assert tally.positive == 20 and tally.accepted > 0 and all(len(c.tokens) == 8 for c in completions)
    hot = endpoint.complete_many([endpoint.body([5, 6, 7], 3, Sampling(temperature=0.7), 1, n_probs=1)])[0]
    assert hot.probability_kind == tempered_kind(0.7) != RAW and len(hot.probabilities) == 3
    assert tempered_kind(1.0) == tempered_kind(0.0) == RAW


@pytest.mark.long  # (8-16 s on 2 shared cores: the long run)
def test_an_exact_sglang_server_passes_a_quick_audit(servers):
    target, _ = servers
    # temperature 0.7 with top-p: determinable on SGLang (it truncates the tempered law it reports)
    result = run_serve_audit(target.url, api="sglang", samplings=(
        Sampling(), Sampling(temperature=0.7, top_k=8), Sampling(temperature=0.7, top_p=0.8)), **SMALL)
    verdicts = _by_check(result)
    assert result.passed, [v.describe() for v in result.failed]
    assert "SGLang /generate" in result.reference
    for world in ("p0-t1", "p0-temperature0_7-top_k8", "p0-temperature0_7-top_p0_8"):
        assert verdicts[f"{world}/continuation"].outcome.value == "exact"
        assert verdicts[f"{world}/logprob_fidelity"].outcome.value == "exact", verdicts[f"{world}/logprob_fidelity"].summary
        assert verdicts[f"{world}/speculation_ran"].outcome.value == "exact"  # counters per request
    assert verdicts["server/declared_settings"].outcome.value == "exact"


def test_a_hotter_server_is_found(servers):
    _, plain = servers
    with sglang_server(SGLangToy(), hotter=True) as hot:
        result = run_serve_audit(hot.url, reference=plain.url, samplings=(Sampling(temperature=0.7, top_k=8),),
                                 **SMALL)
    verdicts = _by_check(result)
    assert not result.passed
    continuation = verdicts["p0-temperature0_7-top_k8/continuation"]
    assert continuation.outcome.value == "defect", continuation.summary


def test_what_sglang_does_not_give_is_not_judged_with_the_reason(servers):
    target, _ = servers
    result = run_serve_audit(target.url, api="sglang", samplings=(Sampling(top_k=8, top_p=0.9),), **SMALL)
    continuation = _by_check(result)["p0-top_k8-top_p0_9/continuation"]
    assert continuation.outcome.value == "inconclusive"
    assert "not judged" in continuation.summary and "same probabilities" in continuation.summary


def test_original_logprobs_are_recognised_and_read_as_raw():
    """SGLANG_RETURN_ORIGINAL_LOGPROB (an environment variable, in no server argument): ``check``
    finds it (the same top list at two temperatures), and the audit compares raw with raw against a
    reference that reports tempered ones (read as tempered: the gap would be a false alarm)."""
    with sglang_server(SGLangToy(), original_logprob=True) as original, \
            sglang_server(SGLangToy(speculative=False)) as tempered:
        client = Client(retries=0)
        assert open_endpoint("sglang", original.url, client).original_logprobs
        assert not open_endpoint("sglang", tempered.url, client).original_logprobs
        result = run_serve_audit(original.url, reference=tempered.url, api="sglang",
                                 samplings=(Sampling(temperature=0.7, top_k=8),), **dict(SMALL, max_samples=300))
    fidelity = _by_check(result)["p0-temperature0_7-top_k8/logprob_fidelity"]
    assert fidelity.outcome.value == "exact", fidelity.summary
