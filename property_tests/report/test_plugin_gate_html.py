"""The pytest plugin (through the example project, as a user runs it), the release gate with
JUnit XML, and the HTML report rendered in headless Chromium."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exactcheck.cli import main
from exactcheck.gate import read_config
from exactcheck.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "verifier_project"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _pytest_example(tmp_path: Path, *extra: str) -> tuple[int, list]:
    """Run the example project's own pytest; return its exit code and the JUnit test cases."""
    from junitparser import JUnitXml
    xml = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *extra],
                          cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=600)
    cases = [case for suite in JUnitXml.fromfile(str(xml)) for case in suite]
    return proc.returncode, cases


def _outcome(case) -> str:
    kinds = {type(r).__name__ for r in case.result}
    return "failed" if kinds & {"Failure", "Error"} else ("skipped" if "Skipped" in kinds else "passed")


@pytest.mark.long
@pytest.mark.parametrize("workers", [None, pytest.param("2", marks=pytest.mark.slow)], ids=["serial", "xdist_n2"])
def test_example_project_fails_exactly_the_planted_defect(tmp_path, workers):
    code, cases = _pytest_example(tmp_path, *(["-n", workers] if workers else []))
    assert code == 1
    by_outcome = {}
    for case in cases:
        by_outcome.setdefault(_outcome(case), []).append(case)
    failed = by_outcome.get("failed", [])
    assert failed, "the planted defect was not found"
    assert all("test_buggy_verifier[" in case.name for case in failed)
    assert not any("test_correct_verifier[" in c.name for c in failed)
    assert sum("test_correct_verifier[" in c.name for c in by_outcome["passed"]) >= 50
    for case in failed:
        message = "\n".join(r.text or r.message or "" for r in case.result)
        assert "law in world" in message and "total variation:" in message, message
    assert len(cases) == 2 * 73  # one test per check of each subject's quick audit


def test_adding_exactcheck_to_a_project_takes_at_most_five_lines():
    lines = [line for line in (EXAMPLE / "tests" / "test_exactness.py").read_text().splitlines() if line.strip()]
    assert len(lines) <= 5


@pytest.mark.long
def test_gate_on_the_example_exits_1_and_writes_junit(tmp_path, monkeypatch, capsys):
    from junitparser import JUnitXml
    monkeypatch.chdir(EXAMPLE)
    xml, data = tmp_path / "gate.xml", tmp_path / "gate.json"
    code = main(["gate", "--junit-xml", str(xml), "--json", str(data), "--quiet"])
    assert code == 1
    out = capsys.readouterr().out
    assert "buggy_verifier: FAILS" in out and "correct_verifier: passes" in out
    suites = {suite.name: suite for suite in JUnitXml.fromfile(str(xml))}
    assert set(suites) == {"correct_verifier", "buggy_verifier"}
    assert suites["correct_verifier"].failures == 0 and suites["correct_verifier"].errors == 0
    assert suites["buggy_verifier"].failures >= 1
    assert suites["correct_verifier"].tests == 73  # the quick plan: 13 step worlds x 5 laws (step_output the 5th) and the rest
    gate = json.loads(data.read_text())
    assert gate["passed"] is False
    assert [s["passed"] for s in gate["subjects"]] == [True, False]


@pytest.mark.long
def test_gate_exemptions_and_config_errors(tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.exactcheck]\nlevel = "quick"\n\n[[tool.exactcheck.subject]]\n'
                      'name = "m"\nverifier = "exactcheck.step.mutants:bonus_argmax"\nworlds = ["three_token"]\n'
                      'exempt = ["three_token"]\n')
    subjects = read_config(config)
    assert subjects[0].exempt == ("three_token",) and subjects[0].level == "quick"
    assert main(["gate", "--config", str(config), "--quiet"]) == 0  # its only failures are exempt
    config.write_text('[[tool.exactcheck.subject]]\nverifier = "a:b"\ngenerator = "c:d"\n')
    with pytest.raises(UsageError):
        read_config(config)
    assert main(["gate", "--config", str(config), "--quiet"]) == 2
    assert main(["gate", "--config", str(tmp_path / "missing.toml"), "--quiet"]) == 2
    # call_elements: verifiers only, checked before any audit runs
    config.write_text('[[tool.exactcheck.subject]]\nverifier = "exactcheck.contracts.reference_verifier:reference_verifier"\n'
                      'worlds = ["three_token"]\ncall_elements = "auto"\n')
    assert read_config(config)[0].options.call_elements == "auto"
    config.write_text('[[tool.exactcheck.subject]]\nverifier = "exactcheck.contracts.reference_verifier:reference_verifier"\n'
                      'call_elements = -5\n')
    assert main(["gate", "--config", str(config), "--quiet"]) == 2
    config.write_text('[[tool.exactcheck.subject]]\ngenerator = "reference-loop"\ncall_elements = 1000\n')
    with pytest.raises(UsageError, match="call_elements"):
        read_config(config)


def _failing_report(tmp_path) -> Path:
    assert main(["audit", "exactcheck.step.mutants:bonus_argmax", "--level", "quick", "--world", "three_token",
                 "--world", "random_v8_k4", "--world", "ctx_v4_l5_k4", "--no-stop-early", "--report", str(tmp_path),
                 "--quiet"]) == 1
    return next(tmp_path.glob("audit-exactcheck-step-mutants-bonus_argmax-quick-seed0-h*.json"))


def test_html_and_pr_comment_of_a_failing_audit(tmp_path, capsys):
    report = _failing_report(tmp_path)
    page = report.with_suffix(".html").read_text()
    # one expected-vs-observed plot per failed law: bonus_token and step_output (the joint law holds
    # the bonus) on the two step worlds, the sequence law on the context world
    assert page.count('class="law-plot failed-law"') == 5
    assert 'class="pvalue-plot"' in page and "Accepted-length distributions" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # self-contained
    capsys.readouterr()
    assert main(["render", str(report), "--format", "pr"]) == 0
    comment = capsys.readouterr().out
    assert comment.startswith("### ❌ exactcheck") and "`three_token/bonus_token`" in comment


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    page = _failing_report(tmp_path).with_suffix(".html")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1200,1400"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert 'data-rendered="ok"' in dom  # the load handler ran and no script error was raised
    assert dom.count('class="law-plot failed-law"') == 5
    shot = tmp_path / "failing-audit.png"  # the committed screenshots come from benchmarks/screenshots.py
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


@pytest.mark.long
def test_ctrl_c_during_the_gate_keeps_what_was_audited(tmp_path, monkeypatch, capsys):
    (tmp_path / "gate_interrupting_subject.py").write_text(
        "from exactcheck.contracts.reference_verifier import reference_verifier\n"
        "calls = [0]\n"
        "def verify(p, q, tokens, generator):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3:  # as if the user pressed Ctrl-C\n"
        "        raise KeyboardInterrupt\n"
        "    return reference_verifier(p, q, tokens, generator)\n")
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.exactcheck]\nlevel = "quick"\n\n'
                      '[[tool.exactcheck.subject]]\nname = "first"\nverifier = "exactcheck.contracts.reference_verifier:reference_verifier"\n'
                      'worlds = ["three_token"]\n\n'
                      '[[tool.exactcheck.subject]]\nname = "second"\nverifier = "gate_interrupting_subject:verify"\n'
                      'worlds = ["three_token", "random_v8_k4", "ctx_v4_l5_k4"]\n\n'
                      '[[tool.exactcheck.subject]]\nname = "third"\nverifier = "exactcheck.contracts.reference_verifier:reference_verifier"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    xml, data = tmp_path / "gate.xml", tmp_path / "gate.json"
    code = main(["gate", "--config", str(config), "--junit-xml", str(xml), "--json", str(data), "--quiet"])
    captured = capsys.readouterr()
    assert code == 130 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "interrupted while auditing second" in captured.err
    gate = json.loads(data.read_text())
    assert gate["interrupted"] is True and gate["passed"] is False
    assert [s["name"] for s in gate["subjects"]] == ["first", "second"]
    assert gate["subjects"][1]["audit"]["budget"]["interrupted"] is True
    assert "first" in xml.read_text() and "third" not in xml.read_text()


@pytest.mark.long
def test_audit_tests_takes_any_kind_with_a_plan(tmp_path):
    """``audit_tests(kind, subject)``: one reported test per check of the kind's plan; a tree
    verifier's, here, and a tree mutant's failing."""
    from junitparser import JUnitXml
    (tmp_path / "test_trees.py").write_text(
        "from exactcheck.pytest_plugin import audit_tests\n"
        "test_tree = audit_tests('tree', 'tree-reference:multi_round', worlds=['tree_iid_v3_3x1'])\n"
        "test_chain = audit_tests('tree', 'tree-mutant:tree_read_as_chain', worlds=['tree_iid_v3_3x1'])\n")
    xml = tmp_path / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
                           "test_trees.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    cases = {case.name: _outcome(case) for suite in JUnitXml.fromfile(str(xml)) for case in suite}
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert {name: outcome for name, outcome in cases.items() if name.startswith("test_tree[")} == {
        "test_tree[tree_iid_v3_3x1/sequence]": "passed", "test_tree[tree_iid_v3_3x1/first_token]": "passed",
        "test_tree[tree_iid_v3_3x1/step_law@multi_round]": "passed"}
    assert any(name.startswith("test_chain[") and outcome == "failed" for name, outcome in cases.items())
