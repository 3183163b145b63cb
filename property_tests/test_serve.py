"""The serve audit over HTTP on the toy served model (toy_models.served_lm: exact laws, exact
speculation): the exact server passes, each proxy mutant is found through the HTTP path with its
cause named, the continuation law is exact by enumeration, and an interrupted audit resumes from
its journal without sending any request twice."""
from __future__ import annotations

import itertools
import os
import signal
import threading

import numpy as np
import pytest

from exactcheck.serve.continuation_law import NextTokenLaw, expand
from exactcheck.serve.endpoint import Sampling
from exactcheck.serve.mutants import PROXY_MUTANTS, proxy
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, respond, sampler_chain, served_model

SMALL = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), samplings=(Sampling(),), max_samples=2000)


@pytest.fixture(scope="module")
def servers():
    model = ToyServedModel()
    with served_model(model) as target, served_model(model.as_draft()) as draft, \
            served_model(model.as_plain()) as plain:
        yield model, target, draft, plain


def test_the_continuation_law_is_the_chain_rule_of_the_next_token_laws():
    model = ToyServedModel(vocab=5)
    sampling = dict(temperature=0.8, top_k=4, top_p=0.95, min_p=0.0)

    def next_token(prefix):
        return NextTokenLaw.normalised(dict(enumerate(model.law([3, *prefix], sampling))), listed_all=True)

    law = expand(next_token, 3, min_mass=0.0, max_calls=10_000)
    for tokens in itertools.product(range(5), repeat=3):
        exact = np.prod([model.law([3, *tokens[:i]], sampling)[t] for i, t in enumerate(tokens)])
        assert law.expected[law.cell_of(tokens)] == pytest.approx(exact, abs=1e-12)
    coarse = expand(next_token, 3, min_mass=0.05, max_calls=10_000)  # merged cells keep their exact mass
    assert coarse.expected.sum() == pytest.approx(1.0) and len(coarse.cells) < len(law.cells)
    for tokens in itertools.product(range(5), repeat=3):
        index = coarse.cell_of(tokens)
        if index == len(coarse.cells):  # outside every cell: an outcome of probability 0 (top-k removed it)
            assert law.expected[law.cell_of(tokens)] == 0
            continue
        assert tokens[:len(coarse.cells[index][0])] == coarse.cells[index][0]


def test_the_sampler_chain_applies_top_k_top_p_min_p_then_temperature():
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    assert np.allclose(sampler_chain(p, 1.0, top_k=2), [5 / 7, 2 / 7, 0, 0, 0])
    assert np.allclose(sampler_chain(p, 1.0, top_p=0.6), [5 / 7, 2 / 7, 0, 0, 0])  # the crossing token is kept
    assert np.allclose(sampler_chain(p, 1.0, min_p=0.35), [5 / 7, 2 / 7, 0, 0, 0])  # kept: p >= 0.35 * 0.5
    assert np.allclose(sampler_chain(p, 0.0), [1, 0, 0, 0, 0])


def test_an_exact_served_system_passes_with_its_detectable_tv_stated(servers):
    _, target, _, _ = servers
    result = run_serve_audit(target.url, **SMALL)
    assert result.passed, [v.describe() for v in result.failed]
    law = next(v for v in result.verdicts if v.law == "continuation")
    assert law.samples == 2000 and 0 < law.tv.detectable < 0.2
    assert "speculation ran on 2,000 of 2,000" in next(v for v in result.verdicts if v.law == "speculation_ran").summary


@pytest.mark.parametrize("name", sorted(PROXY_MUTANTS))
def test_each_proxy_mutant_is_found_through_http_with_its_cause(servers, name):
    _, target, draft, plain = servers
    mutant = PROXY_MUTANTS[name]
    with proxy(name, target.url, draft=draft.url, plain=plain.url) as p:
        result = run_serve_audit(p.url, reference=target.url, **SMALL)
    assert not result.passed
    caught = {v.law: v.summary for v in result.failed}
    assert mutant.caught_by in caught, caught
    cause = {"hotter": "sampled hotter", "zero_logprobs": "every reported probability is 0 or 1",
             "draft_logprobs": "not the target's", "speculation_off_for_logprobs": "switched speculation off",
             "seed_cache": "answers repeated across seeds"}[name]
    assert cause in caught[mutant.caught_by]


def test_an_interrupted_audit_resumes_from_its_journal_and_sends_nothing_twice(tmp_path):
    model = ToyServedModel()
    sent = []
    lock = threading.Lock()
    interrupt_at = [700]

    def transport(base, path, body):
        with lock:
            sent.append(path)
            if len(sent) == interrupt_at[0]:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to the main thread
        return respond(model, path, body)[1]

    journal = tmp_path / "journal.jsonl"
    settings = dict(SMALL, transport=transport, journal=str(journal))
    first = run_serve_audit("http://toy", **settings)
    assert first.interrupted and not first.passed
    before = sent.count("/completion")
    interrupt_at[0] = -1
    resumed = run_serve_audit("http://toy", **settings, resume=True)
    after = sent.count("/completion") - before
    sent.clear()
    whole = run_serve_audit("http://toy", **dict(settings, journal=str(tmp_path / "fresh.jsonl")))
    assert 0 < before and before + after == sent.count("/completion")  # each request sent once over the two runs
    assert [(v.check, v.outcome, v.statistic, v.samples) for v in resumed.verdicts] == \
        [(v.check, v.outcome, v.statistic, v.samples) for v in whole.verdicts]
