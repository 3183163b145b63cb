"""Ctrl-C (or SIGTERM, which the command turns into it) in the middle of an audit of any kind: the
run core (``exactcheck.audit_run``) keeps the verdicts it has, gives every check it did not reach a
"not run" verdict, writes the partial report marked incomplete, and the command exits 130. The
step and e2e audits have their own tests (test_cli_and_report, test_end_to_end); here the tree and
tree-loop audits, which had no interrupt handling before the run core."""
import json
import textwrap

import pytest

from exactcheck.cli import main

SUBJECTS = {
    "tree": """
        from exactcheck.tree.subjects import load_tree_verifier
        inner = load_tree_verifier("tree-reference:multi_round")
        calls = [0]
        def verify(*args, **kwargs):
            calls[0] += 1
            if calls[0] == {at}:  # as if the user pressed Ctrl-C during this call
                raise KeyboardInterrupt
            return inner(*args, **kwargs)
        for name in ("tree_rule", "sibling_sampling"):
            if hasattr(inner, name):
                setattr(verify, name, getattr(inner, name))
    """,
    "tree-loop": """
        from exactcheck.tree.loop_entry import builtin_tree_generators
        inner = builtin_tree_generators()["tree-loop-reference"]
        calls = [0]
        def generate(*args, **kwargs):
            calls[0] += 1
            if calls[0] == {at}:  # as if the user pressed Ctrl-C during this generation
                raise KeyboardInterrupt
            return inner(*args, **kwargs)
    """,
}


@pytest.mark.parametrize("kind, callable_name, argv, at", [
    ("tree", "verify", ["--level", "quick", "--max-samples", "400"], 40),
    ("tree-loop", "generate", ["--generations", "20"], 30),
])
def test_ctrl_c_keeps_a_partial_report_marked_incomplete_and_exits_130(tmp_path, capsys, monkeypatch, kind,
                                                                       callable_name, argv, at):
    name = f"interrupting_{kind.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(SUBJECTS[kind]).replace("{at}", str(at)))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main([kind, f"{name}:{callable_name}", *argv, "--report", str(tmp_path / "r"), "--quiet"])
    captured = capsys.readouterr()
    assert code == 130, captured.err
    assert captured.out == "" and "interrupted" in captured.err
    data = json.loads(next((tmp_path / "r").glob("*.json")).read_text())
    assert data["budget"]["interrupted"] is True and data["summary"]["passed"] is False
    summaries = [v["summary"] for v in data["verdicts"]]
    assert any("interrupted" in s for s in summaries)
    assert any("interrupted" not in s for s in summaries), "the verdicts reached before Ctrl-C are kept"
    assert "INCOMPLETE" in next((tmp_path / "r").glob("*.md")).read_text()
