"""``exactcheck replay`` trusts neither the file nor the subject (issue 41, "Replay trusts the file").

A genuine reproducer is made by the property search on a mutant with a boundary finding, then
tampered: every bad file is one error line and exit 2, with no traceback and no module it names
imported (a marker module that leaves a file at import time shows it). Subjects that crash
(``SystemExit`` included), return None or a wrong shape, or make no draw the forcing reaches are
never "holds" (exit 1); the reference verifier holds; the mutant still fails."""
import copy
import json
import math
import sys

import pytest

from exactcheck.cli import main
from exactcheck.step.mutants import mutant
from exactcheck.step.properties import reproducer, search
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.step.replay import STILL_FAILS, replay, validate_reproducer

# boundary findings the edge corpus meets at once: (mutant, property)
NO_FORBIDDEN = ("accept_on_equal_uniform", "no_forbidden_token")  # forced value zero, float64 torch.rand
CONTRACT = ("zero_residual_to_vocab", "contract")  # forced value one_minus_ulp, float64 torch.rand
REFERENCE = "exactcheck.contracts.reference_verifier:reference_verifier"

MARKER_MODULE = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").write_text("the module was imported")
from exactcheck.contracts.reference_verifier import reference_verifier as verifier
'''

SUBJECTS = '''
import torch
from exactcheck.contracts.reference_verifier import reference_verifier

def raises(target_probs, draft_probs, draft_tokens, generator):
    raise ValueError("boom")

def exits(target_probs, draft_probs, draft_tokens, generator):
    raise SystemExit(0)

def returns_none(target_probs, draft_probs, draft_tokens, generator):
    return None

def wrong_shape(target_probs, draft_probs, draft_tokens, generator):
    return torch.zeros(target_probs.shape[0], 1, dtype=torch.int64)

def wrong_dtype(target_probs, draft_probs, draft_tokens, generator):
    return reference_verifier(target_probs, draft_probs, draft_tokens, generator).float()

def no_draws(target_probs, draft_probs, draft_tokens, generator):
    """Keeps the contract without a random number: rejects every draft, emits the target's argmax."""
    out = torch.full((draft_tokens.shape[0], draft_tokens.shape[1] + 1), -1, dtype=torch.int64)
    out[:, 0] = target_probs[:, 0].argmax(-1)
    return out

def interrupted(target_probs, draft_probs, draft_tokens, generator):
    raise KeyboardInterrupt
'''


def _genuine(name: str, prop: str) -> dict:
    result = search(mutant(name), prop, examples=1, seed=0)
    assert result.failure is not None
    return json.loads(json.dumps(reproducer(f"exactcheck.step.mutants:{name}", result.failure, 0)))


@pytest.fixture(scope="module")
def genuine():
    return {prop: _genuine(name, prop) for name, prop in (NO_FORBIDDEN, CONTRACT)}


@pytest.fixture
def room(tmp_path, monkeypatch):
    """tmp_path as the working directory (importable, as ``load_subject`` makes it), holding the
    marker module and the hostile subjects under names no other test imports."""
    tag = tmp_path.name.replace("-", "_")
    marker, subjects = f"marker_{tag}", f"hostile_{tag}"
    (tmp_path / f"{marker}.py").write_text(MARKER_MODULE)
    (tmp_path / f"{subjects}.py").write_text(SUBJECTS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, marker, subjects
    for name in (marker, subjects):
        sys.modules.pop(name, None)


def _write(path, record) -> str:
    path.write_text(json.dumps(record))  # NaN is written as JSON NaN, which Python's reader takes
    return str(path)


def _set(record: dict, field: str, value) -> dict:
    record = copy.deepcopy(record)
    *parents, last = field.split(".")
    holder = record
    for part in parents:
        holder = holder[part]
    if value is _DELETE:
        del holder[last]
    else:
        holder[last] = value
    return record


_DELETE = object()

TAMPERED = [  # (field, value, words the error line says)
    ("seed", math.nan, "seed (nan) must be an integer"),
    ("seed", "x", "seed ('x') must be an integer"),
    ("seed", True, "seed (True) must be an integer"),
    ("seed", -1, "seed (-1) must be an integer in [0, 2^63 - 1]"),
    ("seed", 2 ** 64, "seed"),
    ("seed", _DELETE, "the field 'seed' is missing"),
    ("case.vocab_size", 2 ** 40, "case.vocab_size (1099511627776) must be an integer"),
    ("case.vocab_size", 3.0, "case.vocab_size (3.0) must be an integer"),
    ("case.batch", True, "case.batch (True) must be an integer"),
    ("case.batch", 4096, "inconsistent with itself"),  # 4096 x 3 x 3 is small, but no file keeps such inputs
    ("case.draft_length", 0, "case.draft_length (0)"),
    ("case.draft_length", _DELETE, "case: the field 'draft_length' is missing"),
    ("case.dtype", "float7", "case.dtype ('float7') must be one of float32, float16, bfloat16"),
    ("case.row_kind", "zeros", "inputs.target_probs is not the tensor the case builds"),
    ("case.seed", 1, "inconsistent with itself"),
    ("case.colour", "red", "case: unknown field 'colour'"),
    ("case", [1, 2], "case ([1, 2]) must be an object"),
    ("value", 1.5, "value (1.5) must be one of zero"),
    ("value", math.nan, "value (nan) must be one of zero"),
    ("value", "half", "value ('half')"),
    ("value", "one_minus_ulp", "reachability.value (0.0) is not what the forced value 'one_minus_ulp' delivers"),
    ("value", None, "value (None)"),
    ("schema", "exactcheck.reproducer/9", "is not an exactcheck reproducer or audit report"),
    ("property", "no_crash", "property ('no_crash') must be one of contract"),
    ("rule", "token-wise-ish", "rule ('token-wise-ish') must name a known rule"),
    ("reachability.dtype", "float7", "reachability.dtype ('float7') must be null or a comma-separated list"),
    ("reachability.value", 1.5, "reachability.value (1.5) must be null or a finite uniform in [0, 1)"),
    ("reachability.value", math.nan, "reachability.value (nan)"),
    ("reachability.probability", math.inf, "reachability.probability (inf) must be null or a finite number"),
    ("reachability.draws", 2, "forced_elements names 1 elements, but reachability.draws says 2"),
    ("reachability.draw_function", "os.system", "reachability.draw_function ('os.system')"),
    ("forced_elements", [-1], "forced_elements[0] (-1) must be an integer"),
    ("forced_elements", ["0"], "forced_elements[0] ('0') must be an integer"),
    ("forced_elements", [0, 0], "forced_elements ([0, 0]) must name each element once"),
    ("row", 7, "row (7) must be an integer in [0, 1]"),
    ("output", [1, 2], "output ([1, 2]) must be null or a list of 3 token ids"),
    ("inputs.draft_tokens", [[0, 0], [0, 0]], "inputs.draft_tokens is not the tensor the case builds"),
    ("command", "rm -rf /", "unknown field 'command'"),
]


def _assert_usage_error(capsys, argv, words: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("exactcheck: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and captured.out == ""
    assert words in err, err
    return err


@pytest.mark.parametrize("field,value,words", TAMPERED, ids=[(f"{f}=<deleted>" if v is _DELETE else f"{f}={v!r}")[:40] for f, v, _ in TAMPERED])
def test_a_tampered_file_is_one_line_and_exit_2_before_its_subject_is_imported(genuine, room, capsys,
                                                                               field, value, words):
    tmp_path, marker, _ = room
    record = _set(genuine["no_forbidden_token"], "subject", f"{marker}:verifier")
    path = _write(tmp_path / "tampered.json", _set(record, field, value))
    err = _assert_usage_error(capsys, ["replay", path], words)
    assert err.startswith(f"exactcheck: error: {path}: ") or "is not an exactcheck reproducer" in err
    assert not (tmp_path / "IMPORTED").exists()


@pytest.mark.parametrize("subject", ["os:system; rm -rf /", "os system", "os:", ":system", "", "../evil:run",
                                     "os:system()", 42, None, ["os", "system"], "a" * 2000])
def test_a_subject_not_of_the_module_callable_form_is_refused_unimported(genuine, room, capsys, subject):
    tmp_path, _, _ = room
    path = _write(tmp_path / "subject.json", _set(genuine["no_forbidden_token"], "subject", subject))
    _assert_usage_error(capsys, ["replay", path], "subject (")


def test_a_case_of_terabytes_is_refused_by_its_element_count(genuine, room, capsys):
    tmp_path, marker, _ = room
    record = _set(genuine["no_forbidden_token"], "subject", f"{marker}:verifier")
    record = _set(_set(_set(record, "inputs", None), "case.vocab_size", 1 << 20), "case.batch", 4096)
    record["case"]["draft_length"] = 256
    _assert_usage_error(capsys, ["replay", _write(tmp_path / "huge.json", record)], "elements per tensor")
    assert not (tmp_path / "IMPORTED").exists()


def test_one_bad_reproducer_in_an_audit_report_stops_the_replay_before_any_import(genuine, room, capsys):
    tmp_path, marker, _ = room
    good = _set(genuine["no_forbidden_token"], "subject", f"{marker}:verifier")
    report = {"schema": "exactcheck.audit/1",
              "verdicts": [{"reproducer": good}, {"reproducer": _set(good, "seed", "x")}]}
    path = _write(tmp_path / "audit.json", report)
    _assert_usage_error(capsys, ["replay", path], f"{path}: verdict 1's reproducer: seed ('x')")
    assert not (tmp_path / "IMPORTED").exists()


def test_json_nested_past_the_parser_is_one_line(room, capsys):
    tmp_path, _, _ = room
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    _assert_usage_error(capsys, ["replay", str(path)], "is not JSON")


def test_the_marker_module_is_imported_when_the_file_is_good(genuine, room, capsys):
    """The control of the tests above: a valid file naming the marker module does import it
    (replay runs the named subject's code), and the reference it re-exports holds."""
    tmp_path, marker, _ = room
    path = _write(tmp_path / "good.json", _set(genuine["no_forbidden_token"], "subject", f"{marker}:verifier"))
    assert main(["replay", path]) == 0
    assert f"holds for {marker}:verifier" in capsys.readouterr().out
    assert (tmp_path / "IMPORTED").exists()


@pytest.mark.parametrize("subject,words", [
    ("raises", "crashed: subject raised ValueError: boom"),
    ("exits", "crashed: subject raised SystemExit: 0"),
    ("returns_none", "broke the contract: output is not a torch.Tensor"),
    ("wrong_shape", "broke the contract: output shape is not [B, k+1]"),
    ("wrong_dtype", "broke the contract: output dtype is not int64"),
    ("no_draws", "the forced draw was not consumed: the subject made no draw exactcheck forces"),
])
def test_a_subject_that_crashes_breaks_the_contract_or_draws_nothing_never_holds(genuine, room, capsys,
                                                                                 subject, words):
    tmp_path, _, subjects = room
    path = _write(tmp_path / "genuine.json", genuine["no_forbidden_token"])
    assert main(["replay", path, "--subject", f"{subjects}:{subject}"]) == 1
    out = capsys.readouterr().out
    assert words in out and "holds" not in out, out


@pytest.mark.parametrize("subject", ["raises", "exits", "returns_none", "wrong_shape"])
def test_on_the_contract_property_a_crash_or_broken_output_still_fails(genuine, room, capsys, subject):
    tmp_path, _, subjects = room
    path = _write(tmp_path / "contract.json", genuine["contract"])
    assert main(["replay", path, "--subject", f"{subjects}:{subject}"]) == 1
    out = capsys.readouterr().out
    assert "still fails" in out and "holds" not in out, out


def test_keyboard_interrupt_from_the_subject_passes_through(genuine, room):
    _, _, subjects = room
    module = __import__(subjects)
    with pytest.raises(KeyboardInterrupt):
        replay(module.interrupted, validate_reproducer(genuine["no_forbidden_token"]))


def test_the_reference_holds_and_the_mutant_still_fails_on_a_genuine_reproducer(genuine, room, capsys):
    tmp_path, _, _ = room
    for prop, (name, _) in (("no_forbidden_token", NO_FORBIDDEN), ("contract", CONTRACT)):
        path = _write(tmp_path / f"{prop}.json", genuine[prop])
        assert main(["replay", path, "--subject", REFERENCE]) == 0
        assert f"holds for {REFERENCE}" in capsys.readouterr().out
        assert main(["replay", path]) == 1
        out = capsys.readouterr().out
        assert "still fails" in out and "holds" not in out, out
    assert replay(reference_verifier, validate_reproducer(genuine["no_forbidden_token"])).holds
    outcome = replay(mutant(NO_FORBIDDEN[0]), validate_reproducer(genuine["no_forbidden_token"]), as_recorded=True)
    assert outcome.status == STILL_FAILS


@pytest.mark.parametrize("field,value,words", [
    # zero is 0.0 in every dtype: consistent in itself, but the mutant draws float64
    ("reachability.dtype", "float32", "the file records torch.rand (float32) draws of 0.0"),
    ("reachability.draw_function", "Tensor.uniform_", "the file records Tensor.uniform_ (float64) draws"),
    ("forced_elements", [10 ** 6], "the file forces element 1000000"),
])
def test_a_forced_draw_the_recorded_subject_does_not_receive_as_recorded_never_holds(genuine, room, capsys,
                                                                                     field, value, words):
    tmp_path, _, _ = room
    path = _write(tmp_path / "as-recorded.json", _set(genuine["no_forbidden_token"], field, value))
    assert main(["replay", path]) == 1
    out = capsys.readouterr().out
    assert "the forced draw was not consumed: " + words in out and "holds" not in out, out


def test_a_dtype_the_value_cannot_deliver_in_is_inconsistent_exit_2(genuine, room, capsys):
    """one_minus_ulp is 1 - 2^-53 in float64 and 1 - 2^-24 in float32: a file saying float32 with
    the float64 value contradicts itself."""
    tmp_path, _, _ = room
    record = _set(genuine["contract"], "reachability.dtype", "float32")
    _assert_usage_error(capsys, ["replay", _write(tmp_path / "dtype.json", record)], "inconsistent with itself")


def test_every_field_the_writer_writes_is_one_the_validator_knows(genuine):
    for record in genuine.values():
        assert validate_reproducer(record) is record
    ruled = _genuine(*NO_FORBIDDEN)
    ruled["rule"] = "token-wise"
    validate_reproducer(ruled)
