import os
import signal

import pytest
import torch

from exactcheck.audit_kinds import load_result_types
from exactcheck.step.selftest import run_selftest

load_result_types()  # the tests read committed reports of every kind back (exactcheck.report.result.result_type)

# Ctrl-C is part of what the tests check (interrupted audits keep what they finished). A runner
# that starts the suite as a background job hands it SIGINT ignored, and Python then raises no
# KeyboardInterrupt at all (nor do the subprocesses it starts): restore the default handler.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# the suite already runs a test per core (pytest-xdist): the commands it runs (in this process or as
# subprocesses) keep their draws in their own process (``--jobs auto`` reads this; test_jobs_auto.py
# checks auto itself)
os.environ["EXACTCHECK_JOBS"] = "1"


def _selftest(level: str):
    """The selftest (reference + every mutant) at ``level``, run once per test session. Every
    check runs to its budget (no early stop) so each mutant is seen by every law that can."""
    torch.manual_seed(0)  # nothing should depend on it; set so a stray global draw is repeatable
    return run_selftest(level=level, seed=0, stop_early=False)


@pytest.fixture(scope="session")
def quick_selftest():
    """Level quick (about 100 s here): the long run's power check (test_mutants.py)."""
    return _selftest("quick")


@pytest.fixture(scope="session")
def standard_selftest():
    """Level standard (about 210 s here): the same checks in the slow run (``-m slow``)."""
    return _selftest("standard")


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` the long tests that slow_in_ci.py moves out of CI's long step. Where whole files
    were collected (no ``::`` in the arguments, no ``-k``), an id there whose file was collected but
    which names no test is an error (a renamed test or parameter)."""
    from slow_in_ci import SLOW_IN_CI
    ids = {item.nodeid for item in items}
    files = {nodeid.split("::")[0] for nodeid in ids}
    whole_files = not config.getoption("keyword") and not any("::" in str(a) for a in config.args)
    stale = sorted(i for i in SLOW_IN_CI if i.split("::")[0] in files and i not in ids) if whole_files else []
    if stale:
        raise pytest.UsageError(f"property_tests/slow_in_ci.py names tests that do not exist: {stale}")
    for item in items:
        if item.nodeid in SLOW_IN_CI:
            item.add_marker(pytest.mark.slow)
