"""Power, measured: the standard selftest passes the reference and detects every mutant."""
import pytest

from exactcheck import MUTANTS, Outcome

# The check family expected to catch each mutant (at least one failing verdict of that law).
EXPECTED_LAW = {
    "trust_draft": "first_token",
    "resample_from_target": "correction_token",
    "unclamped_residual": "correction_token",
    "wrong_normaliser": "correction_token",
    "inverted_ratio": "first_token",
    "accept_if_p_ge_q": "accepted_length",
    "no_stop_at_first_rejection": "accepted_length",
    "bonus_from_draft": "bonus_token",
    "bonus_argmax": "bonus_token",
    "no_bonus_token": "accepted_length",
    "shifted_target_rows": "first_token",
    "accept_on_equal_uniform": "forbidden_token@u=zero",
    "reseeded_generator": "sequence",
    "shared_uniforms": "correction_token",
}


def test_every_mutant_has_an_expectation():
    assert set(EXPECTED_LAW) == set(MUTANTS)


def test_reference_passes_standard(standard_selftest):
    ref = standard_selftest.reference
    assert ref.passed, [v.describe() for v in ref.failed]
    assert all(v.outcome is Outcome.EXACT for v in ref.verdicts)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_detected(standard_selftest, name):
    audit = next(a for m, _, a in standard_selftest.mutants if m == name)
    assert not audit.passed
    laws = {v.law for v in audit.failed}
    assert EXPECTED_LAW[name] in laws, laws


def test_boundary_only_mutant_is_invisible_to_sampling(standard_selftest):
    """u <= p/q differs from the reference only when u == 0: the statistical checks must pass it,
    and only the forced-uniform check may fail it (a check that sees nothing is not claimed)."""
    audit = next(a for m, _, a in standard_selftest.mutants if m == "accept_on_equal_uniform")
    assert {v.law for v in audit.failed} == {"forbidden_token@u=zero"}
