"""Power, measured: the selftest passes the reference and detects every mutant by the check
family expected to catch it, every check run to its budget. The default run does it at level quick
(50,000 trials per world); the slow run (``-m slow``) repeats it at level standard, the level of
the README's main command and of reports/selftest-standard.json."""
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
    "accept_on_equal_uniform": "no_forbidden_token",
    "reseeded_generator": "sequence",
    "shared_uniforms": "correction_token",
    "unguarded_zero_residual": "no_forbidden_token",
    "zero_residual_to_vocab": "contract",
    "ratio_in_half_precision": "acceptance",
    "tiny_q_accepted": "no_forbidden_token",
    "uninitialised_unseeded_rows": "seeded_rows",
    "exponential_race_nan": "no_forbidden_token",
}


def test_every_mutant_has_an_expectation():
    assert set(EXPECTED_LAW) == set(MUTANTS)


LEVELS = ["quick", pytest.param("standard", marks=pytest.mark.slow)]


@pytest.mark.parametrize("level", LEVELS)
def test_reference_passes(request, level):
    ref = request.getfixturevalue(f"{level}_selftest").reference
    assert ref.passed, [v.describe() for v in ref.failed]
    assert all(v.outcome is Outcome.EXACT for v in ref.verdicts)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_detected(request, level, name):
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants if m == name)
    assert not audit.passed
    laws = {v.law for v in audit.failed}
    assert EXPECTED_LAW[name] in laws, laws


@pytest.mark.parametrize("name", ["accept_on_equal_uniform", "unguarded_zero_residual",
                                  "zero_residual_to_vocab", "ratio_in_half_precision",
                                  "uninitialised_unseeded_rows", "exponential_race_nan"])
@pytest.mark.parametrize("level", LEVELS)
def test_edge_mutants_are_invisible_to_sampling(request, level, name):
    """These differ from the reference only on events of probability ~0 (u == 0, a rounding
    rejection, a ratio rounded to float16, per-row generators): every statistical check passes
    them and only a deterministic property fails them — no check claims what it cannot see."""
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants if m == name)
    assert {v.world for v in audit.failed} <= {"properties", "inputs"}  # deterministic checks only
    assert EXPECTED_LAW[name] in {v.law for v in audit.failed}
