import pytest
import torch

from exactcheck.step.selftest import run_selftest


@pytest.fixture(scope="session")
def standard_selftest():
    """The standard-level selftest (reference + every mutant), run once per test session. Every
    check runs to its budget (no early stop) so each mutant is seen by every law that can."""
    torch.manual_seed(0)  # nothing should depend on it; set so a stray global draw is repeatable
    return run_selftest(level="standard", seed=0, stop_early=False)
