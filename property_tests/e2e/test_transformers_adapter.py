"""transformers' _speculative_sampling through the adapter (skipped where transformers is absent).

What transformers does at the boundaries is measured by examples/audit_transformers.py and
recorded in reports/; here we check that the adapter drives it faithfully."""
import pytest

pytest.importorskip("transformers")

from exactcheck import run_audit  # noqa: E402
from exactcheck.adapters.hf_transformers import speculative_sampling_verifier  # noqa: E402
from exactcheck.step.properties import check_property  # noqa: E402
from exactcheck.step.strategies import VerifyCase  # noqa: E402
from exactcheck.report.verdict import Outcome  # noqa: E402


@pytest.mark.long
def test_adapter_passes_the_statistical_checks_on_small_worlds():
    result = run_audit(speculative_sampling_verifier(), level="quick", seed=1,
                       worlds=["three_token", "ctx_v3_l5_k3"], progress=False)
    assert all(v.outcome is Outcome.EXACT for v in result.verdicts), \
        [v.describe() for v in result.failed]


def test_adapter_keeps_the_contract_and_is_reproducible_on_ordinary_rows():
    case = VerifyCase(8, 3, 4, "dirichlet", "independent", "any", 0)
    verifier = speculative_sampling_verifier()
    assert check_property(verifier, "contract", case, "ratio_minus") is None
    assert check_property(verifier, "same_seed", case, None) is None
    assert check_property(verifier, "row_independence", case, "one_minus_ulp") is None
