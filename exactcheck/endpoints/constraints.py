"""Structured output: the constraint a world's requests carry (``--sampling ...,choice=yes|no``), how
each dialect writes it, and the small local engine that says which continuations it allows.

A ``Constraint`` is one of four kinds, as the engines take them:

- ``choice``: a list of strings (``choice=yes|no|maybe``); the answer's text is one of them;
- ``regex``: a regular expression the whole answer's text matches;
- ``json_schema``: a JSON schema (inline, or ``@file``);
- ``grammar``: a GBNF grammar (``@file``, or inline).

In a ``--sampling`` spec the constraint is the last key and its value runs to the end of the spec,
commas included (``temperature=0.7,regex=[ab]{1,3}``).

Dialects (``Endpoint.constraint_fields``): llama.cpp takes ``grammar`` (GBNF) and ``json_schema``
(server-common.cpp converts it to a grammar), so a choice and a regex are written as GBNF here
(``choice_gbnf``, ``regex_gbnf``: a regex this module cannot write as GBNF is not carried); vLLM takes
``structured_outputs`` with ``choice``, ``regex``, ``json`` or ``grammar`` (vllm/sampling_params.py
``StructuredOutputsParams``); SGLang's ``/generate`` takes ``regex``, ``json_schema`` and ``ebnf`` in
its ``sampling_params`` (a choice as the regex of its alternatives).

The local engine (``matcher``): ``viable(text)`` (the text can still be extended into an answer the
constraint allows) and ``complete(text)`` (the text is such an answer: an end of generation may
follow), by the ``regex`` package's partial matching (a loose dependency: without it a constrained
world is not judged) of the choice's alternatives, the regex, or a GBNF grammar's rules inlined into
one regex (``gbnf_pattern``: a grammar whose language is regular, no rule reaching itself; the
language of a GBNF grammar is the same whichever engine reads it). A JSON schema (each engine writes
its own grammar for one: whitespace, key order) and a recursive grammar have no local engine here:
``NotDeterminable``, and such a world is not judged, saying so.
"""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Iterable, Mapping

from exactcheck.endpoints.sampler_law import NotDeterminable

__all__ = ["Constraint", "KINDS", "INCOMPLETE", "Matcher", "matcher", "allowed_tokens", "choice_gbnf", "regex_gbnf",
           "gbnf_pattern", "split_spec"]

KINDS = ("choice", "regex", "json_schema", "grammar")
_KEY = re.compile(r"(?:^|,)\s*(" + "|".join(KINDS) + r")=")


@dataclass(frozen=True)
class Constraint:
    """One structured-output constraint: its ``kind`` (``KINDS``), its value (a choice's strings; a
    regex, a JSON schema's text or a grammar's text) and the ``@file`` it was read from, if any."""

    kind: str
    value: str | tuple[str, ...]
    source: str | None = None

    @classmethod
    def parse(cls, kind: str, text: str) -> "Constraint":
        """``kind=text`` from a ``--sampling`` spec; a malformed one is a ``ValueError`` saying why."""
        if kind not in KINDS:
            raise ValueError(f"{kind}: a constraint is one of {', '.join(KINDS)}")
        source = None
        if kind in ("json_schema", "grammar") and text.startswith("@"):
            source, text = text[1:], _read(kind, text[1:])
        if kind == "choice":
            options = tuple(text.split("|"))
            if not all(options) or len(set(options)) != len(options):
                raise ValueError(f"choice={text!r}: non-empty, distinct strings separated by '|'")
            return cls(kind, options)
        if not text.strip():
            raise ValueError(f"{kind}=: empty")
        if kind == "regex":
            try:
                re.compile(text)
            except re.error as exc:
                raise ValueError(f"regex={text!r}: {exc}") from None
        if kind == "json_schema":
            try:
                schema = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json_schema: not JSON ({exc})") from None
            if not isinstance(schema, dict):
                raise ValueError("json_schema: a JSON object (a schema) is expected")
        if kind == "grammar" and "root" not in text:
            raise ValueError("grammar: a GBNF grammar with a root rule is expected")
        return cls(kind, text, source)

    def spec(self) -> str:
        """The ``--sampling`` key that gives this constraint back."""
        if self.source is not None:
            return f"{self.kind}=@{self.source}"
        return f"{self.kind}=" + ("|".join(self.value) if self.kind == "choice" else str(self.value))

    def tag(self) -> str:
        """A short name for world names: the kind and a checksum of the spec."""
        return f"{self.kind.replace('_', '')}{zlib.crc32(self.spec().encode()) & 0xffff:04x}"

    def describe(self) -> str:
        if self.kind == "choice":
            return "constrained to one of " + ", ".join(map(repr, self.value))
        if self.kind == "regex":
            return f"constrained to the regex {self.value!r}"
        where = f"@{self.source}" if self.source else f"{len(self.value)} characters"
        return f"constrained to the {'JSON schema' if self.kind == 'json_schema' else 'GBNF grammar'} ({where})"

    @property
    def schema(self) -> dict:
        return json.loads(self.value)

    def regex(self) -> str:
        """The regex of a choice or a regex constraint (a choice: its alternatives, escaped)."""
        if self.kind == "choice":
            return "|".join(re.escape(c) for c in self.value)
        if self.kind == "regex":
            return str(self.value)
        raise NotDeterminable(f"a {self.kind} is not a regex")


def _read(kind: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise ValueError(f"{kind}=@{path}: cannot be read ({exc.strerror})") from None


def split_spec(spec: str) -> tuple[str, Constraint | None]:
    """(the spec before its constraint, the constraint or None): the constraint's value runs to the
    end of the spec, commas included."""
    found = _KEY.search(spec)
    if found is None:
        return spec, None
    return spec[:found.start()], Constraint.parse(found.group(1), spec[found.end():])


INCOMPLETE = "\ufffd"  # a piece that ends inside a UTF-8 character is read with this in place of its bytes
# what in a regex may match a character outside ASCII (Python's \d \w \s are Unicode-aware), as text
_UNICODE_MATCHING = (".", "[^", "\\W", "\\S", "\\D", "\\s", "\\w", "\\d", "\\p", "\\P", "\\X", "\\N")


class Matcher:
    """Which texts a constraint allows: ``viable`` (a prefix of an allowed answer) and ``complete``
    (an allowed answer). Texts are the answer's own, the prompt not included. ``ascii_only``: every
    text the constraint allows is ASCII (the pattern has no character outside ASCII and nothing that
    can match one; decided on the pattern's text, so a ``.`` escaped or in a class counts too: False
    where unsure)."""

    def __init__(self, pattern: str, ascii_only: bool | None = None):
        try:
            import regex
        except ImportError:  # a loose dependency
            raise NotDeterminable("the 'regex' package (partial matching) is not installed: pip install regex") \
                from None
        self._compiled = regex.compile(pattern)
        self.ascii_only = ascii_only if ascii_only is not None else (
            pattern.isascii() and not any(s in pattern for s in _UNICODE_MATCHING))

    def viable(self, text: str) -> bool:
        return self._compiled.fullmatch(text, partial=True) is not None

    def complete(self, text: str) -> bool:
        return self._compiled.fullmatch(text) is not None


def matcher(constraint: Constraint) -> Matcher:
    """The local engine for ``constraint``: a choice, a regex, or a GBNF grammar without recursion (its
    rules inlined into one regex, ``gbnf_pattern``); ``NotDeterminable`` for a JSON schema (each engine
    writes its own grammar for one, whitespace included) and a recursive grammar (not a regular
    language)."""
    if constraint.kind == "grammar":
        return Matcher(gbnf_pattern(str(constraint.value)), ascii_only=gbnf_ascii_only(str(constraint.value)))
    if constraint.kind not in ("choice", "regex"):
        raise NotDeterminable(f"the audit has no local engine for a {constraint.kind.replace('_', ' ')}: the mask "
                              f"at each prefix cannot be computed here (each engine writes its own grammar for "
                              f"one)")
    if constraint.kind == "choice":
        return Matcher(constraint.regex(), ascii_only=all(o.isascii() for o in constraint.value))
    return Matcher(constraint.regex())


# --- a GBNF grammar (llama.cpp's grammars/README.md) as one regex, where its language is regular

_GBNF = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<define>[A-Za-z0-9_-]+)\s*::=
  | (?P<name>[A-Za-z0-9_-]+)
  | "(?P<literal>(?:\\.|[^"\\])*)"
  | \[(?P<klass>(?:\\.|[^\]\\])*)\]
  | (?P<repeat>\{\s*\d+\s*(?:,\s*\d*\s*)?\})
  | (?P<op>[()|*+?.])
""", re.X)
_GBNF_ESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_GBNF_LIMIT = 200_000  # characters of the inlined regex: beyond it, not judged


def _gbnf_chars(text: str) -> list[str]:
    """The characters of a GBNF literal or class body, escapes decoded (``\\n``, ``\\xHH``,
    ``\\uHHHH``, ``\\UHHHHHHHH``; any other escaped character is itself); in a class an escaped
    character is marked (a tuple), so that ``\\-`` is not a range."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            c = text[i + 1]
            width = {"x": 2, "u": 4, "U": 8}.get(c)
            if width is not None:
                out.append((chr(int(text[i + 2:i + 2 + width], 16)),))
                i += 2 + width
            else:
                out.append((_GBNF_ESCAPES.get(c, c),))
                i += 2
        else:
            out.append(text[i])
            i += 1
    return out


def _gbnf_class(body: str) -> str:
    negated = body.startswith("^")
    chars = _gbnf_chars(body[1:] if negated else body)
    plain = [c[0] if isinstance(c, tuple) else c for c in chars]
    items, i = [], 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":  # a range (an escaped dash is a tuple, not a range)
            items.append(f"{_class_char(plain[i])}-{_class_char(plain[i + 2])}")
            i += 3
        else:
            items.append(_class_char(plain[i]))
            i += 1
    return "[" + "^" * negated + "".join(items) + "]"


def _class_char(c: str) -> str:
    return "\\" + c if c in "\\]^-[" else c


def gbnf_ascii_only(grammar: str) -> bool:
    """Whether every text a GBNF grammar allows is ASCII: no ``.``, no negated class, and every literal
    and class character ASCII (a grammar this reader cannot read: False)."""
    i = 0
    while i < len(grammar):
        m = _GBNF.match(grammar, i)
        if m is None:
            return False
        i, kind = m.end(), m.lastgroup
        if kind == "op" and m.group("op") == ".":
            return False
        if kind == "klass" and m.group("klass").startswith("^"):
            return False
        if kind in ("literal", "klass") and not all(
                (c[0] if isinstance(c, tuple) else c).isascii() for c in _gbnf_chars(m.group(kind))):
            return False
    return True


def gbnf_pattern(grammar: str) -> str:
    """A GBNF grammar as one regex over the answer's text: every rule the root reaches inlined as a
    group, literals escaped, classes rewritten, ``.`` any character. ``NotDeterminable`` where no
    regex says the same: a rule that reaches itself (recursion: not a regular language, e.g. nested
    JSON), an undefined rule, syntax this reader does not take."""
    rules: dict[str, list[tuple[str, str]]] = {}
    current, i = None, 0
    while i < len(grammar):
        m = _GBNF.match(grammar, i)
        if m is None:
            raise NotDeterminable(f"grammar: cannot read {grammar[i:i + 20]!r}")
        i, kind = m.end(), m.lastgroup
        if kind == "space":
            continue
        if kind == "define":
            current = m.group("define")
            if current in rules:
                raise NotDeterminable(f"grammar: the rule {current!r} is defined twice")
            rules[current] = []
        elif current is None:
            raise NotDeterminable("grammar: text before the first rule")
        else:
            rules[current].append((kind, m.group(kind)))
    if "root" not in rules:
        raise NotDeterminable("grammar: no root rule")
    done: dict[str, str] = {}

    def inline(name: str, path: tuple[str, ...]) -> str:
        if name in path:
            raise NotDeterminable(f"grammar: the rule {name!r} reaches itself ({' -> '.join(path + (name,))}): a "
                                  f"recursive grammar has no local engine here")
        if name not in rules:
            raise NotDeterminable(f"grammar: the rule {name!r} is not defined")
        if name not in done:
            parts = []
            for kind, value in rules[name]:
                if kind == "name":
                    parts.append("(?:" + inline(value, path + (name,)) + ")")
                elif kind == "literal":
                    parts.append(re.escape("".join(c[0] if isinstance(c, tuple) else c for c in _gbnf_chars(value))))
                elif kind == "klass":
                    parts.append(_gbnf_class(value))
                elif kind == "repeat":
                    parts.append(re.sub(r"\s", "", value))
                else:
                    parts.append({"(": "(?:", ".": "[\\s\\S]"}.get(value, value))
            done[name] = "".join(parts)
            if len(done[name]) > _GBNF_LIMIT:
                raise NotDeterminable(f"grammar: its inlined regex is over {_GBNF_LIMIT:,} characters")
        return done[name]

    pattern = inline("root", ())
    try:
        re.compile(pattern)
    except re.error as exc:
        raise NotDeterminable(f"grammar: not read as a regex ({exc})") from None
    return pattern


def allowed_tokens(match: Matcher, text: str, pieces: Mapping[int, str], eog: Iterable[int]) -> frozenset[int]:
    """The tokens the constraint allows after ``text``: an end-of-generation token where ``text`` is
    complete; any other token whose piece extends ``text`` to a viable text (an empty piece, a special
    token, never: llama.cpp's grammar sampler and xgrammar reject them).

    A piece that ends inside a UTF-8 character (read with ``INCOMPLETE`` for its bytes: a byte-level
    token such as ``a\\xc3``) is allowed by an engine exactly where some character its bytes begin keeps
    the text viable (xgrammar matches bytes). Where the constraint allows ASCII only, none does: never
    allowed. Otherwise the audit, which does not read the bytes, cannot say: ``NotDeterminable`` where
    the piece's whole characters keep the text viable (else the text is dead already: not allowed)."""
    eog = frozenset(eog)
    out = set()
    for t, piece in pieces.items():
        if t in eog or not piece:
            continue
        if INCOMPLETE in piece:
            whole = piece.split(INCOMPLETE, 1)[0]
            if not match.ascii_only and match.viable(text + whole):
                raise NotDeterminable(f"token {t}'s piece ends inside a character ({piece!r}) after a text the "
                                      f"constraint allows, which can go on with characters outside ASCII: "
                                      f"whether an engine allows it depends on bytes the audit does not read")
            continue
        if match.viable(text + piece):
            out.add(t)
    if match.complete(text):
        out |= eog
    return frozenset(out)


def _gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'


def choice_gbnf(options: Iterable[str]) -> str:
    """A choice as llama.cpp's GBNF: one root rule, its alternatives literal."""
    return "root ::= " + " | ".join(_gbnf_literal(o) for o in options)


_CLASSES = {"d": "[0-9]", "w": "[a-zA-Z0-9_]", "s": "[ \\t\\n\\r]", "n": '"\\n"', "t": '"\\t"'}


def regex_gbnf(pattern: str) -> str:
    """A regex of the common subset (literals, classes ``[...]``, ``.``, ``\\d \\w \\s``, groups,
    ``|``, ``* + ? {m} {m,n}``, a leading ``^`` and a trailing ``$``) as llama.cpp's GBNF (one root
    rule); anything else (lazy quantifiers, lookaround, back-references, named groups) is
    ``NotDeterminable``: the constraint is not carried to llama.cpp."""
    body = pattern[1:] if pattern.startswith("^") else pattern
    body = body[:-1] if body.endswith("$") and not body.endswith("\\$") else body
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt.isdigit() or nxt in "bBAZ":
                raise NotDeterminable(f"regex {pattern!r}: \\{nxt} has no GBNF form here")
            out.append(_CLASSES.get(nxt) or _gbnf_literal(nxt))
            i += 2
        elif c == "[":
            end = _class_end(body, i, pattern)
            out.append(body[i:end + 1])
            i = end + 1
        elif c == "(":
            if body.startswith("(?:", i):
                i += 3
            elif body.startswith("(?", i):
                raise NotDeterminable(f"regex {pattern!r}: {body[i:i + 3]!r} groups have no GBNF form here")
            else:
                i += 1
            out.append("(")
        elif c in ")|*+?":
            if c in "*+?" and body[i + 1:i + 2] in ("?", "+"):
                raise NotDeterminable(f"regex {pattern!r}: lazy or possessive quantifiers have no GBNF form")
            out.append(f" {c} " if c == "|" else c)
            i += 1
        elif c == "{" and re.match(r"\{\d+(,\d*)?\}", body[i:]):
            end = body.index("}", i)
            out.append(body[i:end + 1])
            i = end + 1
        elif c == ".":
            out.append("[^\\n]")
            i += 1
        else:
            out.append(_gbnf_literal(c))
            i += 1
    return "root ::= " + "".join(out)


def _class_end(body: str, start: int, pattern: str) -> int:
    i = start + 1 + (body[start + 1:start + 2] == "^")
    i += body[i:i + 1] == "]"
    while i < len(body) and body[i] != "]":
        if body[i] == "\\" and body[i + 1:i + 2] in ("d", "w", "s", "D", "W", "S"):
            raise NotDeterminable(f"regex {pattern!r}: \\{body[i + 1]} inside a class has no GBNF form here")
        i += 2 if body[i] == "\\" else 1
    if i >= len(body):
        raise NotDeterminable(f"regex {pattern!r}: an unclosed class")
    return i
