"""The command: exit codes, reports that round-trip, subjects importable from the cwd."""
import json
import textwrap

import pytest

from exactcheck.cli import main
from exactcheck.report.json_md import audit_from_json, audit_to_json, render_audit_markdown

REFERENCE = "exactcheck.step.reference:reference_verifier"


def test_passing_audit_exits_0_and_writes_reports(tmp_path, capsys):
    code = main(["audit", REFERENCE, "--level", "quick", "--world", "three_token",
                 "--report", str(tmp_path), "--quiet"])
    assert code == 0
    data = json.loads((tmp_path / "audit-exactcheck-step-reference-reference_verifier.json").read_text())
    assert data["schema"] == "exactcheck.audit/1" and data["summary"]["passed"]
    assert len(data["verdicts"]) == 4
    md = (tmp_path / "audit-exactcheck-step-reference-reference_verifier.md").read_text()
    assert "PASSED" in md and "three_token/correction_token" in md
    assert "PASSED" in capsys.readouterr().out


def test_defect_exits_1_with_a_readable_message(capsys):
    code = main(["audit", "exactcheck.step.mutants:bonus_argmax", "--level", "quick",
                 "--world", "three_token", "--seed", "5", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "bonus_token law in world three_token: defect" in out
    assert "smallest TV detectable at power 0.9" in out
    assert "reproduce: exactcheck audit exactcheck.step.mutants:bonus_argmax --level quick --seed 5" in out


@pytest.mark.parametrize("argv,words", [
    (["audit", "no_colon_here"], "MODULE:CALLABLE"),
    (["audit", "no_such_module_xyz:f"], "cannot import"),
    (["audit", "exactcheck.step.reference:missing"], "no attribute"),
    (["audit", "exactcheck.step.reference:__doc__"], "not callable"),
    (["audit", REFERENCE, "--alpha", "1.5"], "alpha"),
    (["audit", REFERENCE, "--world", "atlantis"], "unknown world"),
    (["audit", REFERENCE, "--device", "cuda:7"], "not available"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert words in capsys.readouterr().err


def test_subject_from_the_current_directory_and_crash_everywhere_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_verifier.py").write_text(textwrap.dedent("""
        from exactcheck.step.reference import reference_verifier as good

        def broken(target_probs, draft_probs, draft_tokens, generator):
            raise ValueError("boom")
    """))
    monkeypatch.chdir(tmp_path)
    assert main(["audit", "my_verifier:good", "--level", "quick", "--world", "one_hot", "--quiet"]) == 0
    assert main(["audit", "my_verifier:broken", "--level", "quick", "--world", "one_hot", "--quiet"]) == 2
    assert "ValueError: boom" in capsys.readouterr().out
    # with the deterministic stages too: still "could not be driven", and no property claims to hold
    assert main(["audit", "my_verifier:broken", "--level", "quick", "--world", "one_hot",
                 "--world", "properties", "--quiet"]) == 2
    out = capsys.readouterr().out
    assert "properties/contract" in out and "held on" not in out
    assert "not judged: every call crashed" in out


def test_report_round_trips_and_renders(tmp_path):
    from exactcheck import run_audit
    from exactcheck.step.mutants import mutant

    result = run_audit(mutant("no_bonus_token"), subject_name="m:no_bonus", level="quick",
                       worlds=["p_equals_q", "three_token"], progress=False, stop_early=False)
    data = json.loads(json.dumps(audit_to_json(result)))
    again = audit_from_json(data)
    assert again.verdicts == result.verdicts
    md = render_audit_markdown(data)
    assert "FAILED" in md and "## Exactness findings" in md and "p_equals_q/accepted_length" in md
    # certificates only on passing statistical checks
    assert all(v.tv_certificate is None for v in result.failed)
    assert any(v.tv_certificate is not None for v in result.verdicts if not v.outcome.failed)


def test_selftest_command_prints_the_detection_table(tmp_path, capsys):
    code = main(["selftest", "--level", "quick", "--mutant", "trust_draft", "--mutant",
                 "accept_on_equal_uniform", "--report", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "trust_draft" in out and "detected" in out and "properties/no_forbidden_token" in out
    data = json.loads((tmp_path / "selftest-quick.json").read_text())
    assert data["passed"] and [r["detected"] for r in data["mutants"]] == [True, True]
    assert main(["render", str(tmp_path / "selftest-quick.json")]) == 0
