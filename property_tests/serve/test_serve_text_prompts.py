"""Text-prompt servers with the tokenizers real models have (issue 69): mlx-lm's dialect and
llama-cpp-python's on the toy served model (``toy_models.served_text``) over a byte-level BPE trained
locally (``toy_models.bpe_models``: 320 ids, 132 of them sharing their text with another), served on
127.0.0.1. The real servers: ``test_serve_mlx.py``, ``test_serve_llama_cpp_python.py`` (long).

What is asserted: a prefix with no text that reads back as its ids is one pooled cell of its exact
mass (never a usage error once the audit started), a logprob text several ids share is one merged
cell (never a guessed id), exact paths pass, and the defects are found: a proxy that samples hotter
(both dialects), and mlx-lm's penalty history under a draft model (``penalty_mutant=
"last_prompt_token"``), judged once the operator declares ``--server-setting prompt_cache=off``.

Default run: the tokenizer, the pooled law, the merged list, detection and the mlx-lm hotter proxy
(about 15 s); ``-m long``: the three tests of two or three whole audits each (about 40 s).

False alarms: each audit below is a quick audit at alpha 1e-3 of an exact path (the toy samples
exactly, seeded requests replay their seed; the unseeded world of mixed traffic draws fresh seeds),
so an exact path fails at most one time in a thousand; the defects planted are far beyond the
audit's detectable TV (the hotter proxy moves the first token's law by TV > 0.1). Measured over 210
audits by ``benchmarks/serve_false_alarms.py --paths bpe`` (docs/serving.md).
"""
from __future__ import annotations

import math

import pytest

from exactcheck.endpoints.apis import detect_api, open_endpoint
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.continuation_law import NextTokenLaw, Unaskable, expand
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.endpoints.sampler_law import NotDeterminable, sampling_law_from_raw
from exactcheck.endpoints.text_prompts import Inexpressible, TextPrompts
from exactcheck.errors import UsageError
from exactcheck.serve.mutants import proxy
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_lm import ToyServedModel, served_model

PROMPT = "Once upon a time"
REPEATS = "one, two, one, two,"
PENALISED = "U*2ir` aK"  # the toy's most probable next tokens, then the token they follow (see the penalty test)
QUICK = dict(level="quick", seed=0, progress=False, traffic="sequential", max_samples=1200)


@pytest.fixture(scope="module")
def bpe_dir():
    pytest.importorskip("transformers")
    from toy_models.bpe_models import write_bpe_llama
    return str(write_bpe_llama(seed=0))


def _by_check(result) -> dict:
    return {v.check: v for v in result.verdicts}


# --- the tokenizer and the law's pooled cells (no server)

def test_the_bpe_tokenizer_is_trained_locally_and_does_not_read_every_id_sequence_back(bpe_dir):
    prompts = TextPrompts(bpe_dir)
    assert prompts.vocab_size == 320
    the = prompts.encode(" the")
    assert len(the) == 1 and prompts.text(the) == " the"  # a merge learnt from the corpus
    pieces = [prompts.tokenizer.convert_tokens_to_ids(c) for c in ("Ġ", "t", "h", "e")]
    assert prompts.text(pieces) is None  # " the" spelt by its bytes reads back as the merged id
    with pytest.raises(Inexpressible) as caught:
        prompts.require(pieces)
    assert isinstance(caught.value, Unaskable) and "reads back" in str(caught.value)
    # llama-cpp-python's logprob keys: a token's bytes decoded with errors ignored; every lone high byte is ""
    assert len(prompts.ids_of_string("")) >= 128 and prompts.ids_of_string(" the") == frozenset(the)
    assert prompts.shared_strings() == 132


def test_an_unaskable_prefix_is_one_pooled_cell_of_its_exact_mass_and_an_unaskable_root_is_raised():
    laws = {(): NextTokenLaw({1: 0.5, 2: 0.3, 3: 0.2}), (1,): NextTokenLaw({1: 0.6, 2: 0.4}),
            (3,): NextTokenLaw({1: 1.0})}

    def next_token(prefix):
        if prefix == (2,):
            raise Unaskable("no text")
        return laws[prefix]

    law = expand(next_token, 2, min_mass=0.0, max_calls=100)
    pooled = law.cells.index(((2,), "prefix"))
    assert math.isclose(law.expected[pooled], 0.3) and law.unaskable == (((2,), 0.3),)
    assert law.cell_of((2, 1)) == law.cell_of((2, 3)) == pooled and "pooled" in law.label(pooled)
    assert math.isclose(law.expected.sum(), 1.0) and "1 prefix of mass 0.3000 pooled" in law.note
    with pytest.raises(Unaskable):
        expand(lambda prefix: (_ for _ in ()).throw(Unaskable("root")), 2, min_mass=0.0, max_calls=10)


def test_a_list_that_is_not_a_top_n_judges_only_the_untruncated_law_and_reads_no_greedy_margin():
    law = NextTokenLaw({5: 0.4, 6: 0.2}, 0.4, unlisted_at_most=0.4)  # 0.4 on ids sharing one logprob text
    assert sampling_law_from_raw(law, Sampling()) is law
    for sampling in (Sampling(top_k=1), Sampling(temperature=0.5, top_k=2), Sampling(top_p=0.5), Sampling(0.0)):
        with pytest.raises(NotDeterminable, match="share a logprob string"):
            sampling_law_from_raw(law, sampling)
    assert law.top_two_margin() is None and NextTokenLaw({5: 0.6, 6: 0.3}, 0.1).top_two_margin() == pytest.approx(0.3)


# --- mlx-lm's dialect on a byte-level BPE

@pytest.fixture(scope="module")
def mlx_bpe(bpe_dir):
    model = ToyServedModel(vocab=320, api="mlx-lm", tokenizer_dir=bpe_dir)
    with served_model(model) as target, served_model(model.as_plain()) as plain:
        yield target, plain


@pytest.mark.long  # whole audits on the toy: 11-16 s each on 2 busy cores
def test_mlx_lm_on_bpe_pools_what_it_cannot_send_and_passes_against_itself_and_a_plain_reference(mlx_bpe):
    target, plain = mlx_bpe
    client = Client(retries=0)
    endpoint = open_endpoint("auto", target.url, client)
    assert endpoint.specials == 1 and endpoint.vocab_size == 320  # <s> added by the tokenizer
    for reference in (None, plain.url):  # itself (one-token requests), then the plain server
        result = run_serve_audit(target.url, reference=reference, prompts=(PROMPT,),
                                 samplings=(Sampling(), Sampling(temperature=0.7, top_k=8)), **QUICK)
        assert result.passed, [v.describe() for v in result.failed]
        laws = [v for v in result.verdicts if v.law == "continuation"]
        assert all(v.outcome.value == "exact" and "pooled, each one cell of its exact mass" in v.summary
                   for v in laws), [v.summary for v in laws]
        verdicts = _by_check(result)
        assert verdicts["greedy/greedy_identity"].outcome.value in ("exact", "inconclusive")
        assert verdicts["p0-t1/logprob_fidelity"].outcome.value == "exact"
    spelt = tuple(endpoint.prompts.tokenizer.convert_tokens_to_ids(c) for c in ("Ġ", "t", "h", "e"))
    with pytest.raises(UsageError, match="has no text that"):  # a prompt it cannot send: before the audit starts
        run_serve_audit(target.url, prompts=(spelt,), samplings=(Sampling(),), **QUICK)


def test_a_hotter_proxy_is_found_through_mlx_lm_on_bpe(mlx_bpe):
    target, plain = mlx_bpe
    with proxy("hotter", target.url) as p:
        result = run_serve_audit(p.url, reference=plain.url, api="mlx-lm", prompts=(PROMPT,),
                                 samplings=(Sampling(),), **QUICK)
    law = _by_check(result)["p0-t1/continuation"]
    assert not result.passed and law.outcome.value == "defect", law.summary


@pytest.mark.long  # whole audits on the toy: 11-16 s each on 2 busy cores
def test_mlx_lm_penalties_are_judged_when_the_operator_declares_the_prompt_cache_off(bpe_dir):
    """Without the declaration a penalty world is not judged (the prompt cache's history); with
    ``prompt_cache=off`` it is, the exact path passes, and the draft path whose penalties read only
    the prompt's last token (mlx-lm's speculative_generate_step) is found."""
    penalties = (Sampling(repetition_penalty=2.0, presence_penalty=1.0),)
    exact = ToyServedModel(vocab=320, api="mlx-lm", tokenizer_dir=bpe_dir)
    mutant = ToyServedModel(vocab=320, api="mlx-lm", tokenizer_dir=bpe_dir, penalty_mutant="last_prompt_token")
    # ids [54, 11, 19, 316, 65, 263, 44]: the six most probable tokens after the last one (37.6% of its law), so a
    # penalty over the prompt moves the law, and one over its last token only moves it far less
    assert exact.as_plain().law(list(TextPrompts(bpe_dir).encode(PENALISED)), dict(temperature=1.0))[54] > 0.05
    with served_model(exact) as good, served_model(mutant) as bad, served_model(exact.as_plain()) as plain:
        undeclared = run_serve_audit(good.url, reference=plain.url, prompts=(PENALISED,), samplings=penalties, **QUICK)
        law = _by_check(undeclared)["p0-repetition_penalty2-presence_penalty1/continuation"]
        assert law.outcome.value == "inconclusive" and "prompt_cache=off" in law.summary, law.summary
        declared = dict(QUICK, server_settings=("prompt_cache=off",))
        passed = run_serve_audit(good.url, reference=plain.url, prompts=(PENALISED,), samplings=penalties,
                                 **declared)
        assert passed.passed, [v.describe() for v in passed.failed]
        assert "declared by the operator: prompt_cache=off" in passed.reference
        law = _by_check(passed)["p0-repetition_penalty2-presence_penalty1/continuation"]
        assert law.outcome.value == "exact" and "--server-setting prompt_cache=off" in law.reproduce
        found = run_serve_audit(bad.url, reference=plain.url, prompts=(PENALISED,), samplings=penalties, **declared)
        law = _by_check(found)["p0-repetition_penalty2-presence_penalty1/continuation"]
        assert not found.passed and law.outcome.value == "defect", law.summary
        with pytest.raises(UsageError, match="--server-setting 'prompt_cache=on'.*prompt_cache=off"):
            run_serve_audit(good.url, prompts=(PENALISED,), samplings=penalties,
                            **dict(QUICK, server_settings=("prompt_cache=on",)))


# --- llama-cpp-python's dialect on a byte-level BPE

@pytest.fixture(scope="module")
def lcp_bpe(bpe_dir):
    model = ToyServedModel(vocab=320, api="llama-cpp-python", tokenizer_dir=bpe_dir, drafter="ngram", ngram=1)
    with served_model(model) as target, served_model(model.as_plain()) as plain:
        yield target, plain


def test_llama_cpp_python_is_detected_and_reads_ids_from_texts_merging_shared_ones(lcp_bpe, bpe_dir):
    target, _ = lcp_bpe
    client = Client(retries=0)
    assert detect_api(client, target.url) == "llama-cpp-python"  # /openapi.json's title
    with pytest.raises(EndpointError, match="--model DIR"):
        open_endpoint("auto", target.url, client)
    endpoint = open_endpoint("auto", target.url, client, model=bpe_dir)
    assert endpoint.specials == 1 and "132 ids share their text" in endpoint.describe()
    ids = endpoint.tokenize(REPEATS)
    answers = endpoint.complete_many([endpoint.body(ids, 3, Sampling(), seed) for seed in range(40)])
    assert all(len(a.tokens) == 3 or a.stopped_on_eog for a in answers)
    assert any(t < 0 for a in answers for t in a.tokens) or all(t >= 0 for a in answers for t in a.tokens)
    for a in answers:  # a known id's text is its own; a shared text is a marker (a negative id), never a guess
        assert all(t < 0 or len(endpoint.prompts.ids_of_string(endpoint.prompts.string(t))) == 1 for t in a.tokens)
    with pytest.raises(EndpointError, match="HTTP 500"):  # token-id prompts are refused (pydantic's error, a 500)
        client.post(target.url, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 1})


@pytest.mark.long  # whole audits on the toy: 11-16 s each on 2 busy cores
def test_llama_cpp_python_prompt_lookup_passes_and_a_hotter_proxy_is_found(lcp_bpe, bpe_dir):
    target, plain = lcp_bpe
    settings = dict(QUICK, prompts=(REPEATS,), samplings=(Sampling(),), model=bpe_dir, n_probs=320)
    result = run_serve_audit(target.url, reference=plain.url, **dict(settings, samplings=(
        Sampling(), Sampling(temperature=0.7, top_k=8))))
    assert result.passed, [v.describe() for v in result.failed]
    verdicts = _by_check(result)
    assert verdicts["p0-t1/continuation"].outcome.value == "exact"
    # a world that cannot be judged at all says why, and the audit goes on
    law = verdicts["p0-temperature0_7-top_k8/continuation"]
    assert law.outcome.value == "inconclusive" and "share a logprob string" in law.summary, law.summary
    assert verdicts["p0-t1/independent_samples"].outcome.value == "inconclusive"  # n is dropped
    with proxy("hotter", target.url) as p:
        hotter = run_serve_audit(p.url, reference=plain.url, api="llama-cpp-python", **settings)
    law = _by_check(hotter)["p0-t1/continuation"]
    assert not hotter.passed and law.outcome.value == "defect", law.summary
