"""A real llama.cpp llama-server (release 11434, `bash .ci/llama-server`) on tiny GGUF models written
here (toy_models/gguf_models.py): the facts docs/serving-llama-cpp.md states, checked.

Every test skips when the binary has not been built, or when the `gguf` package is missing.
Servers listen on 127.0.0.1 only; each test sends a bounded number of requests (a few dozen).
"""
from __future__ import annotations

import math
import urllib.request

import pytest

from serve_fixtures import get_json, llama_server, llama_server_binary, post_json

from toy_models.gguf_models import EOS_ID, GGUFConfig, vocabulary, write_pair

PROMPT = [5, 6, 7, 8]  # token ids: "abcd"
NO_FILTER = {"top_k": 0, "top_p": 1.0, "min_p": 0.0}  # the sampler chain reduced to temperature + dist
V = GGUFConfig().vocab_size


@pytest.fixture(scope="module")
def models():
    llama_server_binary()  # skip early, before writing models, when there is no server
    pytest.importorskip("gguf")
    return write_pair(seed=0)


@pytest.fixture(scope="module")
def target_server(models):
    with llama_server(models[0]) as base:
        yield base


def complete(base, **kw):
    body = {"prompt": PROMPT, "n_predict": 4, "return_tokens": True, "ignore_eos": True}
    body.update(kw)
    return post_json(base + "/completion", body)


def test_no_binary_skips_naming_the_build_script(monkeypatch, tmp_path):
    monkeypatch.setenv("EXACTCHECK_CACHE", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match=r"\.ci/llama-server"):
        llama_server_binary()


def test_models_are_deterministic_and_cached(tmp_path):
    pytest.importorskip("gguf")
    a = write_pair(tmp_path / "a", seed=3)
    b = write_pair(tmp_path / "b", seed=3)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert write_pair(tmp_path / "a", seed=3) == a  # found, not rewritten
    assert write_pair(tmp_path / "a", seed=4)[0] != a[0]
    assert vocabulary()[:5] == ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581"] and len(vocabulary()) == V


def test_server_starts_on_loopback_and_stops(models):
    with llama_server(models[0]) as base:
        assert base.startswith("http://127.0.0.1:")
        assert get_json(base + "/health")["status"] == "ok"
        props = get_json(base + "/props")
        assert props["default_generation_settings"]["n_ctx"] == 512
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/health", timeout=2)


def test_token_id_prompt(target_server):
    r = complete(target_server, temperature=0.0)
    assert r["tokens_evaluated"] == len(PROMPT)
    assert len(r["tokens"]) == 4 and all(0 <= t < V for t in r["tokens"])
    assert r["content"] == "".join(vocabulary()[t].replace("\u2581", " ") for t in r["tokens"])
    assert r["stop_type"] == "limit" and r["tokens_predicted"] == 4


def test_n_probs_full_vocabulary(target_server):
    # pre-sampling (default): softmax of the raw logits over the whole vocabulary, temperature ignored
    pre = complete(target_server, temperature=1.0, seed=1, n_probs=V, n_predict=1, **NO_FILTER)
    pre_cold = complete(target_server, temperature=0.5, seed=1, n_probs=V, n_predict=1, **NO_FILTER)
    (step,) = pre["completion_probabilities"]
    assert len(step["top_logprobs"]) == V
    assert math.isclose(sum(math.exp(e["logprob"]) for e in step["top_logprobs"]), 1.0, rel_tol=1e-4)
    assert step["top_logprobs"] == pre_cold["completion_probabilities"][0]["top_logprobs"]
    top = math.exp(step["top_logprobs"][0]["logprob"])
    assert 0.2 < top < 0.9  # peaked but not degenerate (toy_models.gguf_models.GGUFConfig.output_scale)
    # post-sampling: the law the dist sampler drew from (after temperature and the filters)
    post = complete(target_server, temperature=0.5, seed=1, n_probs=V, n_predict=1, post_sampling_probs=True,
                    **NO_FILTER)
    (pstep,) = post["completion_probabilities"]
    probs = {e["id"]: e["prob"] for e in pstep["top_probs"]}
    logits2 = {e["id"]: 2 * e["logprob"] for e in step["top_logprobs"]}  # temperature 0.5
    z = max(logits2.values())
    norm = sum(math.exp(v - z) for v in logits2.values())
    for i, p in probs.items():
        assert math.isclose(p, math.exp(logits2[i] - z) / norm, rel_tol=1e-3, abs_tol=1e-6)
    k5 = complete(target_server, temperature=1.0, top_k=5, top_p=1.0, min_p=0.0, seed=1, n_probs=V,
                  n_predict=1, post_sampling_probs=True)
    assert len(k5["completion_probabilities"][0]["top_probs"]) == 5  # zero-probability tokens are left out


def test_seeds_reproduce(target_server):
    a = [complete(target_server, temperature=1.0, seed=s, **NO_FILTER)["tokens"] for s in (11, 11, 12)]
    assert a[0] == a[1]
    many = {tuple(complete(target_server, temperature=1.0, seed=s, **NO_FILTER)["tokens"]) for s in range(12)}
    assert len(many) > 3  # different seeds, different completions
    again = complete(target_server, temperature=1.0, seed=11, cache_prompt=False, **NO_FILTER)["tokens"]
    assert again == a[0]


@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
def test_greedy_with_a_draft_equals_greedy_without(models, target_server, sampling):
    prompts = [PROMPT, [9, 10], [30, 31, 32, 33, 34, 35], [EOS_ID + 3, 40]]
    plain = [complete(target_server, prompt=p, temperature=0.0, n_predict=8)["tokens"] for p in prompts]
    with llama_server(models[0], draft=models[1], draft_sampling=sampling, draft_max=3) as base:
        spec = [complete(base, prompt=p, temperature=0.0, n_predict=8) for p in prompts]
    assert [r["tokens"] for r in spec] == plain
    assert sum(r["timings"].get("draft_n", 0) for r in spec) > 0  # the draft was used
    assert all(r["timings"].get("draft_n_accepted", 0) <= r["timings"].get("draft_n", 0) for r in spec)


@pytest.fixture(scope="module")
def greedy_draft_server(models):
    with llama_server(models[0], draft=models[1], draft_sampling="greedy", draft_max=3) as base:
        yield base


def test_greedy_drafting_is_seed_for_seed_the_target(target_server, greedy_draft_server):
    # sample-and-match verification draws the target's dist RNG once per emitted token, as the target
    # alone does: the same seed gives the same tokens, but for a rare draw that lands within float
    # rounding of a cumulative-probability boundary (batched and single-token logits differ slightly)
    seeds = range(100, 140)
    plain = [complete(target_server, temperature=1.0, seed=s, n_predict=6, **NO_FILTER)["tokens"] for s in seeds]
    spec = [complete(greedy_draft_server, temperature=1.0, seed=s, n_predict=6, **NO_FILTER) for s in seeds]
    assert sum(a != b["tokens"] for a, b in zip(plain, spec)) <= 1
    assert sum(r["timings"].get("draft_n", 0) for r in spec) > 0


def test_n_probs_are_missing_for_tokens_a_verification_step_emits(greedy_draft_server):
    r = complete(greedy_draft_server, temperature=1.0, seed=7, n_probs=V, post_sampling_probs=True, **NO_FILTER)
    steps = r["completion_probabilities"]
    assert [s["id"] for s in steps] == r["tokens"]
    assert len(steps[0]["top_probs"]) > 1  # the first token is sampled before any draft: its law is there
    assert r["timings"]["draft_n"] > 0
    verified = [s for s in steps if s["top_probs"] == []]
    assert verified and all(s["prob"] == 1.0 for s in verified)  # placeholders, not probabilities


def test_probabilistic_drafting_reproduces_its_seeds(models):
    with llama_server(models[0], draft=models[1], draft_sampling="probabilistic", draft_max=3) as base:
        runs = [complete(base, temperature=1.0, seed=s, n_predict=6, **NO_FILTER)["tokens"] for s in (5, 5, 6, 5)]
    assert runs[0] == runs[1] == runs[3]
