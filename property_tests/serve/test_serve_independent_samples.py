"""Several samples of one request (issue 59: ``n > 1``): a serve world's ``independent_samples``
check asks each of its requests for k samples (llama.cpp's ``n_cmpl``, OpenAI's ``n``) and judges
them as independent draws of the law: all samples pooled against the law, and the disjoint pairs of
one request by how often both fall in one cell (exactly Binomial(pairs, sum p**2) under the null).
In process, on the toy served model: exact children seeded seed + j pass, the ``same_seed`` mutant
(every sample of a request drawn with its seed: copies) is found, and an API without the field, a
server that refuses it and a chat world are "not judged", with the reason."""
from __future__ import annotations

import numpy as np
import pytest

from exactcheck.core import Outcome
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.runner import run_serve_audit
from exactcheck.stats.pairs import same_cell_pairs
from toy_models.served_lm import ToyServedModel, respond

AUDIT = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), samplings=(Sampling(top_k=6),),
             max_samples=1500, traffic="sequential")


def _audit(model: ToyServedModel, transport=None, **keywords):
    transport = transport or (lambda base, path, body: respond(model, path, body)[1])
    return run_serve_audit("http://toy", transport=transport, **dict(AUDIT, **keywords))


def _check(result):
    return next(v for v in result.verdicts if v.law == "independent_samples")


@pytest.mark.parametrize("api, dialect", [pytest.param("llama.cpp", "llama.cpp", marks=pytest.mark.long),
                                          pytest.param("llama.cpp", "openai", marks=pytest.mark.long), ("vllm", "openai")])
def test_exact_children_pass_and_copies_are_found(api, dialect):
    exact = _check(_audit(ToyServedModel(api=api), api=dialect))
    assert exact.outcome == Outcome.EXACT and exact.samples >= 2 * 375, exact.describe()
    assert "pairs of one request in one cell" in exact.summary
    copies = _check(_audit(ToyServedModel(api=api, several_mutant="same_seed"), api=dialect))
    assert copies.outcome == Outcome.DEFECT, copies.describe()
    assert "repeat each other" in copies.summary and "seeded alike" in copies.summary


def test_the_pair_count_is_binomial_under_independence_and_not_under_copies():
    p = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    pvalues = [same_cell_pairs([rng.choice(3, size=2, p=p) for _ in range(200)], p).pvalue for _ in range(400)]
    assert np.mean(np.array(pvalues) <= 0.01) <= 0.03  # level held (discrete: at most about 0.01)
    copies = same_cell_pairs([np.repeat(rng.choice(3, p=p), 2) for _ in range(50)], p)
    assert copies.same == 50 and copies.q == pytest.approx(0.38) and copies.pvalue < 1e-15
    assert same_cell_pairs([np.array([0, 1, 2])], p).pairs == 1  # an odd sample out pairs with none


@pytest.mark.long
def test_an_api_without_the_field_a_refusing_server_and_one_sample_per_request_are_not_judged():
    model = ToyServedModel()

    def refusing(base, path, body):
        if body is not None and body.get("n_cmpl", 1) > 1:
            from exactcheck.endpoints.client import EndpointError
            raise EndpointError("400: n_cmpl must be <= 1 (the server's slots)")
        return respond(model, path, body)[1]

    refused = _check(_audit(model, transport=refusing, api="llama.cpp"))
    assert refused.outcome == Outcome.INCONCLUSIVE and "refused 2 samples" in refused.summary

    def ignoring(base, path, body):
        return respond(model, path, {k: v for k, v in (body or {}).items() if k != "n_cmpl"} if body else body)[1]

    ignored = _check(_audit(model, transport=ignoring, api="llama.cpp"))
    assert ignored.outcome == Outcome.INCONCLUSIVE and "ignores the field" in ignored.summary
    off = _check(_audit(model, samples_per_request=1, api="llama.cpp"))
    assert off.outcome == Outcome.INCONCLUSIVE and "samples_per_request is 1" in off.summary


def test_a_chat_world_says_where_several_samples_are_audited():
    from exactcheck.serve.chat import ChatPrompt
    result = _audit(ToyServedModel(), prompts=(ChatPrompt.parse(["user:abc"]),), api="llama.cpp")
    assert "completions worlds" in _check(result).summary and _check(result).outcome == Outcome.INCONCLUSIVE
