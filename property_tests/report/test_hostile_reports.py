"""Injection: text that comes from the subject (its name, its exception messages and frames, the
reproduce lines and evidence built from them, the environment) reaches every renderer as data.

One poisoned audit (a real quick audit of a subject whose exception message carries code
fences, an <img onerror> tag, a "# Injected heading" line, backticks, pipes, ANSI escapes and
other control characters, under a name with backticks and pipes; plus verdicts of every shape
with the same text in their check names, frames, cells and reproducers) is rendered by every
entry of ``RENDERERS``, the JUnit XML and the terminal renderers: no fence breaks, no tag or
heading is injected, tables keep their columns, the XML parses, the terminal gets no raw ESC.
"""
import dataclasses
import json
import re
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from exactcheck import run_audit
from exactcheck.gate import GateResult, GateSubject
from exactcheck.options import AuditOptions, Category, CheckKind, AuditKind
from exactcheck.reachability import Reachability
from exactcheck.report.cost_report import COST_SCHEMA, cost_headline
from exactcheck.report.escaping import fence, inline_code, md_cell, md_text, terminal_text, visible, xml_text
from exactcheck.report.formats import RENDERERS
from exactcheck.report.json_md import (AUDIT_SCHEMA, SELFTEST_SCHEMA, audit_from_json, audit_to_json,
                                       selftest_to_json)
from exactcheck.report.served_cost_report import SERVED_COST_SCHEMA, served_cost_headline
from exactcheck.report.junit import junit_xml
from exactcheck.report.terminal import (audit_summary, gate_lines, gate_verdict, interrupted_line, selftest_footer,
                                        selftest_row)
from exactcheck.report.verdict import (CellDeviation, Evidence, FindingEvidence, LawEvidence, Outcome,
                                       TotalVariation, Verdict)

# real cost reports (records cut to 8) of `exactcheck cost` and of the served cost audit
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CONTROLS = "\x00\x07\x08\x0b\x0c\x1f\x7f\x9b\u202e\r"
# what an exception message of a hostile (or merely unlucky) subject may say
EVIL = ("boom\n```\n````\n~~~\n<img src=x onerror=alert(1)>\n# Injected heading\n| a | b | c |\n"
        "`tick` ``double`` ```triple```\n[click](javascript:alert(1)) ![pixel](http://x/p.png) **bold** _em_ "
        "$x$ ~~gone~~ &lt;script&gt; </details><details open>\n---\n> quoted\n1. listed\n"
        "\x1b[31mCUDA error\x1b[0m" + CONTROLS + "end")
LINE = "<img src=x onerror=alert(1)> `a|b` \x1b[1m|bold|\x1b[0m \ud800 \ufffe" + CONTROLS
NAME = "evil`mod|x``|`:f <img src=x onerror=alert(1)>"
CHECK = "one_hot/`law|x`<img src=x onerror=alert(1)>\n# Injected heading"
# raw HTML our own renderers write into Markdown; anything else is injected
OWN_TAGS = {"details", "summary", "br"}
# what a terminal or an XML file must never receive raw
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
XML_INVALID = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def hostile(target_probs, draft_probs, draft_tokens, generator):
    raise RuntimeError(EVIL)


def _finding(check: str, outcome: Outcome, kind: CheckKind, category: Category = Category.EXACTNESS,
             **evidence) -> Verdict:
    world, _, law = check.partition("/")
    return Verdict(check=check, world=world, law=law, condition=LINE, outcome=outcome, summary=EVIL, samples=10,
                   seed=0, reproduce=f"exactcheck audit {NAME} --world {LINE}", kind=kind,
                   evidence=FindingEvidence(**evidence), category=category)


@pytest.fixture(scope="module")
def poisoned() -> dict:
    """The JSON of one audit with subject text in every field a renderer shows."""
    result = run_audit(hostile, subject_name=NAME, level="quick", worlds=["one_hot"], progress=False)
    assert any(v.outcome is Outcome.CRASHED and "```" in v.summary for v in result.verdicts)
    cells = tuple(CellDeviation(f"{LINE} {i}", 100 + i, 50.0) for i in range(4))
    law = Verdict(check=CHECK, world="one_hot", law=EVIL, condition=LINE, outcome=Outcome.DEFECT, summary=EVIL,
                  samples=1000, seed=0, reproduce=f"exactcheck audit {NAME} --world `one_hot`|x", kind=CheckKind.LAW,
                  evidence=LawEvidence(Evidence.FIXED_BUDGET, 12.5, LINE, 3, 1e-9, 1e-8, 1e-4,
                                       TotalVariation(0.2, (0.1, 0.3), 0.05), None, None, cells, cells,
                                       fits=((LINE, 0.5),)))
    reach = Reachability(kind="structural", probability=None, detail=EVIL)
    extra = (
        law,
        _finding("properties/`x`|y", Outcome.DEFECT, CheckKind.PROPERTY, pvalue=0.0, reachability=reach,
                 reproducer={"case": {"k": LINE, LINE: 3}, "value": EVIL, "forced_elements": [1, 2]},
                 traceback=(f"{LINE}:1 in f", EVIL)),
        _finding("properties/same_seed|`x`", Outcome.DEFECT, CheckKind.PROPERTY, Category.REPRODUCIBILITY,
                 pvalue=0.0),
        _finding("one_hot/cache|<b>", Outcome.EXACT, CheckKind.CACHE_INVARIANT, pvalue=1.0),
        _finding("inputs/`invalid`|", Outcome.INCONCLUSIVE, CheckKind.INPUTS),
        _finding("one_hot/edge|#", Outcome.UNREACHABLE, CheckKind.PROPERTY, reachability=reach),
    )
    result = dataclasses.replace(result, verdicts=result.verdicts + extra, device=LINE)
    data = json.loads(json.dumps(audit_to_json(result)))
    data["environment"].update(torch=LINE, exactcheck=EVIL, transformers=LINE)
    for v in data["verdicts"]:
        v["traceback"] = [*v["traceback"], EVIL]
    return data


@pytest.fixture(scope="module")
def audit(poisoned):
    return audit_from_json(poisoned)


@pytest.fixture(scope="module")
def reports(poisoned, audit) -> dict:
    """One poisoned report of every schema."""
    selftest = selftest_to_json(types.SimpleNamespace(
        level="quick", seed=0, alpha=1e-3, passed=False, undetected=[NAME], reference=audit,
        mutants=[(NAME, EVIL, audit), (f"m:{LINE}", LINE, audit)]))
    cost = json.loads((FIXTURES / "cost-tiny-llama-transformers-assisted.json").read_text())
    cost["generator"]["name"] = NAME
    cost["model"] = EVIL
    cost["reproduce"] = f"exactcheck cost {NAME} --model {LINE}"
    cost["expected_note"] = EVIL
    cost["denominators"].update(time=EVIL, hardware=LINE, device=LINE, precision=LINE, policy=EVIL, torch=LINE)
    cost["cost"]["peak_memory_bytes"]["scope"] = EVIL
    for key in ("speedup", "fraction_slower", "accepted_per_round_mean"):
        cost["cost"][key]["method"] = EVIL
    cost["exactness"] = {"kind": LINE, "passed": False, "checks": 2, "failed": [CHECK, NAME], "tv": None}
    reports = {AUDIT_SCHEMA: poisoned, SELFTEST_SCHEMA: selftest, COST_SCHEMA: cost,
               SERVED_COST_SCHEMA: _served_cost()}
    assert set(reports) == set(RENDERERS)
    return reports


def _served_cost() -> dict:
    """The served cost report with what the servers said (URLs, declared settings, an error) hostile."""
    served = json.loads((FIXTURES / "cost-llama-server-served.json").read_text())
    for role in ("audited", "reference"):
        served["servers"][role].update(url=LINE, endpoint=EVIL, declared_settings={NAME: EVIL, "x": LINE})
    served["settings"]["samplings"] = [EVIL, LINE]
    for group in [served["summary"]["all"]] + served["summary"]["by_setting"]:
        group["setting"] = CHECK
        group["latency_ratio"]["method"] = EVIL
        group["audited"]["speculation"]["source"] = EVIL
    served["stopped"] = {"reason": "server", "role": LINE, "server": NAME, "error": EVIL, "answered": 3,
                         "requests": [f"curl -s {LINE} -d '{EVIL}'"]}
    served["order"] = EVIL
    served["denominators"].update(time=EVIL, client=LINE, python=LINE, exactcheck=LINE)
    served["traffic"] = EVIL
    served["reproduce"] = f"exactcheck cost {NAME} --reference {LINE}"
    return served


@pytest.fixture(scope="module")
def gate(audit) -> list:
    options = AuditOptions.build(level="quick")
    exempt = next(v.check for v in audit.failed if v.kind is CheckKind.PROPERTY)
    return [GateResult(GateSubject(name=NAME, kind=AuditKind.VERIFIER, target="m:f", options=options), audit),
            GateResult(GateSubject(name=LINE, kind=AuditKind.VERIFIER, target="m:f", options=options,
                                   exempt=(exempt,)), audit)]


# ---- a small reader of the Markdown our renderers write ----

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _blocks(text: str) -> tuple[list[str], list[str]]:
    """(lines outside fenced code blocks, contents of the fenced blocks); every fence closed."""
    outside, fenced, current, opening = [], [], [], None
    for line in text.split("\n"):
        match = _FENCE.match(line)
        if opening is None:
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                opening, current = match.group(1), []
            else:
                outside.append(line)
        elif match and match.group(1)[0] == opening[0] and len(match.group(1)) >= len(opening) \
                and not match.group(2).strip():
            fenced.append("\n".join(current))
            opening = None
        else:
            current.append(line)
    assert opening is None, "a fenced block is never closed"
    return outside, fenced


def _strip_inline(line: str) -> str:
    """The line without backslash escapes and code spans: what could still be markup."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line) and line[i + 1] in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~":
            out.append("E")
            i += 2
        elif line[i] == "`":
            run = re.match("`+", line[i:]).group()
            close = re.compile(f"(?<!`){run}(?!`)").search(line, i + len(run))
            if close:
                out.append("C")
                i = close.end()
            else:
                out.append(run)
                i += len(run)
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def _cells(row: str) -> int:
    """Cells of a GitHub table row: split at each '|' not preceded by a backslash."""
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return len(re.split(r"(?<!\\)\|", row))


def assert_markdown_safe(text: str, fences: int) -> list[str]:
    """No fence broken (``fences`` blocks, all closed), no tag or heading injected, table rows with
    their header's columns, headings on one line. Returns the fenced blocks."""
    outside, fenced = _blocks(text)
    assert len(fenced) == fences, f"{len(fenced)} fenced blocks, expected {fences}"
    for line in outside:
        bare = _strip_inline(line)
        tags = {name.lower() for name in re.findall(r"</?([A-Za-z][A-Za-z0-9-]*)", bare)}
        assert tags <= OWN_TAGS, f"raw HTML {tags - OWN_TAGS} in {line!r}"
        assert "<img" not in bare.lower() and not re.match(r" {0,3}#+\s*Injected", line), line
        assert not re.search(r"\]\(", bare), f"a link in {line!r}"
        assert not RAW_CONTROL.search(line), line
    for i, line in enumerate(outside):
        if re.match(r" {0,3}#{1,6}(\s|$)", line):
            assert i + 1 == len(outside) or outside[i + 1] == "", f"heading broken over lines: {line!r}"
        if i + 1 < len(outside) and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", outside[i + 1].strip()) \
                and line.startswith("|"):
            columns = _cells(line)
            assert _cells(outside[i + 1]) == columns
            j = i + 2
            while j < len(outside) and outside[j].startswith("|"):
                assert _cells(outside[j]) == columns, f"row of {_cells(outside[j])} cells, not {columns}: {outside[j]!r}"
                j += 1
    return fenced


def _expected_fences(data: dict, form: str) -> int:
    if data["schema"] in (COST_SCHEMA, SERVED_COST_SCHEMA):
        return 0
    audit = audit_from_json(data if data["schema"] == AUDIT_SCHEMA else data["reference"])
    failed = sum(v.outcome.failed for v in audit.verdicts)
    return (1 if audit.failed else 0) if form == "pr" else failed


def test_every_markdown_form_keeps_its_structure_with_subject_text_everywhere(reports, audit):
    rendered = 0
    for schema, forms in RENDERERS.items():
        for form, render in forms.items():
            text = render(reports[schema])
            if form == "html":
                assert "<img" not in text.lower(), f"{schema} {form}"
                continue
            fenced = assert_markdown_safe(text, _expected_fences(reports[schema], form))
            if schema == AUDIT_SCHEMA:  # the finding blocks hold the exception text, made visible
                assert set(fenced) <= {terminal_text(v.describe()) for v in audit.verdicts}
                assert any("\\x1b[31mCUDA error\\x1b[0m" in block and "<img src=x" in block for block in fenced)
            rendered += 1
    assert rendered == sum(form != "html" for forms in RENDERERS.values() for form in forms) >= 4


def test_the_pull_request_comment_keeps_the_subject_and_its_finding_in_place(poisoned, audit):
    comment = RENDERERS[AUDIT_SCHEMA]["pr"](poisoned)
    outside, (finding,) = _blocks(comment)
    assert finding == terminal_text(audit.ranked_failures()[0].describe())
    assert outside[0] == f"### ❌ exactcheck audit: {inline_code(NAME)} FAILS"
    assert [line for line in outside if "details>" in line] == ["<details><summary>strongest finding</summary>",
                                                                "</details>"]


def test_the_markdown_parses_as_written(reports, audit):
    """A CommonMark parser with GitHub tables sees the same document: the subject's heading whole,
    one table row per check with the check's name in its first cell, the exception text in code
    blocks only, no HTML but our own."""
    markdown_it = pytest.importorskip("markdown_it")
    parser = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    one_line = lambda s: terminal_text(" ".join(str(s).split()))  # noqa: E731
    for schema, forms in RENDERERS.items():
        for form, render in forms.items():
            if form == "html":
                continue
            tokens = parser.parse(render(reports[schema]))
            for token in tokens:
                if token.type == "html_block" or token.type == "inline":
                    html = [token] if token.type == "html_block" else [c for c in token.children
                                                                       if c.type == "html_inline"]
                    for piece in html:
                        tags = {t.lower() for t in re.findall(r"</?([A-Za-z][A-Za-z0-9-]*)", piece.content)}
                        assert tags <= OWN_TAGS, (schema, form, piece.content)
                    assert not any(c.type in ("link_open", "image", "em_open", "s_open")
                                   for c in token.children or ()), (schema, form, token.content)
            headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
            assert not any(h.lstrip("\\").startswith("Injected") for h in headings)
            if schema == AUDIT_SCHEMA and form == "markdown":
                first = "".join(c.content for c in tokens[1].children)
                assert first == f"exactcheck audit {one_line(NAME)}: FAILED"
                table = [i for i, t in enumerate(tokens) if t.type == "tr_open"][1:]  # rows after the header
                names = ["".join(" " if c.type == "html_inline" else c.content for c in tokens[i + 2].children)
                         for i in table]
                assert [" ".join(n.split()) for n in names] == [one_line(v.check) for v in audit.verdicts]
                fences = {t.content for t in tokens if t.type == "fence"}
                assert fences == {terminal_text(v.describe()) + "\n" for v in audit.verdicts if v.outcome.failed}


def test_the_junit_xml_parses_and_carries_no_control_character(gate, audit, tmp_path):
    from junitparser import Error, Failure, JUnitXml, Skipped
    text = junit_xml(gate)
    assert not XML_INVALID.search(text)
    root = ET.fromstring(text.encode("utf-8"))
    assert [s.get("name") for s in root] == [xml_text(NAME), xml_text(LINE)]
    path = tmp_path / "gate.xml"
    path.write_text(text, encoding="utf-8")
    suites = list(JUnitXml.fromfile(str(path)))
    assert [case.name for case in suites[0]] == [xml_text(v.check) for v in audit.verdicts]
    kinds = {type(r) for suite in suites for case in suite for r in case.result}
    assert {Error, Failure, Skipped} <= kinds
    messages = [r.message + (r.text or "") for suite in suites for case in suite for r in case.result]
    assert any("\\x1b[31mCUDA error\\x1b[0m" in m and "<img src=x" in m for m in messages)
    assert suites[1].skipped >= 1  # the exempt finding


def test_the_terminal_gets_no_raw_escape(gate, audit, reports):
    texts = [audit_summary(audit, passing=True), selftest_row(NAME, audit, reference=False),
             selftest_row(NAME, audit, reference=True), gate_lines(gate), gate_verdict(gate),
             interrupted_line(audit, f"reports/{NAME}{LINE}.json"), cost_headline(reports[COST_SCHEMA]),
             served_cost_headline(reports[SERVED_COST_SCHEMA]),
             selftest_footer(types.SimpleNamespace(mutants=[1], undetected=[], reference=audit), 1.0)]
    for text in texts:
        assert not RAW_CONTROL.search(text), repr(text)
    assert "\\x1b[31mCUDA error\\x1b[0m" in texts[0] and "\\x1b[31mCUDA error\\x1b[0m" in texts[3]
    assert texts[0].startswith(f"exactcheck audit {terminal_text(NAME)}: FAILED on ")


# ---- the helpers ----

def test_fence_is_longer_than_every_backtick_run_inside():
    assert fence("plain") == "```\nplain\n```"
    text = "a\n```\n`````\nb ```` c\n~~~"
    block = fence(text, "text")
    assert block.startswith("``````text\n") and block.endswith("\n``````")
    outside, (inner,) = _blocks("before\n\n" + block + "\n\nafter")
    assert inner == text and outside == ["before", "", "", "after"]
    assert fence("x\x1b[31m\r\ny\x07") == "```\nx\\x1b[31m\ny\\x07\n```"


def test_inline_code_delimiter_outlasts_the_backticks_inside():
    assert inline_code("three_token/bonus_token") == "`three_token/bonus_token`"
    assert inline_code("a`b") == "``a`b``"
    assert inline_code("a``b`") == "``` a``b` ```"
    assert inline_code("`x") == "`` `x ``"
    assert inline_code(" a ") == "`  a  `"
    assert inline_code("a\nb|c") == "`a b|c`"
    assert inline_code("a|b", table=True) == "`a\\|b`"
    assert inline_code("\x1b[0m") == "`\\x1b[0m`"


def test_md_text_and_md_cell_escape_what_starts_markup_and_leave_names_alone():
    for name in ("three_token/bonus_token", "p_equals_q/accepted_length", "mod:func", "exponential_",
                 "torch 2.13.0+cpu", "row 0 emitted [1, 1, 1]", "PR #41", "a - b", "level quick, seed 0"):
        assert md_text(name) == md_cell(name) == name
    assert md_text("# Injected heading") == "\\# Injected heading"
    assert md_text("<img src=x onerror=alert(1)>") == "\\<img src=x onerror=alert(1)>"
    assert md_text("a|b`c`*d*") == "a\\|b\\`c\\`\\*d\\*"
    assert md_text("_em_ __init__") == "\\_em_ \\_\\_init__"
    assert md_text("see [x](javascript:1)") == "see [x\\](javascript:1)"
    assert md_text("[x]: http://x") == "\\[x\\]: http://x"  # no link definition
    assert md_text("1. one\n> two\n- three\n---") == "1\\. one \\> two \\- three \\---"
    assert md_text("&lt; & ok ~~s~~ $x$") == "\\&lt; & ok \\~\\~s\\~\\~ \\$x\\$"
    assert md_text("a \\ b") == "a \\\\ b"
    assert md_text("x\x1b[31m\x00") == "x\\\\x1b[31m\\\\x00"  # renders as x\x1b[31m\x00
    assert md_cell("a\nb | c\r\nd") == "a<br>b \\| c<br>d"
    assert md_cell("<b>x</b>") == "\\<b>x\\</b>"


def test_xml_text_removes_what_xml_forbids_and_keeps_the_rest():
    forbidden = [chr(c) for c in range(0x20) if chr(c) not in "\t\n\r"] + ["\ud800", "\udfff", "\ufffe", "\uffff"]
    for char in forbidden:
        assert xml_text(f"a{char}b") == f"a{visible(char)}b"
        ET.fromstring(f"<x a='{xml_text(char)}'>{xml_text(char)}</x>".encode("utf-8"))
    assert xml_text("\x1b[31mCUDA error\x1b[0m") == "\\x1b[31mCUDA error\\x1b[0m"
    plain = "tab\tline\nreturn\r é ≤ 😀 <&> \ud7ff \ue000"
    assert xml_text(plain) == plain


def test_terminal_text_makes_controls_visible_and_leaves_plain_text():
    assert terminal_text("\x1b[31mred\x1b[0m\x07\x00") == "\\x1b[31mred\\x1b[0m\\x07\\x00"
    assert terminal_text("over\rwrite \x9b2J \u202eevil") == "over\\x0dwrite \\x9b2J \\u202eevil"
    assert terminal_text("a\r\nb") == "a\nb"
    plain = "exactcheck audit m:f: FAILED on three_token/bonus_token (defect)\n\tindented é ≤ ✅"
    assert terminal_text(plain) == plain


_TEXT = st.text(alphabet=st.sampled_from(list("ab1 _*`\\[]()<>|#&;!~$-+=.:/'x{}\n\té≥") + ["\x1b", "\u0301"]),
                max_size=16)


@settings(max_examples=300, deadline=None)
@given(_TEXT)
def test_escaped_text_renders_back_to_itself(text):
    """What a CommonMark parser with GitHub tables shows is the text (on one line, controls
    visible): in a paragraph, a list item, a heading, a code span and a table cell."""
    markdown_it = pytest.importorskip("markdown_it")
    parser = markdown_it.MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    shown = lambda tokens: "".join(c.content if c.type in ("text", "code_inline") else f"<{c.type}>"  # noqa: E731
                                   for t in tokens if t.type == "inline" for c in t.children)
    words = lambda s: " ".join(s.split())  # noqa: E731
    expected = words(terminal_text(text))
    for source, opening, around in (
            (f"x {md_text(text)} y", "paragraph_open", "x {} y"), (f"- a {md_text(text)}", "bullet_list_open", "a {}"),
            (f"### a {md_text(text)}", "heading_open", "a {}"), (f"x {inline_code(text)} y", "paragraph_open", "x {} y")):
        tokens = parser.parse(source)
        assert tokens[0].type == opening and sum(t.type == "inline" for t in tokens) == 1, source
        assert words(shown(tokens)) == words(around.format(expected)), source
    for cell in (md_cell(text), inline_code(text, table=True)):
        tokens = parser.parse(f"| h | k |\n|---|---|\n| {cell} | z |")
        assert sum(t.type == "td_open" for t in tokens) == 2
        row = [t for t in tokens if t.type == "inline"][2:3]
        assert words(shown(row).replace("<html_inline>", " ")) == expected, cell
