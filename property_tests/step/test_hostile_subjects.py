"""Never a false pass, never a lost result: subjects and environments that try to end, hang or
fool the auditor (issue 41). Each test is one probe of the issue, with the behaviour it must get."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from exactcheck.cli import main
from exactcheck.report.files import atomic_write, report_stem
from exactcheck.step.runner import run_audit

HOSTILE = textwrap.dedent("""
    import ctypes, os, signal, sys, time
    from exactcheck.contracts.reference_verifier import reference_verifier

    class Custom(BaseException):
        pass

    def exits0(p, q, t, g):
        raise SystemExit(0)

    def exits3(p, q, t, g):
        sys.exit(3)

    def custom(p, q, t, g):
        raise Custom("not an Exception")

    def hangs(p, q, t, g):
        while True:
            time.sleep(0.05)

    def hangs_natively(p, q, t, g):  # as a C call that never returns to the interpreter: no alarm gets in
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(120)

    def os_exit(p, q, t, g):
        os._exit(0)

    def segfault(p, q, t, g):
        ctypes.string_at(0)

    def mutates(p, q, t, g):
        out = reference_verifier(p, q, t, g)
        p.mul_(0.5)
        return out

    def gen_exits0(target, draft, input_ids, policy, max_new_tokens, seed):
        raise SystemExit(0)
""")

QUICK = ["--level", "quick", "--world", "three_token", "--quiet"]


@pytest.fixture
def hostile(tmp_path, monkeypatch):
    (tmp_path / "hostile_subjects.py").write_text(HOSTILE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "hostile_subjects"


def _exactcheck(*args, timeout=300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exactcheck", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


# ---- a subject's BaseException is a crash of the subject, never the auditor's exit ----

@pytest.mark.parametrize("name, shown", [("exits0", "SystemExit: 0"), ("exits3", "SystemExit: 3"),
                                         ("custom", "Custom: not an Exception")])
def test_a_base_exception_from_the_subject_is_a_crash_with_its_message(hostile, name, shown, capsys):
    code = main(["audit", f"{hostile}:{name}", *QUICK])
    err = capsys.readouterr().err
    assert code == 2 and f"could not be driven: it crashed on every world (subject raised {shown})" in err


def test_a_generator_raising_system_exit_is_a_crash(hostile, capsys):
    pytest.importorskip("transformers")
    code = main(["e2e", f"{hostile}:gen_exits0", "--level", "quick", "--quiet", "--world", "hf_v4_l3_k2",
                 "--generations", "4", "--no-greedy"])
    assert code == 2 and "SystemExit: 0" in capsys.readouterr().err


@pytest.mark.long
def test_a_gate_whose_first_subject_exits_still_audits_the_second_and_fails(hostile, tmp_path):
    junitparser = pytest.importorskip("junitparser")
    (tmp_path / "gate.toml").write_text(textwrap.dedent(f"""
        [tool.exactcheck]
        level = "quick"
        [[tool.exactcheck.subject]]
        name = "exits"
        verifier = "{hostile}:exits0"
        worlds = ["three_token"]
        [[tool.exactcheck.subject]]
        name = "mutant"
        verifier = "exactcheck.step.mutants:bonus_argmax"
        worlds = ["random_v32_k2"]
    """))
    proc = _exactcheck("gate", "--config", "gate.toml", "--junit-xml", "out/junit.xml", "--quiet", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    suites = {s.name: s for s in junitparser.JUnitXml.fromfile(str(tmp_path / "out" / "junit.xml"))}
    assert set(suites) == {"exits", "mutant"}
    assert suites["exits"].errors >= 1 and suites["mutant"].failures >= 1


# ---- every call is bounded; a hang is a finding with its case ----

def test_a_subject_that_never_returns_is_stopped_at_the_call_timeout(hostile, capsys):
    begun = time.monotonic()
    code = main(["audit", f"{hostile}:hangs", *QUICK, "--call-timeout", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "did not return within 1 s (--call-timeout)" in err and "hostile_subjects.py" in err
    assert time.monotonic() - begun < 30  # one hang, then every later call fails at once


def test_the_call_timeout_is_in_the_reproduce_line():
    from exactcheck.options import AuditOptions
    from exactcheck.step.reproduce import step_audit_line
    assert "--call-timeout 5" in step_audit_line(AuditOptions.build(call_timeout=5), "m:f", "three_token")


# ---- what no in-process guard survives: the isolated mode reports it, exit 1 ----

@pytest.mark.long
@pytest.mark.parametrize("name, how", [("os_exit", "it exited with status 0"),
                                       ("segfault", "signal SIGSEGV"),
                                       ("hangs_natively", "hung past the call time limit of 1 s")])
def test_an_isolated_audit_reports_a_subject_that_killed_its_process(hostile, tmp_path, name, how):
    proc = _exactcheck("audit", f"{hostile}:{name}", *QUICK, "--isolate", "--call-timeout", "1",
                       "--report", "r", cwd=tmp_path, timeout=120)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "the subject killed its process" in proc.stdout and how in proc.stdout
    report = json.loads(next((tmp_path / "r").glob("audit-*.json")).read_text())
    assert report["summary"]["passed"] is False and report["verdicts"][0]["world"] == "process"


def test_an_isolated_audit_of_an_exact_subject_passes_as_in_process(capsys):
    code = main(["audit", "exactcheck.contracts.reference_verifier:reference_verifier", *QUICK, "--isolate"])
    assert code == 0 and "PASSED" in capsys.readouterr().out


# ---- inputs are the subject's to read: a write is a finding, the world is never touched ----

def test_a_subject_that_writes_into_its_inputs_is_named_and_the_world_is_untouched(hostile):
    import importlib
    from exactcheck.errors import ContractViolation
    from exactcheck.step.drive import drive_steps
    from toy_models import step_worlds
    mutates = importlib.import_module(hostile).mutates
    world = next(w for w in step_worlds() if w.name == "three_token")
    before = world.target_rows.clone()
    with pytest.raises(ContractViolation, match="wrote into target_probs"):
        drive_steps(mutates, world, 1, seed=0)  # one trial: on main the subject got the world's own rows
    assert torch.equal(world.target_rows, before)
    result = run_audit(mutates, level="quick", worlds=["three_token"], progress=False)
    (finding,) = [v for v in result.failed if v.world == "three_token"]
    assert finding.outcome.value == "contract-violation" and "wrote into target_probs" in finding.summary


# ---- the exit status is the verdict's, whatever happens to stdout ----

@pytest.mark.parametrize("reader", ["true", "head -c 1"])
def test_a_failing_audit_into_a_closed_pipe_still_exits_1(reader):
    line = (f"{shlex.quote(sys.executable)} -m exactcheck audit exactcheck.step.mutants:trust_draft "
            f"--level quick --world disjoint_supports --quiet | {reader} > /dev/null")
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", line], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


# ---- reports: checked before the audit, written whole, never sharing a stem ----

def test_a_report_path_that_is_a_file_is_one_line_before_any_audit(tmp_path, capsys):
    (tmp_path / "taken").write_text("x")
    for where in ("taken", "taken/below"):
        begun = time.monotonic()
        assert main(["audit", "exactcheck.contracts.reference_verifier:reference_verifier", *QUICK,
                     "--report", str(tmp_path / where)]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
        assert captured.err.startswith("exactcheck: error: --report") and time.monotonic() - begun < 5


def test_a_report_that_cannot_be_written_keeps_the_verdict_and_the_old_file(tmp_path, capsys, monkeypatch):
    args = ["audit", "exactcheck.contracts.reference_verifier:reference_verifier", *QUICK, "--report", str(tmp_path)]
    assert main(args) == 0
    (written,) = tmp_path.glob("*.json")
    before = written.read_text()
    capsys.readouterr()

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("exactcheck.report.files.os.fsync", full)
    assert main(args) == 2  # passed, but the report asked for is lost: never exit 0
    captured = capsys.readouterr()
    assert "PASSED" in captured.out and "No space left on device" in captured.err
    assert written.read_text() == before and not list(tmp_path.glob(".*.part"))


def test_runs_that_differ_in_a_verdict_setting_never_share_a_stem(tmp_path, capsys):
    base = ["audit", "exactcheck.step.mutants:trust_draft", "--level", "quick", "--quiet", "--report", str(tmp_path)]
    for extra in (["--world", "three_token"], ["--world", "disjoint_supports"],
                  ["--world", "three_token", "--alpha", "0.01"]):
        main(base + extra)
    assert len(list(tmp_path.glob("*.json"))) == 3
    assert report_stem("audit-", "a/b", "quick", 0) != report_stem("audit-", "a b", "quick", 0)
    plain = report_stem("audit-", "sampler", "quick", 0)
    assert plain == "audit-sampler-quick-seed0" and not re.search(r"-h[0-9a-f]{8}$", plain)


def test_a_reader_racing_the_writer_never_sees_part_of_a_report(tmp_path):
    path = tmp_path / "report.json"
    texts = [json.dumps({"n": n, "pad": "x" * (200_000 + 7 * n)}) for n in range(2)]
    atomic_write(path, texts[0])
    done = threading.Event()

    def writer():
        n = 0
        while not done.is_set():
            atomic_write(path, texts[n % 2])
            n += 1
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        bad = 0
        for _ in range(3000):
            try:
                json.loads(path.read_text())
            except ValueError:
                bad += 1
    finally:
        done.set()
        thread.join()
    assert bad == 0


# ---- an interrupted audit or selftest writes what it finished, marked incomplete ----

def _interrupt_after(args: list[str], cwd: Path, marker: str, sig: int) -> tuple[int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "exactcheck", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.monotonic() + 240
    while marker not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, seen + out + err


@pytest.mark.long
def test_a_selftest_stopped_by_sigint_writes_what_it_finished(tmp_path):
    code, text = _interrupt_after(["selftest", "--level", "quick", "--report", "r"], tmp_path,
                                  "reference_verifier", signal.SIGINT)
    assert code == 130 and "selftest interrupted" in text and "marked incomplete" in text, text
    (report,) = (tmp_path / "r").glob("selftest-*.json")
    data = json.loads(report.read_text())
    assert data["interrupted"] is True and data["passed"] is False and data["reference"]["summary"]["passed"]


@pytest.mark.long
def test_an_audit_stopped_by_sigterm_writes_its_partial_report(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "exactcheck", "audit", "exactcheck.contracts.reference_verifier:reference_verifier",
                             "--level", "standard", "--report", "r"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "marked incomplete" in err, (out, err)
    data = json.loads(next((tmp_path / "r").glob("audit-*.json")).read_text())
    assert data["budget"]["interrupted"] is True and data["summary"]["passed"] is False


# ---- a reproduce line after --max-seconds draws what the audit drew ----

def test_a_max_seconds_reproduce_line_gives_the_same_statistics(tmp_path, capsys):
    first = tmp_path / "first"
    main(["audit", "exactcheck.contracts.reference_verifier:reference_verifier", "--level", "standard", "--world", "nearly_equal",
          "--max-seconds", "6", "--quiet", "--report", str(first)])
    data = json.loads(next(first.glob("*.json")).read_text())
    laws = [v for v in data["verdicts"] if v["world"] == "nearly_equal"]
    assert laws and data["budget"]["max_seconds"] == 6
    line = laws[0]["reproduce"]
    assert "--looks-from-share" in line and "--max-seconds" not in line
    again = tmp_path / "again"
    main(shlex.split(line)[1:] + ["--quiet", "--report", str(again)])
    rerun = {v["check"]: (v["statistic"], v["samples"]) for v in
             json.loads(next(again.glob("*.json")).read_text())["verdicts"]}
    assert {v["check"]: (v["statistic"], v["samples"]) for v in laws} == {c: rerun[c] for c in (v["check"] for v in laws)}
