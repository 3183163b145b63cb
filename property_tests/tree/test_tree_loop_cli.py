"""``exactcheck tree-loop``: the tree generation audit as one row of ``AUDIT_KINDS`` (its command, exit
codes, reports, reproduce lines, the listing and the plugin's plan), on the dynamic EAGLE-2 world."""
import json

import pytest

from exactcheck.cli import main
from exactcheck.report.result import result_type
from exactcheck.tree.result import TreeLoopAuditResult
from exactcheck.audit_kinds import AUDIT_KINDS, audit_subject, entry_point, plan_subject

DYNAMIC = "tree_topk_dynamic_v5_eagle2"


def _run(capsys, *argv):
    code = main(["tree-loop", *argv, "--quiet"])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_reference_exits_0_and_writes_the_reports(tmp_path, capsys):
    code, out, err = _run(capsys, "tree-loop-reference", "--world", DYNAMIC, "--generations", "30",
                          "--report", str(tmp_path))
    assert code == 0, out + err
    assert "PASSED" in out
    reports = sorted(p.suffix for p in tmp_path.iterdir())
    assert reports == [".html", ".json", ".md"]
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert data["kind"] == "tree-loop" and result_type(data) is TreeLoopAuditResult
    assert {v["check"] for v in data["verdicts"]} == {f"{DYNAMIC}/{law}" for law in
                                                       ("sequence", "first_token", "tree_cache")}


def test_a_mutant_exits_1_with_the_invariant_and_a_command_to_reproduce(capsys):
    code, out, _ = _run(capsys, "tree-loop-mutant:rejected_branch_kept", "--world", DYNAMIC, "--generations", "20")
    assert code == 1
    assert "committed_cache" in out
    assert (f"reproduce: exactcheck tree-loop tree-loop-mutant:rejected_branch_kept --seed 0 --world {DYNAMIC} "
            f"--generations 20") in out


@pytest.mark.parametrize("argv,said", [
    (["tree-loop-mutant:no_such"], "unknown tree generator"),
    (["not_a_subject"], "MODULE:CALLABLE"),
    (["tree-loop-reference", "--world", "no_such_world"], "unknown tree world"),
    (["tree-loop-reference", "--generations", "0"], "generations (0) must be a positive integer"),
    (["tree-loop-reference", "--alpha", "2"], "alpha (2.0) must be a number in (0, 1)"),
])
def test_a_usage_error_exits_2_with_one_line(capsys, argv, said):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert said in err and len(err.strip().splitlines()) == 1 and out == ""


def test_the_kind_is_one_registry_row_the_plugin_plans_by_and_the_listing_names():
    entry = entry_point("tree-loop")
    assert entry in AUDIT_KINDS.values() and entry.result_type() is TreeLoopAuditResult
    plan = plan_subject("tree-loop", "tree-loop-reference", level="quick", worlds=[DYNAMIC], require=[])
    result = audit_subject("tree-loop", "tree-loop-reference", level="quick", worlds=[DYNAMIC], generations=10,
                           progress=False)
    assert plan.names == [v.check for v in result.verdicts]  # the plugin's tests are the audit's checks
    assert result.passed and result.level == "quick"
    from exactcheck.catalogue_listing import LISTING
    assert "tree-loop-reference" in LISTING and "tree-loop-mutant:sibling_visible" in LISTING
