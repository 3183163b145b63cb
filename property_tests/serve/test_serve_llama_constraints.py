"""Structured output on the real llama-server (release 11434, `bash .ci/llama-server`; issue 68): a
choice and a regex (sent as GBNF in `grammar`), plain and under draft-model speculation (sample-and-match
and rejection sampling), against the target alone, on the tiny GGUF pair whose rows give </s> mass
(toy_models/gguf_models.py, eos_lift 1.0). The law is the reference's raw law masked at every prefix in
llama.cpp's order (common/sampling.cpp `common_sampler_sample`: the chain samples, a token the grammar
rejects is sampled again with the grammar first); at 3,000 requests the regex world at temperature
0.7 / top-k 8 does not tell it apart from masking first (p = 0.21 against p = 0.038: the allowed letters
are mostly inside the top 8). Skips when the binary is absent; long."""
from __future__ import annotations

import time

import pytest

from serve_fixtures import llama_server, llama_server_binary

pytest.importorskip("gguf")

from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from toy_models.gguf_models import GGUFConfig, write_pair  # noqa: E402

PROMPTS = ([1, 5, 6],)  # "<s>ab"
WORLDS = (Sampling.parse("top_k=0,top_p=1,min_p=0,choice=ab|ba|abc|cab"),
          Sampling.parse("temperature=0.7,top_k=8,top_p=1,min_p=0,regex=[a-d]{1,4}"))
AUDIT = dict(level="quick", seed=0, progress=False, prompts=PROMPTS, samplings=WORLDS, max_samples=1500, n_probs=64,
             length=5, traffic="sequential", samples_per_request=1)


@pytest.fixture(scope="module")
def pair():
    llama_server_binary()
    return write_pair(seed=0, config=GGUFConfig(eos_lift=1.0))


@pytest.fixture(scope="module")
def target(pair):
    with llama_server(pair[0]) as base:
        yield base


def _judged(result) -> list:
    return [v for v in result.verdicts if v.law in ("continuation", "streamed", "finish")]


@pytest.mark.long
def test_a_grammar_on_the_target_alone_keeps_the_masked_law(target):
    begun = time.monotonic()
    result = run_serve_audit(target, **AUDIT)
    judged = _judged(result)
    assert judged and all(v.outcome.value == "exact" for v in judged), [v.describe() for v in judged]
    print(f"\nplain: {time.monotonic() - begun:.0f} s; " + "; ".join(f"{v.check}: {v.summary}" for v in judged))


@pytest.mark.long
@pytest.mark.parametrize("mode", ["greedy", "probabilistic"])
def test_a_grammar_under_draft_model_speculation_keeps_the_masked_law(pair, target, mode):
    """Sample-and-match (common_sampler_sample_and_accept_n: each position sampled through
    common_sampler_sample, the grammar advanced by accepted tokens only) and rejection sampling
    (common_sampler_sample_and_accept_n_rejection: p is the chain masked after it, or the masked chain
    where the first sample was rejected; its expectation is the law above)."""
    begun = time.monotonic()
    with llama_server(pair[0], draft=pair[1], draft_sampling=mode, draft_max=3) as audited:
        result = run_serve_audit(audited, reference=target, **AUDIT)
    judged = _judged(result)
    assert judged and all(v.outcome.value == "exact" for v in judged), [v.describe() for v in judged]
    ran = [v for v in result.verdicts if v.law == "speculation_ran"]
    assert all("speculation ran" in v.summary for v in ran), [v.describe() for v in ran]
    print(f"\n{mode}: {time.monotonic() - begun:.0f} s; " + "; ".join(f"{v.check}: {v.summary}" for v in judged + ran))
