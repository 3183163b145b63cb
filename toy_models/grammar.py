"""A grammar-masked world: JSON objects with exactly four properties (the guide's exercise).

Toy vocabulary (13 tokens): ``{`` ``}`` ``:`` ``,`` the keys ``"a"`` ``"b"`` ``"c"`` ``"d"``, a key
the schema forbids ``"e"``, the values ``1`` ``true`` ``null``, and ``<eos>``. The schema: an
object whose four keys are a, b, c and d (each once, any order) with values from {1, true,
null}. The automaton ``allowed(prefix)`` gives the tokens the grammar permits after each prefix
of generated tokens; after ``}`` only ``<eos>``, which is the policy's stop token (and after
``<eos>`` again only ``<eos>``, so rows past the end, which a speculative loop may compute but
never uses, stay well defined). A complete
output is 18 tokens; there are 4! x 3^4 = 1,944 valid ones.

The target is a context toy LM over the 13 tokens (rows depend on the whole prefix through the
rolling hash), masked by the automaton and renormalised: the policy's law. The draft is another
toy LM that knows nothing of the grammar: it proposes forbidden keys, repeated keys and early
``}``, which an exact verifier must reject and correct from the residual over allowed tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import json

from toy_models.context_lm import make_context_world
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["TOKENS", "EOS", "allowed", "detokenize", "is_valid", "grammar_world", "JSON_SCHEMA"]

TOKENS = ("{", "}", ":", ",", '"a"', '"b"', '"c"', '"d"', '"e"', "1", "true", "null", "<eos>")
OPEN, CLOSE, COLON, COMMA = 0, 1, 2, 3
KEYS = (4, 5, 6, 7)
FORBIDDEN_KEY = 8
VALUES = (9, 10, 11)
EOS = 12
PROPERTIES = 4
LENGTH = 1 + 4 * PROPERTIES - 1 + 1 + 1  # "{", 4 x (k : v) and 3 commas, "}", <eos>: 18 tokens

JSON_SCHEMA = {"type": "object", "properties": {k: {"enum": [1, True, None]} for k in "abcd"},
               "required": list("abcd"), "additionalProperties": False}


@functools.lru_cache(maxsize=None)
def allowed(prefix: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens the grammar allows after ``prefix`` (the generated tokens so far)."""
    n = len(prefix)
    if n == 0:
        return (OPEN,)
    if n >= LENGTH or EOS in prefix:
        return (EOS,)  # the end is absorbing: nothing but <eos> (a stop token: never emitted twice)
    if n == LENGTH - 1:
        return (EOS,)
    body = n - 1  # tokens after "{"
    slot = body % 4  # 0 key, 1 ":", 2 value, 3 "," or "}"
    if slot == 0:
        used = set(prefix[1::4])
        return tuple(k for k in KEYS if k not in used)
    if slot == 1:
        return (COLON,)
    if slot == 2:
        return VALUES
    return (CLOSE,) if body // 4 == PROPERTIES - 1 else (COMMA,)


def detokenize(tokens) -> str:
    return "".join(TOKENS[t] for t in tokens if t != EOS)


def is_valid(tokens) -> bool:
    """Whether ``tokens`` is a complete output: valid JSON of the schema, then ``<eos>``."""
    tokens = tuple(int(t) for t in tokens)
    if not tokens or tokens[-1] != EOS:
        return False
    try:
        obj = json.loads(detokenize(tokens))
    except ValueError:
        return False
    values_ok = all(v is None or v is True or (v == 1 and not isinstance(v, bool)) for v in obj.values()) \
        if isinstance(obj, dict) else False
    return (isinstance(obj, dict) and sorted(obj) == list("abcd") and values_ok
            and all(tokens[i] in allowed(tokens[:i]) for i in range(len(tokens))))


def key_order(output) -> tuple:
    """The order of an output's four keys (module level: a world pickles into ``--jobs`` workers)."""
    return tuple(TOKENS[t] for t in output[1:17:4])


def key_values(output) -> tuple:
    """The value of each key, a to d, of a complete object (() for a shorter output)."""
    if len(output) < 17:
        return ()
    return tuple(TOKENS[output[i + 2]] for i in sorted(range(1, 17, 4), key=lambda i: output[i]))


@functools.lru_cache(maxsize=1)
def grammar_world() -> ModelWorld:
    """The JSON world: target and draft toy LMs over the 13 tokens, the grammar as the policy's
    mask and ``<eos>`` as its stop token."""
    from exactcheck.contracts.policy import DecodingPolicy
    world = make_context_world("json_v13_k3", vocab=len(TOKENS), num_states=97, length=LENGTH, draft_length=3,
                               agreement=0.3, seed=41, concentration=1.0)
    prompt, state = prompt_for_state(world, 4, seed=41)
    policy = DecodingPolicy(temperature=1.0, stop_tokens=(EOS,), mask=allowed, name="json_grammar")
    marginals = (("key_order", "order of the four keys", key_order),
                 ("values", "value of each key, a to d", key_values))
    # room for 4 tokens past the 18 of a complete object: a generator must stop at <eos> anyway
    return ModelWorld("json_v13_k3", dataclasses.replace(world, prompt_state=state), tuple(prompt),
                      policy=policy, validate=is_valid, max_new_tokens=LENGTH + 4, marginals=marginals)
