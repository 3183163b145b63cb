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

from exactcheck.endpoints.continuation_law import NextTokenLaw, expand
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.mutants import PROXY_MUTANTS, proxy
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, respond, sampler_chain, served_model

# one world, sent one request after another (the older traffic): the mixed traffic's own checks and
# mutants are test_serve_traffic.py's and test_serve_finishing.py's, and cost three times the requests
SMALL = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), samplings=(Sampling(),), max_samples=2000,
             traffic="sequential")


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
    # 2,000 law requests and 500 streamed ones (stream_share 0.25)
    assert "speculation ran: 2,500 of 2,500 requests drafted" in next(
        v for v in result.verdicts if v.law == "speculation_ran").summary


# the chat mutants change the chat endpoint only; test_serve_chat.py finds them through it; the stop
# mutants change answers to requests with stop strings only: test_serve_stops.py and test_serve_llama.py;
# the stream mutants change streamed answers only: test_serve_traffic.py
COMPLETIONS_MUTANTS = sorted(name for name in PROXY_MUTANTS if not name.startswith(("chat_", "stop_", "stream_")))


@pytest.mark.long
@pytest.mark.parametrize("name", COMPLETIONS_MUTANTS)
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
             "seed_cache": "answers repeated across seeds", "copied_samples": "repeat each other"}[name]
    assert cause in caught[mutant.caught_by]


@pytest.mark.parametrize("traffic", ["sequential", "mixed"])  # mixed: the default run's audit under the default traffic
def test_an_interrupted_audit_resumes_from_its_journal_and_sends_nothing_twice(tmp_path, traffic):
    from exactcheck.endpoints.client import request_key
    model = ToyServedModel()
    sent = []
    lock = threading.Lock()
    interrupt_at = [700]

    def transport(base, path, body):
        with lock:
            sent.append((path, request_key(base, path, body) if body is not None else None))
            if len(sent) == interrupt_at[0]:
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, delivered to the main thread
        return respond(model, path, body)[1]

    journal = tmp_path / "journal.jsonl"
    settings = dict(SMALL, transport=transport, journal=str(journal), traffic=traffic)
    first = run_serve_audit("http://toy", **settings)
    assert first.interrupted and not first.passed
    before = [key for path, key in sent if path == "/completion"]
    interrupt_at[0] = -1
    resumed = run_serve_audit("http://toy", **settings, resume=True)
    after = [key for path, key in sent if path == "/completion"][len(before):]
    sent.clear()
    whole = run_serve_audit("http://toy", **dict(settings, journal=str(tmp_path / "fresh.jsonl")))
    whole_sent = [key for path, key in sent if path == "/completion"]
    assert before and len(after) < len(whole_sent)  # what the first run was answered is taken from the journal
    # the same verdicts, but for what depends on the moment: which requests were in flight together
    # (answers from the journal were not in flight) and the unseeded world's answers (the server's own
    # random draws, and the requests that follow from them)
    def kept(result):
        return [(v.check, v.outcome, v.statistic, v.samples) for v in result.verdicts
                if v.law != "concurrent_requests" and not v.world.endswith("-unseeded")]
    assert kept(resumed) == kept(whole)
    assert [v.check for v in whole.verdicts] == [v.check for v in resumed.verdicts]
    if traffic == "sequential":  # every request seeded: each sent once over the two runs
        assert sorted(before + after) == sorted(whole_sent)


# --- OpenAI's /v1/completions: llama.cpp's (ids inside logprobs, post-sampling probabilities) and
# vLLM's (return_token_ids, raw logprobs keyed "token_id:N", /metrics counters), on the toy server

@pytest.fixture(scope="module")
def vllm_servers():
    model = ToyServedModel(api="vllm")
    with served_model(model) as target, served_model(model.as_draft()) as draft, \
            served_model(model.as_plain()) as plain:
        yield model, target, draft, plain


OPENAI = dict(SMALL, api="openai", samplings=(Sampling(), Sampling(temperature=0.7, top_k=8)))


@pytest.mark.long
@pytest.mark.parametrize("flavour", ["llama.cpp", "vllm"])
def test_an_exact_server_passes_through_the_openai_api(flavour):
    model = ToyServedModel(api=flavour)
    with served_model(model) as target:
        result = run_serve_audit(target.url, **OPENAI)
    assert result.passed, [v.describe() for v in result.failed]
    how = "token ids read from logprobs" if flavour == "llama.cpp" else "token ids from return_token_ids"
    assert "OpenAI /v1/completions" in result.reference and how in result.reference
    ran = next(v for v in result.verdicts if v.law == "speculation_ran").summary
    # 2,000 law requests and 500 streamed ones (stream_share 0.25); vLLM's counters are read per chunk of 8
    drafted = "312 of 312 chunks of 8 requests drafted" if flavour == "vllm" else "2,500 of 2,500 requests drafted"
    assert drafted in ran
    assert all(v.samples == 2000 for v in result.verdicts if v.law == "continuation")


# through vLLM's dialect in the long run: the mutants that read its own fields (logprobs keyed by token id,
# /metrics counters, sampling); the others, found through llama.cpp's above, in the slow run
VLLM_DIALECT_MUTANTS = {"draft_logprobs", "hotter", "speculation_off_for_logprobs"}


@pytest.mark.parametrize("name", [n if n in VLLM_DIALECT_MUTANTS else pytest.param(n, marks=pytest.mark.slow)
                                  for n in COMPLETIONS_MUTANTS])
@pytest.mark.long
def test_each_proxy_mutant_is_found_through_vllms_openai_api(vllm_servers, name):
    _, target, draft, plain = vllm_servers
    mutant = PROXY_MUTANTS[name]
    with proxy(name, target.url, draft=draft.url, plain=plain.url) as p:
        result = run_serve_audit(p.url, reference=target.url, **dict(OPENAI, samplings=(Sampling(),)))
    caught = {v.law: v.summary for v in result.failed}
    assert not result.passed and mutant.caught_by in caught, caught
    cause = {"hotter": "sampled hotter", "zero_logprobs": "every reported probability is 0 or 1",
             "draft_logprobs": "not the target's", "speculation_off_for_logprobs": "switched speculation off",
             "seed_cache": "answers repeated across seeds", "copied_samples": "repeat each other"}[name]
    assert cause in caught[mutant.caught_by]


def test_raw_probabilities_give_the_law_only_where_every_engine_agrees():
    from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw
    raw = NextTokenLaw({0: 0.5, 1: 0.2, 2: 0.15}, 0.15)  # three listed, 0.15 spread over the rest
    assert sampling_law_from_raw(raw, Sampling()) == raw
    k2 = sampling_law_from_raw(raw, Sampling(temperature=0.5, top_k=2))
    assert k2.other == 0 and k2.probabilities[0] == pytest.approx(0.25 / 0.29) and set(k2.probabilities) == {0, 1}
    assert sampling_law_from_raw(raw, Sampling(top_p=0.6)).probabilities == pytest.approx({0: 5 / 7, 1: 2 / 7})
    assert set(sampling_law_from_raw(raw, Sampling(min_p=0.35)).probabilities) == {0, 1}
    assert sampling_law_from_raw(raw, Sampling(temperature=0)).probabilities == {0: 1.0}
    for sampling, words in ((Sampling(temperature=0.7, top_p=0.9), "temperature 0.7 with top-p"),
                            (Sampling(top_p=0.9, min_p=0.05), "top-p with min-p"),
                            (Sampling(temperature=0.7), "without truncation"),
                            (Sampling(top_k=4), "listed only 3"),
                            (Sampling(top_p=0.9), "cut falls among the tokens"),
                            (Sampling(min_p=0.2), "every listed token passes")):
        with pytest.raises(NotDeterminable, match=words):
            sampling_law_from_raw(raw, sampling)
    full = NextTokenLaw({0: 0.5, 1: 0.3, 2: 0.2}, 0.0)
    assert sampling_law_from_raw(full, Sampling(temperature=0.5)).probabilities[0] == pytest.approx(25 / 38)


def test_a_lossy_verification_setting_the_server_exposes_is_named_with_its_exact_tv():
    from exactcheck.serve.verdicts import settings_verdict
    base = dict(world="server", seed=0, reproduce="exactcheck serve URL")
    lossy = settings_verdict({"speculative_accept_threshold_single": 0.9, "speculative_accept_threshold_acc": 0.5},
                             base)
    assert lossy.outcome.value == "defect" and "sglang-threshold:single=0.9,acc=0.5" in lossy.summary
    assert "exactcheck lossy sglang-threshold --param single=0.9 --param acc=0.5" in lossy.summary
    exact = settings_verdict({"speculative_accept_threshold_single": 1.0, "speculative_accept_threshold_acc": 1.0},
                             base)
    assert exact.outcome.value == "exact"
    assert settings_verdict({}, base).outcome.value == "inconclusive"
    model = ToyServedModel(api="vllm", server_info={"speculative_accept_threshold_single": 0.9,
                                                     "speculative_accept_threshold_acc": 0.5})
    result = run_serve_audit("http://toy", **dict(OPENAI, samplings=(Sampling(),), max_samples=200),
                             transport=lambda b, path, body: respond(model, path, body)[1])
    assert not result.passed and [v.check for v in result.failed] == ["server/declared_settings"]


def test_vllm_metrics_are_read_summed_over_their_labels():
    from exactcheck.endpoints.openai_api import parse_metrics
    text = ('# HELP x\nvllm:spec_decode_num_draft_tokens_total{engine="0"} 10.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1"} 5\nvllm:spec_decode_num_draft_tokens_created 1.7e9\n'
            'vllm:num_requests_running 2\n')
    assert parse_metrics(text) == {"vllm:spec_decode_num_draft_tokens": 15.0, "vllm:num_requests_running": 2.0}


# --- speculation_ran is a test (exactcheck.stats.rates), never p = 0 from a small count: a rarely
# drafting exact server (n-gram prompt lookup on a context that seldom repeats) is no finding, and
# the server that switches speculation off for requests with probabilities is still found

RARE = dict(vocab=64, sharpness=1.0, drafter="ngram", ngram=1)  # about 5% of requests draft at temperature 1
RARE_AUDIT = dict(SMALL, max_samples=None, samplings=(Sampling(), Sampling(temperature=0.7, top_k=5, min_p=0.05)))


# each audit runs to the quick budget (75-105 s on 2 cores): one dialect each in the long run, the other slow
@pytest.mark.long
@pytest.mark.parametrize("api", ["llama.cpp", pytest.param("vllm", marks=pytest.mark.slow)])
def test_a_rarely_drafting_exact_server_is_no_speculation_finding(api):
    model = ToyServedModel(api=api, **RARE)
    with served_model(model) as target:
        result = run_serve_audit(target.url, **dict(RARE_AUDIT, api="auto" if api == "llama.cpp" else "openai"))
    assert result.passed, [v.describe() for v in result.failed]
    ran = {v.world: v for v in result.verdicts if v.law == "speculation_ran"}
    sampled = ran["p0-t1"]  # drafts on a few per cent of the requests: probed enough to tell
    assert sampled.outcome.value == "exact" and sampled.pvalue > 1e-3, sampled.summary
    assert "requests that asked for probabilities" in sampled.summary
    cold = ran["p0-temperature0_7-top_k5-min_p0_05"]  # the top 5 never repeat the prompt: no draft at all
    assert cold.outcome.value == "inconclusive" and "no draft counted" in cold.summary


@pytest.mark.long
@pytest.mark.parametrize("api", [pytest.param("llama.cpp", marks=pytest.mark.slow), "vllm"])
def test_speculation_off_for_logprobs_is_found_on_a_rarely_drafting_server(api):
    model = ToyServedModel(api=api, **RARE)
    with served_model(model) as target, served_model(model.as_plain()) as plain, \
            proxy("speculation_off_for_logprobs", target.url, plain=plain.url) as p:
        result = run_serve_audit(p.url, reference=target.url, **dict(RARE_AUDIT, samplings=(Sampling(),),
                                                                     api="auto" if api == "llama.cpp" else "openai"))
    (found,) = result.failed
    assert found.law == "speculation_ran" and "switched speculation off" in found.summary, found.summary
    assert found.adjusted_pvalue <= 1e-3 and found.pvalue > 0


def test_a_server_that_never_drafted_is_not_judged_and_worded_as_measured():
    from exactcheck.endpoints.draft_counts import CounterSource, DraftTally
    from exactcheck.serve.verdicts import speculation_verdict
    base = dict(world="w", seed=0, reproduce="exactcheck serve URL")
    none = DraftTally(CounterSource.PER_REQUEST, (0,) * 500, 1, 500)
    verdict = speculation_verdict(none, DraftTally(CounterSource.PER_REQUEST, (0,) * 32, 1, 32), 1e-4, base)
    assert verdict.outcome.value == "inconclusive" and "no draft counted on 532 requests" in verdict.summary
    # 6 drafting requests of 12,000 expect 0.016 on 32 probes: none there is no evidence
    rare = DraftTally(CounterSource.PER_REQUEST, (3,) * 6 + (0,) * 11_994, 1, 12_000)
    verdict = speculation_verdict(rare, DraftTally(CounterSource.PER_REQUEST, (0,) * 32, 1, 32), 1e-4, base)
    assert verdict.outcome.value == "inconclusive" and "drafts too rare on this workload to tell" in verdict.summary
    # speculation on for every law request, off for the probes: p far below any share, through Holm
    on = DraftTally(CounterSource.SERVER_WIDE, (5,) * 250, 8, 2000)
    off = speculation_verdict(on, DraftTally(CounterSource.SERVER_WIDE, (0,) * 4, 8, 32), 1e-4, base)
    assert off.pvalue < 1e-4 and "switched speculation off" in off.summary and off.kind.statistical


def test_the_probe_count_is_planned_to_see_speculation_off_at_the_measured_rate():
    from exactcheck.endpoints.draft_counts import CounterSource, DraftTally, probes_needed
    from exactcheck.stats.rates import fewer_positives_pvalue
    share = 1e-3 / 12
    law = DraftTally(CounterSource.PER_REQUEST, (3,) * 161 + (0,) * 11_839, 1, 12_000)  # the n-gram rate
    probes = probes_needed(law, share, 32, 12_000)
    assert 32 < probes <= 3_000 and fewer_positives_pvalue(161, 12_000, 0, probes) <= share
    assert fewer_positives_pvalue(161, 12_000, 0, probes - 1) > share  # the fewest that can
    assert probes_needed(DraftTally(CounterSource.PER_REQUEST, (1,) * 2000, 1, 2000), share, 32, 2000) == 32


def test_every_serve_setting_is_declared_once_and_read_by_each_front_end(capsys):
    """serve/settings.py's table is what ServeSettings, the command line, the gate's checks and the
    registry row read: a setting added there is a field, a flag, a gate key and a row setting."""
    import dataclasses

    from exactcheck.cli import main
    from exactcheck.serve import entry, settings
    from exactcheck.audit_kinds import entry_point
    names = [s.name for s in settings.SETTINGS]
    assert [f.name for f in dataclasses.fields(settings.ServeSettings)] == names
    assert settings.ServeSettings().n_probs == 256 and settings.ServeSettings().samplings == settings.DEFAULT_SAMPLINGS
    row = entry_point("serve")
    assert row.settings == entry.SETTINGS == settings.NAMES and row.fields == settings.FIELDS
    assert set(settings.FIELDS) <= set(settings.NAMES)
    import argparse
    parser = argparse.ArgumentParser()
    entry.serve_arguments(parser)
    flags = {a.dest for a in parser._actions}
    assert {s.name for s in settings.SETTINGS if s.flag} <= flags
    assert main(["serve", "http://127.0.0.1:9", "--concurrency", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["exactcheck: error: --concurrency (0) must be a positive integer"], err


def test_the_tiny_hf_llama_for_served_engines_loads_with_its_local_tokenizer(tmp_path):
    """toy_models.hf_served_models: what vLLM (or mlx-lm) loads from a directory; nothing downloaded."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from toy_models.hf_served_models import VOCAB, write_llama
    path = write_llama(tmp_path / "llama", seed=3)
    assert write_llama(tmp_path / "llama", seed=3) == path  # written once
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert tokenizer("w5 w6 w7").input_ids == [5, 6, 7] and tokenizer.decode([5, 6]) == "w5 w6"
    probs = torch.softmax(model(torch.tensor([[5, 6, 7]])).logits[0, -1].double(), -1)
    assert probs.shape == (VOCAB,) and probs.max() > 2 / VOCAB  # peaked enough to tell from uniform


class _RenamedLlamaCpp:
    """A served dialect written as a new module would write it: an ``Endpoint`` (here llama.cpp's,
    under another name) and its ``detect``."""

    @staticmethod
    def endpoint(base, client, *, model=None, reference_kind=None):
        from exactcheck.endpoints.llama_cpp_api import LlamaCppEndpoint

        class Renamed(LlamaCppEndpoint):
            api = "toy dialect /completion"
        return Renamed(base, client, model=model)

    @staticmethod
    def detect(client, base) -> bool:
        return False


def test_a_served_dialect_is_its_module_and_one_registry_row(monkeypatch):
    """issue 66: nothing but the dialect's row in ``endpoints.apis.DIALECTS`` (and its module) is
    needed for the serve audit to speak it: no branch in the runner, the settings or the verdicts."""
    from exactcheck.endpoints import apis
    monkeypatch.setitem(apis.DIALECTS, "toy-dialect", apis.Dialect(
        "toy-dialect", __name__, _RenamedLlamaCpp.endpoint, _RenamedLlamaCpp.detect, {"prompts": "token ids"}))
    model = ToyServedModel()
    with served_model(model) as target:
        result = run_serve_audit(target.url, api="toy-dialect", **SMALL)
    assert result.passed, [v.describe() for v in result.failed]
    assert any(v.outcome.value == "exact" and v.law == "continuation" for v in result.verdicts)
    assert "--api toy-dialect" in result.verdicts[0].reproduce
