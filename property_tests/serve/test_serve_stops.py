"""Stop strings in the serve law (issue 59): an answer ends at the first token whose text completes
a stop string, so the law of answers is the law of the first L tokens cut at the first stop
(``exactcheck.serve.stop_law``), with the text of each prefix as the server searches it
(llama.cpp: its tokens' pieces; vLLM: its incremental detokenizer's text, read through
``/detokenize``). In process, on the toy served model: exact servers pass, the ``step_end`` mutant
(tokens of a speculation step returned past the stop) is found with its cause, and where the
server's returned text is not the text the audit read the world is not judged, with the reason."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from exactcheck.core import Outcome
from exactcheck.endpoints.continuation_law import NextTokenLaw, expand
from exactcheck.endpoints.endpoint import Sampling
from exactcheck.serve.runner import run_serve_audit
from exactcheck.serve.stop_law import ends_disagreeing, returned_text, stopped_law
from toy_models.served_lm import ToyServedModel, respond, token_text

STOPS = Sampling.parse("stop=b,stop=cd")
AUDIT = dict(level="quick", seed=0, progress=False, prompts=([1, 2],), samplings=(STOPS,), max_samples=2000, length=4,
             traffic="sequential")


def _audit(model: ToyServedModel, *, separate: bool = True, detokenize=None, **keywords):
    plain = model.as_plain()

    def transport(base, path, body):
        if detokenize is not None and path == "/detokenize":
            return detokenize(body)
        return respond(plain if base == "http://ref" else model, path, body)[1]

    return run_serve_audit("http://toy", reference="http://ref" if separate else None, transport=transport,
                           **dict(AUDIT, **keywords))


def _continuation(result):
    return next(v for v in result.verdicts if v.law == "continuation")


def test_the_stopped_law_is_the_enumerated_law_of_cut_answers():
    rng = np.random.default_rng(3)
    rows = {}

    def next_token(prefix):
        if prefix not in rows:
            p = rng.dirichlet(np.ones(4))
            rows[prefix] = NextTokenLaw({t: float(p[t]) for t in range(4)})
        return rows[prefix]

    law = expand(next_token, 3, min_mass=0.0, max_calls=10_000)  # every prefix expanded: 4**3 full cells
    stops = ("b", "dc")
    cut, texts = stopped_law(law, lambda cs: ["".join(token_text(t) for t in c) for c in cs], stops)
    direct: dict[tuple, float] = {}
    for seq in itertools.product(range(4), repeat=3):
        mass = np.prod([rows[seq[:i]].probabilities[seq[i]] for i in range(3)])
        text, end = "", 3
        for j, t in enumerate(seq, start=1):
            text += token_text(t)
            if any(s in text for s in stops):
                end = j
                break
        direct[seq[:end]] = direct.get(seq[:end], 0.0) + mass
    got = {prefix: float(p) for (prefix, _), p in zip(cut.cells, cut.expected)}
    assert got.keys() == direct.keys()
    assert max(abs(got[k] - direct[k]) for k in direct) < 1e-15
    assert all(cut.cell_of(k) == i for i, (k, _) in enumerate(cut.cells))  # every answer finds its cell
    assert cut.cell_of((1, 0, 0)) == len(cut.cells)  # ran past "b": probability 0
    assert ends_disagreeing([(1, 0, 0), (1,), (0, 0)], texts, stops, 3) == [(1, 0, 0), (0, 0)]
    assert returned_text("aabdc", stops) == {"aa", "aab"} and returned_text("aa", stops) == {"aa"}


@pytest.mark.parametrize("api, dialect", [("llama.cpp", "llama.cpp"), pytest.param("vllm", "openai", marks=pytest.mark.long),
                                          pytest.param("llama.cpp", "openai", marks=pytest.mark.long)])
def test_an_exact_server_with_stop_strings_passes_and_the_step_end_mutant_is_found(api, dialect):
    exact = _continuation(_audit(ToyServedModel(api=api), api=dialect))
    assert exact.outcome == Outcome.EXACT and "stop at 'b' or 'cd'" in exact.condition, exact.describe()
    mutant = _continuation(_audit(ToyServedModel(api=api, stop_mutant="step_end"), api=dialect))
    assert mutant.outcome == Outcome.DEFECT and "run past the token that completed a stop string" in mutant.summary


@pytest.mark.long
def test_the_mutant_is_found_with_the_audited_server_as_its_own_reference():
    mutant = _continuation(_audit(ToyServedModel(stop_mutant="step_end"), separate=False))
    assert mutant.outcome == Outcome.DEFECT, mutant.describe()
    assert _continuation(_audit(ToyServedModel(), separate=False)).outcome == Outcome.EXACT


def test_a_text_the_server_does_not_search_is_not_judged_never_a_finding():
    """vLLM's /detokenize renders special tokens, which its stop search skips: here it renders token 3
    as "b", so an exact server's answers run past "stops" it never saw, and its returned text says so."""
    def detokenize(body):
        return {"prompt": "".join("b" if t == 3 else token_text(t) for t in body["tokens"])}

    result = _audit(ToyServedModel(api="vllm"), detokenize=detokenize, api="openai")
    for check in ("continuation", "independent_samples"):  # its several samples read the same texts
        verdict = next(v for v in result.verdicts if v.law == check)
        assert verdict.outcome == Outcome.INCONCLUSIVE and "is not the one the audit read" in verdict.summary, \
            verdict.describe()


def test_where_the_stop_text_is_not_known_the_world_is_not_judged_with_the_reason():
    from exactcheck.serve.chat import ChatPrompt
    chat = _continuation(_audit(ToyServedModel(), prompts=(ChatPrompt.parse(["user:abc"]),), api="llama.cpp"))
    assert chat.outcome == Outcome.INCONCLUSIVE and "chat endpoint" in chat.summary


def test_stop_strings_parse_percent_encoded_and_unjudged_fields_are_refused_with_the_reason():
    s = Sampling.parse("temperature=0.5,stop=%0A,stop=a%2Cb")
    assert s.stop == ("\n", "a,b") and Sampling.parse(s.spec()) == s and s.fields()["stop"] == ["\n", "a,b"]
    with pytest.raises(ValueError, match="only with ignore_eos=0"):
        Sampling.parse("min_tokens=4")  # with ignore_eos every answer has the asked length: min_tokens says nothing
    with pytest.raises(ValueError, match="n is not judged: every world's independent_samples check asks n"):
        Sampling.parse("n=3")
    ends = Sampling.parse("temperature=0.5,ignore_eos=0,min_tokens=2")
    assert ends.finishes and ends.min_tokens == 2 and Sampling.parse(ends.spec()) == ends


def test_a_server_without_detokenize_is_not_judged_never_a_usage_error():
    """SGLang's /v1/completions speaks OpenAI's dialect without vLLM's /detokenize: a 404 there."""
    from exactcheck.endpoints.client import EndpointError

    def detokenize(body):
        raise EndpointError("HTTP 404 from http://ref/detokenize: not found")

    law = _continuation(_audit(ToyServedModel(api="vllm"), detokenize=detokenize, api="openai"))
    assert law.outcome == Outcome.INCONCLUSIVE and "stop strings is not known" in law.summary, law.describe()


@pytest.mark.long
def test_the_stop_one_late_proxy_is_found_over_http_and_keeps_several_samples():
    """The proxy mutant in front of the toy served over HTTP (llama.cpp's /completion): one token
    past the stop is found; its answers to n_cmpl requests (a list) are cut one by one."""
    from exactcheck.serve.mutants import proxy
    from toy_models.served_lm import served_model
    model = ToyServedModel()
    with served_model(model) as target, served_model(model.as_plain()) as plain, \
            proxy("stop_one_late", target.url) as p:
        result = run_serve_audit(p.url, reference=plain.url, **dict(AUDIT, max_samples=600))
    late = _continuation(result)
    assert late.outcome == Outcome.DEFECT and "run past the token that completed a stop string" in late.summary
    several = next(v for v in result.verdicts if v.law == "independent_samples")
    assert several.outcome == Outcome.DEFECT and "outcomes of exact probability 0" in several.summary
