"""Power, measured: the selftest passes the reference and detects every mutant by the check
family expected to catch it, every check run to its budget. The default run does it at level quick
(50,000 trials per world); the slow run (``-m slow``) repeats it at level standard, the level of
the README's main command and of reports/selftest-standard-seed0.json."""
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
    # mutants of other registered rules (each declares the rule it means to follow)
    "block_stop_from_current_row": "accepted_length",
    "block_correction_at_next_position": "correction_token",
    "block_accepts_at_zero": "no_forbidden_token",
    "block_product_of_uniforms": "first_token",
    "threshold_acc_multiplied": "accepted_length",
}


def test_every_mutant_has_an_expectation():
    assert set(EXPECTED_LAW) == set(MUTANTS)


# the audits of every mutant run once per level (conftest.py's session fixtures): about 100 s at quick on 2
# cores, so the quick level is a long test and the standard level a slow one
LEVELS = [pytest.param("quick", marks=pytest.mark.long), pytest.param("standard", marks=pytest.mark.slow)]


@pytest.mark.long
@pytest.mark.parametrize("level", LEVELS)
def test_reference_passes(request, level):
    ref = request.getfixturevalue(f"{level}_selftest").reference
    assert ref.passed, [v.describe() for v in ref.failed]
    assert all(v.outcome is Outcome.EXACT for v in ref.verdicts)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", ["block_stop_from_current_row", "block_correction_at_next_position",
                                  "block_product_of_uniforms"])
def test_a_non_exact_block_verifier_is_an_exactness_defect_not_only_a_conformance_one(request, level, name):
    """These block mutants change the output law, so a rule-free exactness law fails too."""
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants if m == name)
    assert any(v.category.value == "exactness" and v.kind.statistical for v in audit.failed)


@pytest.mark.parametrize("level", LEVELS)
def test_a_subject_that_breaks_its_declared_lossy_rule_is_a_conformance_finding(request, level):
    """threshold_acc_multiplied declares a lossy rule and does not follow it: every finding is about
    conformance, none calls what the declared rule itself does an exactness defect."""
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants
                 if m == "threshold_acc_multiplied")
    assert audit.failed and {v.category.value for v in audit.failed} == {"conformance"}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(MUTANTS))
def test_mutant_detected(request, level, name):
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants if m == name)
    assert not audit.passed
    laws = {v.law for v in audit.failed}
    assert EXPECTED_LAW[name] in laws, laws


@pytest.mark.parametrize("name", ["accept_on_equal_uniform", "unguarded_zero_residual",
                                  "zero_residual_to_vocab", "ratio_in_half_precision",
                                  "uninitialised_unseeded_rows", "exponential_race_nan", "block_accepts_at_zero"])
@pytest.mark.parametrize("level", LEVELS)
def test_edge_mutants_are_invisible_to_sampling(request, level, name):
    """These differ from the reference only on events of probability ~0 (u == 0, a rounding
    rejection, a ratio rounded to float16, per-row generators): every statistical check passes
    them and only a deterministic property fails them — no check claims what it cannot see."""
    audit = next(a for m, _, a in request.getfixturevalue(f"{level}_selftest").mutants if m == name)
    assert {v.world for v in audit.failed} <= {"properties", "inputs"}  # deterministic checks only
    assert EXPECTED_LAW[name] in {v.law for v in audit.failed}
