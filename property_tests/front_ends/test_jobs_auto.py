"""``--jobs auto``, the command line's default: worker processes for exactcheck's own subjects on
the CPU, and the same verdicts as the serial run for every kind that takes ``--jobs``."""
from __future__ import annotations

import argparse

import pytest

from exactcheck import arguments
from exactcheck.audit_kinds import entry_point
from exactcheck.cli import main
from exactcheck.errors import UsageError
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.executors import AUTO_JOBS_CAP, auto_jobs


def users_verifier(target_probs, draft_probs, draft_token_ids, generator):  # a user's subject: its own module
    return reference_verifier(target_probs, draft_probs, draft_token_ids, generator)


def _jobs(command: str, *argv: str):
    parser = argparse.ArgumentParser()
    entry_point(command).arguments(parser)
    return arguments.given(parser.parse_args(list(argv)))["jobs"]


def test_the_command_line_default_is_auto_and_shards_keep_one_process():
    assert _jobs("e2e", "reference-loop") == "auto"
    assert _jobs("selftest") == "auto"
    assert _jobs("audit", "reference", "--jobs", "3") == 3
    assert _jobs("e2e", "reference-loop", "--shards", "2") == 1  # shards are the other way to spread draws
    with pytest.raises(SystemExit) as exit_:
        main(["e2e", "reference-loop", "--jobs", "many"])
    assert exit_.value.code == 2
    # workers where they pay: the kinds whose draws are generations through toy models
    assert {k for k in ("audit", "selftest", "tree", "tree-loop", "e2e", "recurrent", "serve")
            if entry_point(k).auto_workers} == {"tree-loop", "e2e", "recurrent"}


def test_auto_gives_workers_to_exactchecks_own_subjects_on_the_cpu_only(monkeypatch):
    monkeypatch.delenv("EXACTCHECK_JOBS", raising=False)  # the suite sets 1 (conftest.py)
    cores = auto_jobs(None)
    assert 1 <= cores <= AUTO_JOBS_CAP
    assert auto_jobs(reference_verifier) == cores
    assert auto_jobs(reference_verifier, "cpu") == cores
    assert auto_jobs(reference_verifier, "cuda") == 1  # a GPU is not shared out by processes
    assert auto_jobs(users_verifier) == 1  # a user's module would be imported again in every worker
    monkeypatch.setenv("EXACTCHECK_JOBS", "3")
    assert auto_jobs(None) == 3 and auto_jobs(users_verifier) == 1
    monkeypatch.setenv("EXACTCHECK_JOBS", "0")
    with pytest.raises(UsageError, match="EXACTCHECK_JOBS"):
        auto_jobs(None)


def _verdicts(result):
    return [(v.check, v.outcome, v.statistic, v.pvalue, v.samples) for v in result.verdicts]


@pytest.mark.parametrize("kind", ["e2e", "recurrent", "tree-loop"])
def test_two_workers_give_the_serial_verdicts(kind):
    """What ``--jobs auto`` runs on a two-core machine, against the serial run: every verdict equal."""
    if kind == "e2e":
        from exactcheck.e2e.loop import ReferenceSpeculativeLoop
        from exactcheck.e2e.runner import run_generator_audit

        def audit(jobs):
            return run_generator_audit(ReferenceSpeculativeLoop(), worlds=["hf_v4_l3_k2"], generations=300, seed=2,
                                       greedy=False, progress=False, jobs=jobs)
    elif kind == "recurrent":
        pytest.importorskip("transformers")
        cache_utils = pytest.importorskip("transformers.cache_utils")
        if not hasattr(cache_utils, "LinearAttentionLayer"):
            pytest.skip("this transformers has no LinearAttentionLayer (hybrid caches)")
        from exactcheck.recurrent.loops import REFERENCE_LOOPS
        from exactcheck.recurrent.runner import run_recurrent_audit

        def audit(jobs):
            return run_recurrent_audit(REFERENCE_LOOPS["snapshot"], worlds=["rec2_v4_l3_k2"], generations=300, seed=2,
                                       greedy=False, progress=False, jobs=jobs)
    else:
        from exactcheck.tree.cached_loop import ReferenceTreeLoop
        from exactcheck.tree.generation_audit import run_tree_generation_audit

        def audit(jobs):
            return run_tree_generation_audit(ReferenceTreeLoop(), worlds=["tree_iid_v3_3x1", "tree_wor_v4_3x1"],
                                             trials=300, seed=2, jobs=jobs)
    serial, parallel = audit(1), audit(2)
    assert _verdicts(parallel) == _verdicts(serial)
    assert serial.samples_drawn == parallel.samples_drawn > 0


def test_the_command_line_starts_its_workers_early_and_gives_the_serial_report(monkeypatch, tmp_path):
    """``exactcheck tree-loop`` under ``--jobs auto`` on two or more cores: the workers start before
    the subject is loaded (``start_workers_early``), the audit takes them, and its report's verdicts
    are those of ``--jobs 1``."""
    import json

    from exactcheck import executors
    monkeypatch.delenv("EXACTCHECK_JOBS", raising=False)
    if auto_jobs(None) < 2:
        pytest.skip("one core: auto keeps one process")
    started, original = [], executors.start_workers_early
    monkeypatch.setattr(executors, "start_workers_early",
                        lambda jobs, module: (started.append(module), original(jobs, module)))
    argv = ["tree-loop", "tree-loop-reference", "--world", "tree_iid_v3_3x1", "--generations", "150", "--quiet"]
    assert main(argv + ["--report", str(tmp_path / "auto")]) == 0
    assert main(argv + ["--jobs", "1", "--report", str(tmp_path / "one")]) == 0
    assert started == ["exactcheck.tree.generation_audit"] and not executors._EARLY  # started, and taken

    def verdicts(folder):
        report = json.loads(next((tmp_path / folder).glob("*.json")).read_text())
        return [(v["check"], v["outcome"], v.get("pvalue"), v.get("samples")) for v in report["verdicts"]]
    assert verdicts("auto") == verdicts("one")
