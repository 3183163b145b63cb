"""Penalties in the serve law (issue 59): each dialect's penalties go out under its own field names;
the law under a penalty is computed exactly where the reference's probabilities determine it
(llama.cpp: post-sampling, same history; vLLM: presence and frequency over the output, from raw
log-probabilities) and is "not judged", with the reason, where they do not (vLLM's repetition
penalty from raw log-probabilities, mlx-lm's prompt-cache-dependent history). In process, on the
toy served model (``toy_models.served_lm``: penalties by each engine's convention, and the
``penalty_mutant="stale"`` server that verifies a step's drafts with the history as it was when
the step began)."""
from __future__ import annotations

import math

import pytest

from exactcheck.core import Outcome
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.runner import run_serve_audit
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw, with_output_penalties
from toy_models.served_lm import Penalties, ToyServedModel, respond

LLAMA_PENALTIES = Sampling(repetition_penalty=1.6, presence_penalty=0.4, frequency_penalty=0.7, repeat_last_n=3)
VLLM_PENALTIES = Sampling(presence_penalty=0.6, frequency_penalty=0.9)
AUDIT = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), max_samples=2000, traffic="sequential")


def _audit(model: ToyServedModel, sampling: Sampling, **keywords):
    return run_serve_audit("http://toy", transport=lambda base, path, body: respond(model, path, body)[1],
                           samplings=(sampling,), **dict(AUDIT, **keywords))


def _continuation(result):
    return next(v for v in result.verdicts if v.law == "continuation")


def test_each_dialect_sends_the_penalties_under_its_own_field_names():
    from exactcheck.endpoints.client import EndpointError
    from exactcheck.endpoints.llama_cpp_api import LlamaCppEndpoint
    from exactcheck.endpoints.openai_api import OpenAICompletionsEndpoint
    s = Sampling.parse("temperature=0.7,repetition_penalty=1.3,presence_penalty=0.5,frequency_penalty=0.25,"
                       "repeat_last_n=16")
    assert Sampling.parse(s.spec()) == s and "repetition penalty 1.3" in s.describe()
    llama = LlamaCppEndpoint("http://x", None).body([1], 2, s, 0)
    assert {k: llama[k] for k in ("repeat_penalty", "presence_penalty", "frequency_penalty", "repeat_last_n")} == \
        {"repeat_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.25, "repeat_last_n": 16}
    vllm = OpenAICompletionsEndpoint("http://x", None, model="m")
    body = vllm.body([1], 2, Sampling(repetition_penalty=1.3, presence_penalty=0.5), 0)
    assert body["repetition_penalty"] == 1.3 and body["presence_penalty"] == 0.5 and "repeat_penalty" not in body
    with pytest.raises(EndpointError, match="no repeat_last_n"):
        vllm.body([1], 2, s, 0)  # vLLM's penalties have no window
    assert not any("penalty" in k for k in LlamaCppEndpoint("http://x", None).body([1], 2, Sampling(), 0))


def test_presence_and_frequency_from_raw_log_probabilities_are_the_policys_penalties():
    raw = NextTokenLaw({0: 0.5, 1: 0.3, 2: 0.2})
    law = with_output_penalties(raw, VLLM_PENALTIES, (1, 1, 2))
    weights = [0.5, 0.3 * math.exp(-0.6 - 2 * 0.9), 0.2 * math.exp(-0.6 - 0.9)]
    assert law.probabilities == pytest.approx({i: w / sum(weights) for i, w in enumerate(weights)}, abs=1e-15)
    with pytest.raises(NotDeterminable, match="sign"):
        with_output_penalties(raw, Sampling(repetition_penalty=1.2), (1,))
    with pytest.raises(NotDeterminable, match="not among"):  # a penalised token inside the unlisted cell
        with_output_penalties(NextTokenLaw({0: 0.6, 1: 0.3}, 0.1), VLLM_PENALTIES, (5,))
    cut = with_output_penalties(NextTokenLaw({0: 0.6, 1: 0.3}, 0.1), VLLM_PENALTIES, (1,))
    with pytest.raises(NotDeterminable, match="fell below"):  # its place among the unlisted ones is unknown
        sampling_law_from_raw(with_output_penalties(NextTokenLaw({0: 0.6, 1: 0.3}, 0.1), Sampling(
            top_k=1, frequency_penalty=3.0), (0,)), Sampling(top_k=1))
    assert cut.other == pytest.approx(0.1 / (0.6 + 0.3 * math.exp(-1.5) + 0.1))


def test_the_toy_applies_each_engines_penalty_history():
    p = ToyServedModel().target[3]
    llama = Penalties("llama.cpp", repetition=1.5, frequency=0.5, last_n=2)
    assert (llama.apply(p, [4, 5, 3, 3]) == llama.apply(p, [9, 3, 3])).all()  # the last two tokens only
    vllm = Penalties("vllm", repetition=1.5, frequency=0.5, n_prompt=2)
    assert not (vllm.apply(p, [3, 5, 3]) == vllm.apply(p, [3, 5, 5])).all()
    # the repetition penalty is sign-dependent: a token with a positive logit loses, one with a negative too
    assert (Penalties("vllm", repetition=2.0).apply(p, [0, 1])[[0, 1]] < p[[0, 1]]).all()


@pytest.mark.parametrize("sampling", [LLAMA_PENALTIES, Sampling(temperature=0.7, top_k=6, repetition_penalty=1.6)],
                         ids=["t1-all-penalties", "t07-top_k6-repetition"])
def test_an_exact_llama_cpp_server_passes_under_penalties(sampling):
    result = _audit(ToyServedModel(), sampling)
    assert result.passed, [v.describe() for v in result.failed]
    assert _continuation(result).outcome == Outcome.EXACT and _continuation(result).samples == 2000


@pytest.mark.parametrize("mutant", ["stale", pytest.param("ignored", marks=pytest.mark.long)])
def test_penalties_fed_once_per_verify_step_or_ignored_are_found_through_llama_cpp(mutant):
    result = _audit(ToyServedModel(penalty_mutant=mutant), LLAMA_PENALTIES)
    assert _continuation(result).outcome == Outcome.DEFECT, _continuation(result).describe()
    assert _audit(ToyServedModel(penalty_mutant=mutant), Sampling()).passed  # no penalty: nothing to get wrong


@pytest.mark.long
def test_vllm_presence_and_frequency_are_judged_from_raw_log_probabilities():
    exact = _audit(ToyServedModel(api="vllm"), VLLM_PENALTIES, api="openai")
    assert exact.passed, [v.describe() for v in exact.failed]
    assert _continuation(exact).samples == 2000
    stale = _audit(ToyServedModel(api="vllm", penalty_mutant="stale"), VLLM_PENALTIES, api="openai")
    assert _continuation(stale).outcome == Outcome.DEFECT, _continuation(stale).describe()


def test_vllms_repetition_penalty_from_raw_log_probabilities_is_not_judged_with_its_reason():
    result = _audit(ToyServedModel(api="vllm"), Sampling(repetition_penalty=1.6), api="openai", max_samples=200)
    law = _continuation(result)
    assert law.outcome == Outcome.INCONCLUSIVE and law.summary.startswith("not judged")
    assert "repetition penalty 1.6" in law.summary and "sign" in law.summary


def test_mlx_lms_penalties_are_not_judged_with_their_reason():
    from exactcheck.endpoints.mlx_lm_api import PENALTIES_NOT_JUDGED, MlxLmEndpoint
    endpoint = MlxLmEndpoint("http://x", None)
    with pytest.raises(NotDeterminable) as caught:  # before any request
        endpoint.next_token_laws([1], [()], Sampling(presence_penalty=0.5), 11)
    assert str(caught.value) == PENALTIES_NOT_JUDGED and "prompt cache" in PENALTIES_NOT_JUDGED


def test_vllms_processed_log_probabilities_hold_the_repetition_penalty_but_not_presence_or_frequency():
    from exactcheck.endpoints.openai_api import OpenAICompletionsEndpoint
    processed = OpenAICompletionsEndpoint("http://x", None, model="m", reference_kind="post-sampling")
    law = NextTokenLaw({0: 0.7, 1: 0.3})
    assert processed.penalised(law, Sampling(repetition_penalty=1.4), (1, 0)) is law  # prompt | output: one set
    with pytest.raises(NotDeterminable, match="output only"):
        processed.penalised(law, Sampling(frequency_penalty=0.5), (1, 0))


@pytest.mark.parametrize("api, sampling", [pytest.param("llama.cpp", LLAMA_PENALTIES, marks=pytest.mark.long),
                                           ("vllm", VLLM_PENALTIES)])
def test_a_penalised_chat_world_is_judged_exact_and_its_stale_mutant_found(api, sampling):
    from exactcheck.serve.chat import ChatPrompt
    chat = ChatPrompt.parse(["user:abc"])
    keywords = dict(prompts=(chat,), max_samples=3000, api="llama.cpp" if api == "llama.cpp" else "openai")
    exact = _continuation(_audit(ToyServedModel(api=api), sampling, **keywords))
    assert exact.world.startswith("c0-") and exact.outcome == Outcome.EXACT, exact.describe()
    stale = _continuation(_audit(ToyServedModel(api=api, penalty_mutant="stale"), sampling, **keywords))
    assert stale.outcome == Outcome.DEFECT, stale.describe()
