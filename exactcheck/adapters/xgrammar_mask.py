"""A real grammar engine as a decoding-policy mask: xgrammar compiling a JSON schema against a
transformers tokenizer (SmolLM2's 49,152-token vocabulary here).

``XGrammarMask(tokenizer, schema, vocab_size)`` is a callable ``mask(prefix) -> bool tensor [V]``
of allowed tokens for ``exactcheck.contracts.policy.DecodingPolicy``: it replays the generated prefix through an xgrammar
``GrammarMatcher`` and reads the allowed tokens from the matcher's token bitmask. Results are
memoised per prefix, so a generation costs one replay per step. ``stop_tokens`` are the
tokenizer's stop tokens (the only tokens the grammar allows once the object is complete).
A prefix the grammar rejects allows only the stop tokens (so a row is always defined; an exact
generator never reaches such a prefix).
"""
from __future__ import annotations

import json

import torch

__all__ = ["XGrammarMask", "FOUR_PROPERTY_SCHEMA", "matches_schema"]

# the guide's object with exactly four properties, kept short: compact JSON of simple types
FOUR_PROPERTY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "team": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "admin", "team"],
    "additionalProperties": False,
}


def matches_schema(text: str, schema: dict = FOUR_PROPERTY_SCHEMA) -> bool:
    """Whether ``text`` is JSON of the four-property schema (checked by hand, not by xgrammar)."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    if not isinstance(obj, dict) or sorted(obj) != sorted(schema["required"]):
        return False
    props = schema["properties"]
    return (isinstance(obj["name"], str) and len(obj["name"]) <= props["name"]["maxLength"]
            and isinstance(obj["age"], int) and not isinstance(obj["age"], bool) and 0 <= obj["age"] <= 120
            and isinstance(obj["admin"], bool) and obj["team"] in props["team"]["enum"])


class XGrammarMask:
    def __init__(self, tokenizer, schema: dict = FOUR_PROPERTY_SCHEMA, vocab_size: int | None = None):
        import xgrammar as xgr
        self._xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = self.info.vocab_size
        self.compiled = xgr.GrammarCompiler(self.info).compile_json_schema(
            json.dumps(schema), any_whitespace=False)
        self.stop_tokens = tuple(int(t) for t in self.info.stop_token_ids)
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}
        stops = torch.zeros(self.vocab_size, dtype=torch.bool)
        stops[list(self.stop_tokens)] = True
        self._stops = stops

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        """A bool tensor [V]: the tokens the grammar allows after ``prefix``."""
        prefix = tuple(int(t) for t in prefix)
        if prefix not in self._memo:
            self._memo[prefix] = self._allowed(prefix)
        return self._memo[prefix]

    def _allowed(self, prefix: tuple[int, ...]) -> torch.Tensor:
        matcher = self._xgr.GrammarMatcher(self.compiled)
        for token in prefix:
            if matcher.is_terminated() or not matcher.accept_token(token):
                return self._stops
        if matcher.is_terminated():
            return self._stops
        bitmask = self._xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(bitmask)
        bits = bitmask[0].to(torch.int64) & 0xFFFFFFFF
        shifts = torch.arange(32, dtype=torch.int64)
        return ((bits[:, None] >> shifts) & 1).bool().reshape(-1)[: self.vocab_size]
