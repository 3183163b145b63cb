import pytest
import torch

from exactcheck.selftest import run_selftest


@pytest.fixture(scope="session")
def standard_selftest():
    """The standard-level selftest (reference + every mutant), run once per test session."""
    torch.manual_seed(0)  # nothing should depend on it; set so a stray global draw is repeatable
    return run_selftest(level="standard", seed=0)
