"""Escaping for every renderer: text that comes from the subject (its name, its exception
messages and frames, the reproduce lines and evidence strings built from them, the environment)
is data, never markup.

- ``fence``: a fenced code block whose fence is longer than any run of backticks inside
  (CommonMark: a closing fence is at least as long as the opening one), so no line of the text
  can close it.
- ``inline_code``: a code span whose delimiter is longer than any run of backticks inside, padded
  with a space where the text starts or ends with a backtick (or with a space); on one line;
  ``table=True`` also escapes ``|`` (GitHub tables split on it even inside code spans).
- ``md_text``: ordinary Markdown text on one line, with every character that starts markup
  escaped (emphasis, code, links, HTML tags, tables, headings and other line-start blocks).
- ``md_cell``: ``md_text`` for a table cell, line breaks as ``<br>``.
- ``xml_text``: characters XML 1.0 does not allow (below 0x20 other than tab, LF and CR, lone
  surrogates, U+FFFE and U+FFFF) and the discouraged C1 controls written visibly (ESC as ``\\x1b``).
- ``terminal_text``: control characters other than newline and tab (ANSI escapes, bells,
  carriage returns, C1 controls, bidirectional overrides) written visibly.

Visible means the Python escape of the character (``\\x1b``, ``\\x00``, ``\\u202e``): a coloured
CUDA error reads ``\\x1b[31mCUDA error\\x1b[0m``. Text without such characters comes back
unchanged from ``terminal_text`` and ``xml_text``, and a plain name (``three_token/bonus_token``,
``mod:func``) unchanged from ``inline_code``, ``md_text`` and ``md_cell``.
"""
from __future__ import annotations

import re

__all__ = ["fence", "inline_code", "md_text", "md_cell", "xml_text", "terminal_text", "visible"]

# bidirectional formatting characters (text that displays in another order than it reads)
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# what a terminal (and a rendered Markdown page) must not receive raw: C0 controls but tab and
# newline, DEL, C1 controls (0x9b is a one-byte CSI), line/paragraph separators, bidi overrides,
# lone surrogates (printing one raises UnicodeEncodeError)
_TERMINAL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029" + _BIDI + "\ud800-\udfff]")
# what XML 1.0 does not allow (plus the discouraged DEL and C1 controls)
_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff]")
_BACKTICKS = re.compile("`+")
_NEWLINE = re.compile("\r\n|\r|\n")
# characters that start inline markup anywhere: escapes, code, emphasis, strikethrough, HTML
# tags and autolinks, table cells, GitHub math
_INLINE = re.compile(r"([\\`*~<|$])")
# a link or image needs "](" (or "][", or a definition "[x]: " at a line's start): escaping that
# "]" is enough, and "[4, -1, -1]" stays as it is
_LINK = re.compile(r"\](?=[(\[:])")
# '#' opens a heading at a line's start and closes one as the last run after a blank ("PR #41"
# stays as it is); '&' starts an entity reference only before a name and ';'
_HASH = re.compile(r"^(\s*)(#)|(?<=\s)(#+[ \t]*)$")
_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")
# block starts at the beginning of a line: a quote, a link definition, a list item, a setext
# underline or thematic break, an ordered list item ("1. ", not "2.13.0")
_LINE_START = re.compile(r"^(\s*)(>|\[|[-+](?=\s|$)|[-=]+[ \t]*$)")
_ORDERED = re.compile(r"^(\s*\d{1,9})([.)])(?=\s|$)")
_UNDERSCORES = re.compile("_+")


def visible(char: str) -> str:
    """The Python escape of one character: ``\\x1b``, ``\\x00``, ``\\u202e``."""
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _visible(match: re.Match) -> str:
    return visible(match.group())


def terminal_text(text) -> str:
    """``text`` with control characters other than newline and tab written visibly (``\\x1b``;
    a CR LF line end becomes LF, a lone CR ``\\x0d``)."""
    return _TERMINAL.sub(_visible, str(text).replace("\r\n", "\n"))


def xml_text(text) -> str:
    """``text`` with what XML 1.0 does not allow (and the C1 controls) written visibly: the result
    is always valid character data for an attribute or an element."""
    return _XML.sub(_visible, str(text))


def _one_line(text, newline: str = " ") -> str:
    return terminal_text(_NEWLINE.sub(newline, str(text)))


def _longest_backtick_run(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def fence(text, info: str = "") -> str:
    """``text`` as a fenced code block (no trailing newline): the fence has more backticks than
    any run inside ``text``, at least three; control characters are written visibly."""
    body = terminal_text(text)
    marks = "`" * max(3, _longest_backtick_run(body) + 1)
    return f"{marks}{info}\n{body}\n{marks}"


def inline_code(text, table: bool = False) -> str:
    """``text`` as one code span on one line (line breaks become spaces, as CommonMark renders
    them); ``table``: ``|`` escaped, for a table cell."""
    body = _one_line(text)
    marks = "`" * (_longest_backtick_run(body) + 1)
    if not body or body.startswith("`") or body.endswith("`") or (
            body.startswith(" ") and body.endswith(" ") and body.strip(" ")):
        body = f" {body} "  # CommonMark strips one space from each side of a padded span
    if table:
        body = body.replace("|", "\\|")
    return f"{marks}{body}{marks}"


_ANY = ("space", "punctuation", "alphanumeric")  # what may stand beside the text where it is put


def _kind(char: str) -> str:
    return "space" if char.isspace() else "alphanumeric" if char.isalnum() else "punctuation"


def _may_open(before: str, after: str) -> bool:
    """Whether a run of '_' between characters of these kinds can open emphasis (CommonMark:
    left-flanking, and not right-flanking or after punctuation)."""
    left = after != "space" and (after != "punctuation" or before != "alphanumeric")
    right = before != "space" and (before != "punctuation" or after != "alphanumeric")
    return left and (not right or before == "punctuation")


def _underscores(line: str, before: tuple[str, ...], after: tuple[str, ...]) -> str:
    """Each run of '_' escaped where it could open emphasis, ``before`` and ``after`` being the
    kinds of character that may stand beside the line. A run that cannot open makes no emphasis,
    so intraword names (p_equals_q, exponential_) stay as they are; a line of only '_' and
    blanks (a thematic break) is escaped whole."""
    if line.count("_") >= 3 and not line.strip(" \t_"):
        return line.replace("_", "\\_")

    def escape(match: re.Match) -> str:
        start, end = match.span()
        kinds_before = (_kind(line[start - 1]),) if start else before
        kinds_after = (_kind(line[end]),) if end < len(line) else after
        if any(_may_open(b, a) for b in kinds_before for a in kinds_after):
            return match.group().replace("_", "\\_")
        return match.group()

    return _UNDERSCORES.sub(escape, line)


def _md(text, newline: str) -> str:
    """Each line of ``text`` escaped (control characters first made visible), joined by ``newline``."""
    lines = [terminal_text(line) for line in _NEWLINE.split(str(text))]
    joint = (_kind(newline[-1]),), (_kind(newline[0]),)  # what stands after / before a joint
    out = []
    for i, line in enumerate(lines):
        line = _ENTITY.sub(r"\\&", _LINK.sub(r"\\]", _INLINE.sub(r"\\\1", line)))
        line = _HASH.sub(r"\1\\\2\3", line)
        line = _underscores(line, joint[0] if i else _ANY, joint[1] if i < len(lines) - 1 else _ANY)
        out.append(_ORDERED.sub(r"\1\\\2", _LINE_START.sub(r"\1\\\2", line)))
    return newline.join(out)


def md_text(text) -> str:
    """``text`` as ordinary Markdown on one line: line breaks become spaces, and every character
    that would start markup (``\\ ` * ~ < | $``, a ``_`` that could open emphasis, the ``]`` of a
    link, ``#`` of a heading, ``&`` of an entity, a block start such as ``>`` or ``-`` at the
    beginning) is backslash-escaped, so no heading, tag, link, emphasis or table cell can be
    injected."""
    return _md(text, " ")


def md_cell(text) -> str:
    """``md_text`` for a table cell: ``|`` escaped, line breaks as ``<br>``, ``<``, ``>`` and
    ``&`` unable to form a tag or an entity."""
    return _md(text, "<br>")
