"""Structured output on the served toy (``toy_models.served_lm``): the constraint a request carries, in
each dialect's field, and the mask it puts on the toy's law, exactly.

llama.cpp's ``grammar`` is GBNF; the toy reads one root rule of the regular subset (literals ``"..."``,
classes ``[...]``, groups, ``|``, ``* + ? {m,n}``), as a regex. vLLM's ``structured_outputs`` carries
``choice`` (a list) or ``regex``. A JSON schema: an ``enum`` of strings, written bare (the toy's own
convention, ``_enum_schema``), in llama.cpp's ``json_schema`` and vLLM's ``structured_outputs.json``; any
other schema, a grammar of several rules: 400, the toy has no engine for them. The toy's own matcher is the ``regex`` package's partial matching, written apart from the
audit's (``exactcheck.endpoints.constraints``).

The mask meets the sampler chain in each engine's order: llama.cpp samples from the chain and resamples
with the grammar applied first where the grammar rejects the token (``common_sampler_sample``); vLLM
applies the grammar's bitmask to the logits, then the chain (``mask-first``).

Mutants (``ToyServedModel.constraint_mutant``), each a defect of structured output under speculation:
"""
from __future__ import annotations

import re

import numpy as np

__all__ = ["ToyConstraint", "from_body", "CONSTRAINT_MUTANTS", "constrained_chain"]

CONSTRAINT_MUTANTS = {
    "bonus_unmasked": "the bonus token (after every draft of a step was accepted) sampled without the mask",
    "first_mask": "every draft position of a step verified with the mask of the step's first position",
    "no_rollback": "the matcher advanced through every draft and not rolled back after a rejection: later "
                   "masks read the rejected drafts' text (where that text allows nothing, no mask at all)",
    "past_accept": "a draft position where the constraint has ended verified without the mask: tokens past the "
                   "grammar's accept state kept",
}
__doc__ += "".join(f"\n- ``{k}``: {v}" for k, v in CONSTRAINT_MUTANTS.items()) + "\n"


class ToyConstraint:
    """Which answer texts a request's constraint allows: ``viable`` (a prefix of an allowed text) and
    ``complete`` (an allowed text)."""

    def __init__(self, pattern: str):
        import regex
        self.pattern = regex.compile(pattern)

    def viable(self, text: str) -> bool:
        return self.pattern.fullmatch(text, partial=True) is not None

    def complete(self, text: str) -> bool:
        return self.pattern.fullmatch(text) is not None

    def allowed(self, text: str, texts: list[str], eos: int | None) -> np.ndarray:
        """Over the vocabulary (``texts``: each token's text): the tokens whose text keeps ``text``
        viable, and the end-of-generation token where ``text`` is complete."""
        out = np.array([t != eos and bool(piece) and self.viable(text + piece) for t, piece in enumerate(texts)])
        if eos is not None:
            out[eos] = self.complete(text)
        return out

    def ended(self, text: str, texts: list[str], eos: int | None) -> bool:
        """Whether the constraint has ended here: nothing but the end of generation allowed."""
        allowed = self.allowed(text, texts, eos)
        return eos is not None and bool(allowed[eos]) and int(allowed.sum()) == 1


def _enum_schema(schema) -> ToyConstraint:
    """The toy's JSON-schema engine: a schema ``{"enum": [strings]}`` allows its strings, written bare
    (the toy's own convention, as every engine has its own way of writing a schema's JSON: which is why
    the audit does not guess a schema's language and judges such a world by two samples)."""
    if isinstance(schema, str):
        import json
        schema = json.loads(schema)
    values = schema.get("enum") if isinstance(schema, dict) else None
    if not values or not all(isinstance(v, str) and v for v in values):
        raise ValueError("json_schema: the toy takes an enum of non-empty strings only")
    return ToyConstraint("|".join(re.escape(v) for v in values))


def from_body(body: dict, api: str) -> "ToyConstraint | None":
    """The constraint a request carries in the dialect's field; ``ValueError`` for one the toy has no
    engine for."""
    if api == "vllm":
        fields = body.get("structured_outputs") or {}
        if "choice" in fields:
            return ToyConstraint("|".join(re.escape(str(c)) for c in fields["choice"]))
        if "regex" in fields:
            return ToyConstraint(str(fields["regex"]))
        if "json" in fields:
            return _enum_schema(fields["json"])
        if fields:
            raise ValueError(f"structured_outputs {sorted(fields)}: the toy takes choice, regex or json (an enum)")
        return None
    if body.get("json_schema") is not None:
        return _enum_schema(body["json_schema"])
    if body.get("grammar"):
        return ToyConstraint(gbnf_regex(str(body["grammar"])))
    return None


_TOKEN = re.compile(r'\s+|"((?:[^"\\]|\\.)*)"|(\[(?:[^\]\\]|\\.)*\])|(\{\d+(?:,\d*)?\})|([()|*+?])')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r"}


def gbnf_regex(grammar: str) -> str:
    """One GBNF root rule of the regular subset as a regex (``ValueError`` for anything else)."""
    rules = [line for line in grammar.strip().splitlines() if line.strip() and not line.strip().startswith("#")]
    if len(rules) != 1 or not rules[0].strip().startswith("root") or "::=" not in rules[0]:
        raise ValueError("grammar: the toy reads one root rule")
    text, out, i = rules[0].split("::=", 1)[1], [], 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if m is None:
            raise ValueError(f"grammar: the toy cannot read {text[i:i + 10]!r}")
        literal, klass, count, op = m.groups()
        if literal is not None:
            out.append(re.escape(re.sub(r"\\(.)", lambda e: _ESCAPES.get(e.group(1), e.group(1)), literal)))
        elif klass is not None:
            out.append(klass)
        elif count is not None or op is not None:
            out.append("(?:" if op == "(" else (count or op))
        i = m.end()
    return "".join(out)


def constrained_chain(row: np.ndarray, allowed: np.ndarray, chain, order: str) -> np.ndarray:
    """The next token's law with the mask ``allowed`` met in the engine's ``order``: "mask-first" (the
    chain of the masked row) or "check-then-resample" (llama.cpp). A mask that allows nothing: the
    chain unmasked (an engine whose matcher is lost)."""
    if not allowed.any() or not (row * allowed).sum() > 0:
        return chain(row)
    masked = chain(row * allowed / (row * allowed).sum())
    if order == "mask-first":
        return masked
    plain = chain(row)
    return plain * allowed + plain[~allowed].sum() * masked
