"""A newcomer's first hour (issue 65), the parts that are behaviour: names `exactcheck list` prints
are taken wherever a subject is; an unknown one points to `exactcheck list`; `--version`; a subject
with the wrong signature is one line and exit 2 before anything is drawn, in every kind that calls
one; `greedy --model` offers the real tiny hybrids; progress is a bar on a terminal and a plain
line every few seconds in a log."""
from __future__ import annotations

import io
import time

import pytest

from exactcheck.cli import main


def test_version(capsys):
    from exactcheck.version import __version__
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"exactcheck {__version__}"


@pytest.mark.parametrize("name", ["trust_draft", "acceptance_x0.98", "acceptance_x0_98", "reference"])
def test_the_step_names_exactcheck_list_prints_are_subjects(name, capsys):
    from exactcheck.catalogue_listing import LISTING
    assert f"  {name.replace('_x0_98', '_x0.98')} " in LISTING or name == "reference" and "reference (exactcheck's own" in LISTING
    code = main(["audit", name, "--level", "quick", "--world", "three_token", "--quiet"])
    out = capsys.readouterr().out
    assert code == (1 if name == "trust_draft" else 0), out
    assert f"exactcheck audit {name}: " in out
    if code:  # the reproduce line names it the same way: a command, not a Python call
        assert f"reproduce: exactcheck audit {name} --level quick" in out


@pytest.mark.parametrize("command", ["audit", "e2e", "tree", "tree-loop", "recurrent", "greedy"])
def test_an_unknown_name_points_to_exactcheck_list(command, capsys):
    assert main([command, "nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err and "see `exactcheck list`" in err


def wrong_arity(a, b):
    return a


@pytest.mark.parametrize("command, what", [("audit", "verifier"), ("e2e", "generator"), ("tree", "tree verifier"),
                                           ("tree-loop", "tree generator"), ("recurrent", "generator"),
                                           ("greedy", "generator")])
def test_a_wrong_signature_is_one_line_and_exit_2_within_two_seconds(command, what, capsys):
    start = time.perf_counter()
    code = main([command, "test_front_door:wrong_arity"])
    seconds = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and seconds < 2, (seconds, err)
    assert f"test_front_door:wrong_arity cannot be called as a {what}: its signature is (a, b)" in err
    assert f"a {what} is called as " in err


def test_the_python_api_checks_the_signature_too():
    from exactcheck.audit_kinds import audit_subject
    from exactcheck.errors import UsageError
    with pytest.raises(UsageError, match="cannot be called as a verifier"):
        audit_subject("verifier", wrong_arity, level="quick", progress=False)


def test_greedy_offers_every_real_tiny_hybrid(capsys):
    pytest.importorskip("transformers")
    from exactcheck.e2e.real_models import hybrid_model_names
    from exactcheck.options import HYBRID_MODELS
    assert HYBRID_MODELS == tuple(hybrid_model_names()) and len(HYBRID_MODELS) == 18
    from exactcheck.catalogue_listing import LISTING
    for name in HYBRID_MODELS:  # the command takes each (an unknown choice exits 2 before --help), `list` names each
        with pytest.raises(SystemExit) as exit_:
            main(["greedy", "--model", name, "--help"])
        assert exit_.value.code == 0 and name in LISTING
    capsys.readouterr()


class _Log(io.StringIO):
    def isatty(self) -> bool:
        return False


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_a_plain_line_every_few_seconds():
    from exactcheck.progress import Progress
    log = _Log()
    bar = Progress(1000, unit="trial", desc="exactcheck: laws", stream=log, after=0.0, every=0.05)
    for i in range(10):
        bar.step(f"world {i}", 100)
        time.sleep(0.02)
    bar.close()
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and 1 <= len(lines) <= 5, text
    assert lines[0].startswith("exactcheck: laws: ") and " of 1,000 trials (" in lines[0] and "[world" in lines[0]
    quiet = _Log()
    bar = Progress(1000, stream=quiet, enabled=False, after=0.0, every=0.0)
    bar.step("x", 500)
    bar.close()
    assert quiet.getvalue() == ""


def test_progress_on_a_terminal_is_a_bar_redrawn_in_place():
    from exactcheck.progress import Progress
    term = _Terminal()
    bar = Progress(100, unit="trial", desc="exactcheck: laws", stream=term, after=0.0)
    for _ in range(4):
        bar.step("w", 25)
    bar.close()
    assert "\r" in term.getvalue() and "exactcheck: laws" in term.getvalue()


def test_the_selftest_shows_progress_unless_quiet(monkeypatch):
    from exactcheck.step import entry
    seen = {}

    def audit(subject, on_audit=None, progress=True, **settings):
        seen["progress"] = progress
        raise KeyboardInterrupt

    import argparse
    parser = argparse.ArgumentParser()
    entry.selftest_arguments(parser)
    for argv, shown in (([], True), (["--quiet"], False)):
        with pytest.raises(KeyboardInterrupt):
            entry.selftest_main(parser.parse_args(argv), "stem", audit)
        assert seen["progress"] is shown
