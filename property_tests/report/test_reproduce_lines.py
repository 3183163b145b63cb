"""Every printed reproduce line runs as printed and reproduces its finding (issue 65): for each audit
kind (step law and step property, with and without a report directory; tree; tree-loop; e2e;
recurrent; serve with a custom sampling; the gate; the pytest plugin) a mutant is audited from the
command line, the ``reproduce:`` line it prints is pasted into a shell (``bash -c``, ``exactcheck``
on the PATH as an installed user has it), and the rerun must fail the same check with the same
statistic. Each audit is cut to one world and a few samples: these tests are about the lines, the
power of the checks is tested elsewhere."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.long

ROOT = Path(__file__).resolve().parents[2]
BIN = str(Path(sys.executable).parent)


def _shell(line: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``line`` pasted into bash in ``cwd``, with exactcheck on the PATH and this checkout importable."""
    env = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _reproduce_lines(text: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*reproduce: (.+)$", text, flags=re.M)]


def _evidence(text: str, check: str) -> list[str]:
    """The lines that carry a failed check's statistic: its headline and the fact lines after it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{check.split('/')[1]} law in world "
                                                                               f"{check.split('/')[0]}:"))
    block = []
    for line in lines[start:]:
        if not line.strip() or line.strip().startswith("reproduce:"):
            break
        block.append(line.strip())
    return [line for line in block if not line.startswith(("power:", "cases:"))]


def _first_failed(text: str) -> str:
    return re.search(r"FAILED on (\S+)", text).group(1)


def _same_finding(first: subprocess.CompletedProcess, again: subprocess.CompletedProcess,
                  check: str | None = None) -> None:
    """Both runs fail; ``check`` (default: the first run's headline) fails in both with the same evidence."""
    assert first.returncode == 1, first.stdout + first.stderr
    assert again.returncode == 1, again.stdout + again.stderr
    check = check or _first_failed(first.stdout)
    assert f"law in world {check.split('/')[0]}: defect" in again.stdout
    assert _evidence(again.stdout, check) == _evidence(first.stdout, check)
    assert _evidence(again.stdout, check) == _evidence(first.stdout, check)


def _audit_then_paste(tmp_path: Path, command: str, check: str | None = None) -> tuple:
    first = _shell(command, tmp_path)
    check = check or _first_failed(first.stdout)
    block = "\n".join(_evidence(first.stdout, check))
    line = next(reproduce for reproduce in _reproduce_lines(first.stdout)
                if f"--world {check.split('/')[0]}" in reproduce or check in reproduce)
    assert block, first.stdout
    return first, line, _shell(line, tmp_path)


def test_a_step_law_finding(tmp_path):
    first, line, again = _audit_then_paste(tmp_path, "exactcheck audit trust_draft --level quick --world three_token --quiet")
    assert line.startswith("exactcheck audit trust_draft ")  # a built-in name, as `exactcheck list` prints it
    _same_finding(first, again)


def test_a_step_property_counterexample_without_a_report_directory_says_how_to_get_its_reproducer(tmp_path):
    first = _shell("exactcheck audit accept_on_equal_uniform --level quick --world properties --quiet", tmp_path)
    assert first.returncode == 1
    [line] = [r for r in _reproduce_lines(first.stdout) if "no_forbidden_token" in r]
    assert "REPORT_DIR" not in line and "--report exactcheck-reports" in line
    rerun, _, replay = line.partition("  # writes its reproducer; then: ")
    assert replay.startswith("exactcheck replay exactcheck-reports/reproducers/")
    again = _shell(line, tmp_path)  # pasted whole: the comment is a comment
    assert again.returncode == 1 and "FAILED on properties/no_forbidden_token" in again.stdout
    assert (tmp_path / replay.split()[-1]).is_file()
    replayed = _shell(replay, tmp_path)
    assert replayed.returncode == 1 and "still fails" in replayed.stdout, replayed.stdout + replayed.stderr


def test_a_step_property_counterexample_with_a_report_directory_replays_its_file(tmp_path):
    first = _shell("exactcheck audit accept_on_equal_uniform --level quick --world properties --quiet --report out",
                   tmp_path)
    [line] = [r for r in _reproduce_lines(first.stdout) if "no_forbidden_token" in r]
    assert line == ("exactcheck replay out/reproducers/"
                    "accept_on_equal_uniform--properties-no_forbidden_token-quick-seed0.json")
    replayed = _shell(line, tmp_path)
    assert replayed.returncode == 1 and "still fails" in replayed.stdout


def test_a_tree_finding(tmp_path):
    _same_finding(*_audit_then_paste(tmp_path, "exactcheck tree tree-mutant:residual_from_draft_q --level quick "
                                               "--world tree_topk_v4_3x1 --quiet")[::2])


def test_a_tree_loop_finding(tmp_path):
    _same_finding(*_audit_then_paste(tmp_path, "exactcheck tree-loop tree-loop-mutant:rejected_branch_kept "
                                               "--world tree_iid_v3_3x1 --generations 40 --quiet")[::2])


def test_an_e2e_finding_under_a_policy(tmp_path):
    pytest.importorskip("transformers")
    first, line, again = _audit_then_paste(tmp_path, "exactcheck e2e loop-mutant:temperature_twice --level quick "
                                                     "--world hf_v4_l3_k2 --generations 300 --no-greedy "
                                                     "--policy temperature=0.5 --quiet")
    assert "--policy temperature=0.5" in line
    _same_finding(first, again)


def test_a_recurrent_finding(tmp_path):
    pytest.importorskip("transformers")
    _same_finding(*_audit_then_paste(tmp_path, "exactcheck recurrent recurrent-mutant:rejected_drafts_left_in_state "
                                               "--level quick --world rec2_v4_l3_k2 --generations 100 --no-greedy "
                                               "--quiet", "rec2_v4_l3_k2/state_rollback")[::2], "rec2_v4_l3_k2/state_rollback")


def test_a_serve_finding_with_a_custom_sampling_prompt_and_length(tmp_path):
    from exactcheck.serve.mutants import proxy
    from toy_models.served_lm import ToyServedModel, served_model
    model = ToyServedModel()
    with served_model(model) as target, served_model(model.as_draft()) as draft, \
            served_model(model.as_plain()) as plain, \
            proxy("hotter", target.url, draft=draft.url, plain=plain.url) as p:
        first, line, again = _audit_then_paste(
            tmp_path, f"exactcheck serve {p.url} --reference {target.url} --level quick --max-samples 1500 "
                      f"--traffic sequential --prompt-ids 1,2 --prompt-ids 3 --sampling temperature=0.7,top_k=5 "
                      f"--length 2 --quiet",
            "p0-temperature0_7-top_k5/continuation")
    for flag in ("--prompt-ids 1,2 --prompt-ids 3", "--sampling temperature=0.7,top_k=5", "--length 2",
                 "--world p0-temperature0_7-top_k5", "--traffic sequential"):
        assert flag in line, line
    _same_finding(first, again, "p0-temperature0_7-top_k5/continuation")


BUGGY = textwrap.dedent("""
    from exactcheck.step.mutants import mutant

    buggy_verifier = mutant("bonus_from_draft")
""")


def test_a_gate_finding(tmp_path):
    (tmp_path / "my_sampler.py").write_text(BUGGY)
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.exactcheck]
        level = "quick"

        [[tool.exactcheck.subject]]
        name = "buggy"
        verifier = "my_sampler:buggy_verifier"
        worlds = ["random_v8_k4"]
    """))
    first = _shell("exactcheck gate --no-isolate --quiet", tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    line = _reproduce_lines(first.stdout)[0]
    assert line.startswith("exactcheck audit my_sampler:buggy_verifier ")
    again = _shell(line, tmp_path)
    assert again.returncode == 1
    check = re.search(r"^\s+(\S+) law in world (\S+):", first.stdout, flags=re.M)
    law, world = check.group(1), check.group(2)
    assert _evidence(again.stdout, f"{world}/{law}") == [line.strip() for line in _evidence(
        textwrap.dedent(first.stdout.replace("\n  ", "\n")), f"{world}/{law}")]


def test_a_pytest_plugin_finding(tmp_path):
    (tmp_path / "my_sampler.py").write_text(BUGGY)
    (tmp_path / "test_exactness.py").write_text(
        "from exactcheck.pytest_plugin import verifier_tests\n\n"
        "test_buggy = verifier_tests('my_sampler:buggy_verifier', worlds=['random_v8_k4'])\n")
    first = _shell(f"{shutil.which('python', path=BIN) or sys.executable} -m pytest -q -p no:cacheprovider "
                   "-p no:randomly test_exactness.py", tmp_path)
    assert first.returncode == 1, first.stdout + first.stderr
    line = next(r for r in _reproduce_lines(first.stdout) if r.startswith("exactcheck audit"))
    assert line.startswith("exactcheck audit my_sampler:buggy_verifier ")
    again = _shell(line, tmp_path)
    assert again.returncode == 1 and "FAILED on random_v8_k4/" in again.stdout
