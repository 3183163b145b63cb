"""The command: exit codes, reports that round-trip, subjects importable from the cwd."""
import json
import re
import textwrap

import pytest

from exactcheck.cli import main
from exactcheck.report.json_md import audit_from_json, audit_to_json, render_audit_markdown

REFERENCE = "exactcheck.contracts.reference_verifier:reference_verifier"


def test_passing_audit_exits_0_and_writes_reports(tmp_path, capsys):
    code = main(["audit", REFERENCE, "--level", "quick", "--world", "three_token",
                 "--report", str(tmp_path), "--quiet"])
    assert code == 0
    data = json.loads(next(tmp_path.glob("audit-exactcheck-contracts-reference_verifier-reference_verifier-quick-seed0-h*.json")).read_text())
    assert data["schema"] == "exactcheck.audit/1" and data["summary"]["passed"]
    assert len(data["verdicts"]) == 5  # first token, accepted length, bonus, correction, their joint law
    md = next(tmp_path.glob("audit-exactcheck-contracts-reference_verifier-reference_verifier-quick-seed0-h*.md")).read_text()
    assert "PASSED" in md and "three_token/correction_token" in md
    assert "PASSED" in capsys.readouterr().out


def test_defect_exits_1_with_a_readable_message(capsys):
    code = main(["audit", "exactcheck.step.mutants:bonus_argmax", "--level", "quick",
                 "--world", "three_token", "--seed", "5", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "bonus_token law in world three_token: defect" in out
    assert "is found 9 times in 10; smaller ones are found less often, and this one was" in out
    assert "reproduce: exactcheck audit exactcheck.step.mutants:bonus_argmax --level quick --seed 5" in out


@pytest.mark.parametrize("argv,words", [
    (["audit", "no_colon_here"], "MODULE:CALLABLE"),
    (["audit", "no_such_module_xyz:f"], "cannot import"),
    (["audit", "exactcheck.contracts.reference_verifier:missing"], "no attribute"),
    (["audit", "exactcheck.contracts.reference_verifier:__doc__"], "not callable"),
    (["audit", REFERENCE, "--alpha", "1.5"], "alpha"),
    (["audit", REFERENCE, "--world", "atlantis"], "unknown world"),
    (["audit", REFERENCE, "--device", "cuda:7"], "not available"),
])
def test_usage_errors_exit_2(argv, words, capsys):
    assert main(argv + ["--quiet"]) == 2
    assert words in capsys.readouterr().err


def test_subject_from_the_current_directory_and_crash_everywhere_exits_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_verifier.py").write_text(textwrap.dedent("""
        from exactcheck.contracts.reference_verifier import reference_verifier as good

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
    # accepted_length is a conformance check (the rule's law): its finding is listed as one
    assert "FAILED" in md and "## Conformance findings" in md and "p_equals_q/accepted_length" in md
    # certificates only on passing statistical checks
    assert all(v.tv_certificate is None for v in result.failed)
    assert any(v.tv_certificate is not None for v in result.verdicts if not v.outcome.failed)


@pytest.mark.long
def test_selftest_command_prints_the_detection_table(tmp_path, capsys):
    code = main(["selftest", "--level", "quick", "--mutant", "trust_draft", "--mutant",
                 "accept_on_equal_uniform", "--report", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "trust_draft" in out and "detected" in out and "properties/no_forbidden_token" in out
    data = json.loads(next(tmp_path.glob("selftest-quick-seed0-h*.json")).read_text())
    assert data["passed"] and [r["detected"] for r in data["mutants"]] == [True, True]
    assert main(["render", str(next(tmp_path.glob("selftest-quick-seed0-h*.json")))]) == 0


def test_a_one_defect_audit_fits_one_screen_and_starts_with_the_defect(capsys):
    code = main(["audit", "exactcheck.step.mutants:bonus_argmax", "--level", "quick", "--quiet"])
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert code == 1
    assert len(lines) <= 25, "\n".join(lines)
    assert "FAILED on " in lines[0] and "(defect)" in lines[0]
    assert lines[2].split(" law in world ")[0] in lines[0] and ": defect" in lines[2]
    assert not any(line.lstrip().startswith("inconclusive") and "not run to its budget" in line for line in lines)


def test_reproducers_are_named_per_subject_and_the_reproduce_line_names_the_directory(tmp_path, capsys):
    code = main(["audit", "exactcheck.step.mutants:accept_if_p_ge_q", "--level", "quick",
                 "--report", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    files = sorted(p.name for p in (tmp_path / "reproducers").iterdir())
    assert files and all(f.startswith("exactcheck.step.mutants-accept_if_p_ge_q--properties-") for f in files)
    assert "REPORT_DIR" not in out and f"exactcheck replay {tmp_path}/reproducers/" in out
    data = json.loads(next(tmp_path.glob("audit-exactcheck-step-mutants-accept_if_p_ge_q-quick-seed0-h*.json")).read_text())
    assert all("REPORT_DIR" not in v["reproduce"] for v in data["verdicts"])


@pytest.mark.long
def test_selftest_report_has_an_html_page(tmp_path, capsys):
    assert main(["selftest", "--level", "quick", "--mutant", "bonus_argmax", "--report", str(tmp_path), "--quiet"]) == 0
    page = next(tmp_path.glob("selftest-quick-seed0-h*.html")).read_text()
    assert "exactcheck selftest" in page and "bonus_argmax" in page and "The reference verifier" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_readme_figures_are_generated_from_the_committed_reports():
    import pathlib
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "benchmarks/readme_figures.py", "--check"], cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_ctrl_c_during_an_audit_keeps_a_partial_report_marked_incomplete(tmp_path, capsys, monkeypatch):
    module = tmp_path / "interrupting_subject.py"
    module.write_text(textwrap.dedent("""
        from exactcheck.contracts.reference_verifier import reference_verifier
        calls = [0]
        def verify(p, q, tokens, generator):
            calls[0] += 1
            if calls[0] == 6:  # as if the user pressed Ctrl-C during the sixth call
                raise KeyboardInterrupt
            return reference_verifier(p, q, tokens, generator)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["audit", "interrupting_subject:verify", "--level", "quick", "--report", str(tmp_path / "r"),
                 "--quiet"])
    captured = capsys.readouterr()
    assert code == 130
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "interrupted" in captured.err
    data = json.loads(next((tmp_path / "r").glob("audit-interrupting_subject-verify-quick-seed0-h*.json")).read_text())
    assert data["budget"]["interrupted"] is True and data["summary"]["passed"] is False
    assert any("interrupted" in v["summary"] for v in data["verdicts"])
    assert "INCOMPLETE" in next((tmp_path / "r").glob("audit-interrupting_subject-verify-quick-seed0-h*.md")).read_text()


def _statistics(result, world: str) -> dict:
    return {v.check: (v.statistic, v.samples) for v in result.verdicts if v.world == world}


@pytest.mark.long
def test_a_reproduce_line_run_as_written_gives_its_verdicts_again(tmp_path):
    """Every setting that changes what a world draws is in its reproduce line (budget caps, the
    target TV, decoding policies, generations, the greedy sweep): the line, run as written (the
    command, or the Python call with the subject bound to its name), gives the same statistics
    on the same number of samples. Before, --max-samples, --detect-tv and --policy were dropped
    and the line re-ran a different audit."""
    import shlex

    from exactcheck.step.runner import run_audit
    from exactcheck.e2e.runner import run_generator_audit
    from exactcheck.contracts.generator import DecodingPolicy
    from exactcheck.report.json_md import audit_from_json
    from exactcheck.contracts.reference_verifier import reference_verifier
    from exactcheck.e2e.subjects import load_generator

    def rerun(line: str, python: dict):
        if line.startswith("exactcheck "):
            report = tmp_path / str(len(list(tmp_path.iterdir())))
            assert main(shlex.split(line)[1:] + ["--quiet", "--report", str(report)]) in (0, 1)
            return audit_from_json(json.loads(next(report.glob("*.json")).read_text()))
        return eval(line, {"DecodingPolicy": DecodingPolicy, "subject": None, **python})

    step = dict(level="quick", worlds=["three_token"], max_samples=3_000, detect_tv=0.08, progress=False)
    e2e = dict(level="quick", worlds=["hf_v3_l4_k3"], generations=300, greedy=False, progress=False,
               policies=(DecodingPolicy(0.7), DecodingPolicy(top_k=2)))
    loop = load_generator("reference-loop")
    runs = [(run_audit(reference_verifier, subject_name=REFERENCE, **step), "three_token"),
            (run_audit(reference_verifier, **step), "three_token"),
            (run_generator_audit(loop, subject_name="reference-loop", **e2e), "hf_v3_l4_k3"),
            (run_generator_audit(loop, **e2e), "hf_v3_l4_k3")]
    python = {"run_audit": lambda subject, **kw: run_audit(reference_verifier, progress=False, **kw),
              "run_generator_audit": lambda subject, **kw: run_generator_audit(loop, progress=False, **kw)}
    for result, world in runs:
        lines = {v.reproduce for v in result.verdicts}
        assert len(lines) == 1, lines
        line = lines.pop()
        if not line.startswith("exactcheck "):  # the Python form names the subject by its description
            call, rest = line.split("(", 1)
            line = f"{call}(subject, {rest.split(', ', 1)[1]}"
        assert ("max_samples" in line.replace("-", "_")) == ("--world three_token" in line or "'three_token'" in line)
        again = rerun(line, python)
        assert _statistics(again, world) == _statistics(result, world), line
        assert all(v.samples == 3_000 for v in result.verdicts if v.law in ("first_token", "accepted_length"))


def test_a_policy_the_command_line_cannot_state_gets_the_python_call():
    """Bias, banned or stop tokens, a mask or a name have no ``--policy`` spelling: the reproduce
    line is then the Python call, and its policies evaluate back to the ones audited."""
    from exactcheck.contracts.generator import DecodingPolicy
    from exactcheck.options import AuditOptions
    from exactcheck.e2e.reproduce import generator_audit_line
    stated = (DecodingPolicy(0.7), DecodingPolicy(top_k=2, top_p=0.8))
    unstated = (DecodingPolicy(0.7), DecodingPolicy(banned_tokens=(1,), logit_bias=((0, 2.0),)))
    options = AuditOptions.build(generations=50)
    for policies, command in ((stated, True), (unstated, False)):
        line = generator_audit_line(options, "reference-loop", "w", policies, greedy=False)
        assert line.startswith("exactcheck e2e reference-loop ") is command, line
        if command:
            assert "--policy temperature=0.7 --policy temperature=1.0,top_k=2,top_p=0.8 --no-greedy" in line
        else:
            keywords = line[line.index("policies="):]
            built = eval(keywords[len("policies="):keywords.index("]") + 1], {"DecodingPolicy": DecodingPolicy})
            assert tuple(built) == policies and "greedy=False" in line and "generations=50" in line


def test_the_greedy_reproduce_line_run_as_written_gives_its_verdicts_again(tmp_path):
    """``exactcheck greedy``'s line (a command for a named subject, the Python call otherwise),
    run as written, gives the same verdicts: greedy identity is deterministic."""
    import shlex

    pytest.importorskip("transformers")
    from exactcheck.e2e.real_models import run_greedy_audit
    from exactcheck.e2e.subjects import load_generator
    report = tmp_path / "first"
    assert main(["greedy", "transformers-assisted", "--model", "tiny-gpt2", "--prompts", "2", "--new-tokens", "4",
                 "--per-prompt", "2", "--seed", "3", "--quiet", "--report", str(report)]) == 0
    first = audit_from_json(json.loads(next(report.glob("*.json")).read_text()))
    line = first.verdicts[0].reproduce
    assert line.startswith("exactcheck greedy transformers-assisted ") and "--per-prompt 2" in line
    again = tmp_path / "again"
    assert main(shlex.split(line)[1:] + ["--quiet", "--report", str(again)]) == 0
    second = audit_from_json(json.loads(next(again.glob("*.json")).read_text()))
    assert [(v.check, v.summary, v.samples) for v in second.verdicts] == \
        [(v.check, v.summary, v.samples) for v in first.verdicts]
    # the Python call of a generator given as an object names every setting the command would
    call = run_greedy_audit(load_generator("transformers-assisted"), "tiny-gpt2", prompts=2, new_tokens=4,
                            per_prompt=2, seed=3, progress=False).verdicts[0].reproduce
    assert call.startswith("run_greedy_audit(") and "prompts=2" in call and "per_prompt=2" in call \
        and "seed=3" in call and "new_tokens=4" in call


@pytest.mark.parametrize("argv", [
    ["grammar", "transformers-assisted", "--prompts", "3", "--samples", "7", "--seed", "2"],
    ["cost", "transformers-assisted", "--model", "tiny-gpt2", "--draft-lengths", "1,3", "--prompts", "3",
     "--seed", "2", "--new-tokens", "5", "--policy", "temperature=0.7"],
])
def test_the_grammar_and_cost_reproduce_lines_call_the_same_audit(argv, monkeypatch, capsys):
    """These audits need SmolLM2 or time real requests, so their runner is replaced by one that
    records its arguments and hands back the line it would write (the cost line comes from the
    command; the grammar line is built as ``run_grammar_audit`` builds it, at the command's draft
    lengths, new tokens and alpha): that line, run as written, makes the same call."""
    import importlib
    import shlex

    from exactcheck.e2e.reproduce import grammar_audit_line

    calls = []

    def record(module: str, name: str):
        def fake(generator, **kwargs):
            calls.append({k: v for k, v in kwargs.items() if k != "progress"})
            if name == "run_cost":
                raise _Recorded(kwargs["reproduce"])
            raise _Recorded(grammar_audit_line(kwargs["subject_name"], kwargs["prompts"], (1, 4, 8), kwargs["samples"],
                                               64, kwargs["seed"], 1e-3, kwargs["device"]))

        monkeypatch.setattr(importlib.import_module(module), name, fake)

    if argv[0] == "grammar":
        record("exactcheck.e2e.real_grammar", "run_grammar_audit")
    else:
        record("exactcheck.cost.generators", "run_cost")
    with pytest.raises(_Recorded) as first:
        main(argv + ["--quiet"])
    line = str(first.value)
    assert line.startswith(f"exactcheck {argv[0]} transformers-assisted ")
    with pytest.raises(_Recorded):
        main(shlex.split(line)[1:] + ["--quiet"])
    assert len(calls) == 2 and calls[0] == calls[1], calls


class _Recorded(Exception):
    """Raised by a recording runner with the reproduce line it was handed or built."""


@pytest.mark.long
def test_selftest_jobs_gives_the_serial_verdicts():
    """``selftest --jobs 2`` runs the same seeded audits in worker processes: the same verdicts."""
    from exactcheck.step.selftest import run_selftest
    names = ["bonus_argmax", "accept_if_p_ge_q"]
    serial = run_selftest(level="quick", seed=3, mutants=names)
    parallel = run_selftest(level="quick", seed=3, mutants=names, jobs=2)

    def key(result):
        return [(v.check, v.outcome, v.statistic, v.samples) for a in [result.reference] + [m[2] for m in result.mutants]
                for v in a.verdicts]
    assert key(serial) == key(parallel) and parallel.passed and not parallel.interrupted


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_report_files_get_the_mode_open_gives_under_the_umask(tmp_path, umask, mode):
    """Reports are written through a temporary (``tempfile.mkstemp`` makes it 0o600) and renamed:
    the file that lands has the mode a plain ``open()`` would give it, 0o666 less the umask."""
    import os
    import stat
    from exactcheck.report.files import atomic_write, write_report
    from exactcheck.report.json_md import AUDIT_SCHEMA
    data = {"schema": AUDIT_SCHEMA, "kind": "step", "subject": "m:f", "level": "quick", "seed": 0, "alpha": 1e-3,
            "device": "cpu", "started": "", "duration_s": 0.0, "environment": {}, "budget": {}, "verdicts": []}
    old = os.umask(umask)
    try:
        paths = [atomic_write(tmp_path / "one.txt", "x"), *write_report(data, tmp_path / "r", "stem")]
        atomic_write(tmp_path / "one.txt", "y")  # replacing a file: the same mode again
    finally:
        os.umask(old)
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in paths} == {oct(mode)}
    assert stat.S_IMODE((tmp_path / "one.txt").stat().st_mode) == mode


@pytest.fixture(scope="module")
def stopped_early():
    """A step audit stopped early on a defect after 7 trials: 14 laws not run to their budget, three
    accepted-length laws among them drawn from 7 trials."""
    from exactcheck import run_audit
    from exactcheck.step.mutants import mutant
    result = run_audit(mutant("bonus_from_draft"), subject_name="m:bonus_from_draft", level="quick",
                       worlds=["three_token", "random_v8_k4", "random_v32_k2"], progress=False)
    assert result.stopped_at == "random_v32_k2/bonus_token"
    return json.loads(json.dumps(audit_to_json(result)))


def test_the_markdown_folds_the_checks_not_run_into_one_line_as_the_terminal_does(stopped_early):
    from exactcheck.report.ranking import not_run
    from exactcheck.report.terminal import audit_summary
    result = audit_from_json(stopped_early)
    unrun = not_run(result.verdicts)
    assert len(unrun) == 14
    md = render_audit_markdown(stopped_early)
    folded = [line for line in md.splitlines() if "not run to" in line]
    assert len(folded) == 1, folded  # not one line per check
    assert folded[0].startswith("14 checks not run to their budget (the audit stopped early on "
                                "random_v32_k2/bonus_token); they are inconclusive, not passed; left out of this table")
    rows = [line.split(" | ")[0].lstrip("| ") for line in md.splitlines() if line.startswith("| ")][1:]
    assert rows == ["random_v32_k2/bonus_token"]  # the table holds the judged checks only
    # the finding to act on comes before the table; the terminal says the same in its own line
    lead = md.index("**Leading finding**: `random_v32_k2/bonus_token` (defect)")
    assert lead < md.index("| check |")
    terminal = audit_summary(result)
    assert terminal.count("not run to") == 1 and "14 checks not run to their budget" in terminal


def test_one_check_not_run_reads_in_the_singular():
    from exactcheck.report.ranking import not_run_line
    assert not_run_line(1, "w/law") == ("1 check not run to its budget (the audit stopped early on w/law); "
                                        "it is inconclusive, not passed")
    assert not_run_line(2, None, interrupted=True).startswith("2 checks not run to their budget (the audit was "
                                                              "interrupted); they are")


def test_no_accepted_length_plot_from_a_handful_of_samples_and_the_rule_is_stated(stopped_early):
    from exactcheck.report.html import MIN_PLOTTED_SAMPLES, render_audit_html
    page = render_audit_html(stopped_early)
    assert 'id="length-plots"' not in page  # three inconclusive laws of 7 trials each: none plotted
    assert (f"A law is plotted only when it was judged (not inconclusive) on at least {MIN_PLOTTED_SAMPLES} "
            "samples") in page and "3 of 3 left out." in page
    # one judged on enough samples is plotted, one judged on too few is not
    data = json.loads(json.dumps(stopped_early))
    lengths = [v for v in data["verdicts"] if v["law"] == "accepted_length"]
    for v, n in zip(lengths, (MIN_PLOTTED_SAMPLES, MIN_PLOTTED_SAMPLES - 1, 5000)):
        v.update(outcome="exact", samples=n, summary="TV 0.01, p = 0.5")
    lengths[2]["outcome"] = "inconclusive"
    page = render_audit_html(data)
    plotted = re.findall(r'<h3>([^<]*): exact</h3>', page.split('id="length-plots"')[1])
    assert plotted == [lengths[0]["check"]] and "2 of 3 left out." in page


def _svg_ticks(svg: str, cls: str) -> list[str]:
    return re.findall(rf'<text class="{cls}"[^>]*>([^<]*)</text>', svg)


def test_html_axes_have_distinct_ticks_and_the_tv_axis_reaches_its_largest_bar(stopped_early):
    """A failed law of 7 trials (counts 0 to 3) gets ticks 0, 2.5, 5, not "0, 2, 3"; a law of one
    trial 0, 0.5, 1, not "0, 0, 1"; a detectable TV of 0.68 stretches the TV axis to 1 instead of
    being cut at 0.1."""
    from exactcheck.report.html import render_audit_html
    page = render_audit_html(stopped_early)
    plots = re.findall(r'<svg class="law-plot failed-law".*?</svg>', page)
    assert plots and all(len(set(_svg_ticks(svg, "tick"))) == 3 for svg in plots)
    assert _svg_ticks(plots[0], "tick") == ["0", "2.5", "5"]
    data = json.loads(json.dumps(stopped_early))
    failed = next(v for v in data["verdicts"] if v["outcome"] == "defect")
    failed["law_cells"] = [{"cell": "a", "observed": 1, "expected": 0.7}, {"cell": "b", "observed": 0, "expected": 0.3}]
    failed["detectable_tv"] = 0.68
    page = render_audit_html(data)
    svg = re.search(r'<svg class="law-plot failed-law".*?</svg>', page).group()
    assert _svg_ticks(svg, "tick") == ["0", "0.5", "1"]
    pvalues = re.search(r'<svg class="pvalue-plot".*?</svg>', page).group()
    assert _svg_ticks(pvalues, "tv-tick") == ["0", "0.5", "1"] and "certified TV ≤ (tick), 0–1<" in pvalues
    bar = float(re.search(r'width="([0-9.]+)" height="10" fill="#54aeff"><title>detectable TV 0.6800', pvalues).group(1))
    assert bar == pytest.approx(350 * 0.68, abs=0.1)  # 0.68 of the axis, not all of it


def test_counts_read_in_the_singular_where_there_is_one():
    from exactcheck.core import impossible_summary
    from exactcheck.report.verdict import FindingEvidence, LawEvidence, Evidence, TotalVariation
    assert impossible_summary(1, "samples") == "1 sample fell on an outcome of exact probability 0"
    assert impossible_summary(1, "generations") == "1 generation fell on an outcome of exact probability 0"
    assert impossible_summary(2_000, "trials") == "2,000 trials fell on outcomes of exact probability 0"
    case = {"case": {"k": 2}, "value": "zero"}
    lines = {n: FindingEvidence(reproducer={**case, "forced_elements": forced}).detail_lines(10, True)[1]
             for n, forced in (("none", []), ("one", [3]), ("two", [3, 5]))}
    assert lines["none"] == ("forced uniform: zero; fewest forced draws that still break it: none (it breaks with "
                             "every draw left to the subject's generator)")
    assert lines["one"].endswith("still break it: 1 (element 3 of the call's draws)")
    assert lines["two"].endswith("still break it: 2 (elements 3, 5 of the call's draws)")
    law = LawEvidence(Evidence.FIXED_BUDGET, tv=TotalVariation(0.9, (0.0, 1.0), 0.9))
    assert "power: at this one sample a TV of 0.9000" in "\n".join(law.detail_lines(1, True))
    assert "power: at these 7 samples" in "\n".join(law.detail_lines(7, True))
