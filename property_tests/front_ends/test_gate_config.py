"""The gate's config (issue 41): every field of ``[tool.exactcheck]`` and of each subject has its
type and range checked by ``read_config`` before any audit runs, as one ``UsageError`` line naming
the file, the subject, the field, the value and the rule; ``check_exempt`` refuses an exemption
that names no check or world of the subject's plan. No audit runs here."""
import pytest

from exactcheck.cli import main
from exactcheck.errors import UsageError
from exactcheck.gate import check_exempt, read_config
from exactcheck.options import AuditKind
from exactcheck.audit_kinds import plan_subject

REFERENCE = "exactcheck.contracts.reference_verifier:reference_verifier"


def _config(tmp_path, subject_lines: str = "", section_lines: str = ""):
    path = tmp_path / "pyproject.toml"
    path.write_text(f"[tool.exactcheck]\n{section_lines}\n[[tool.exactcheck.subject]]\n"
                    f'name = "sampler"\nverifier = "{REFERENCE}"\n{subject_lines}\n')
    return path


BAD = [  # (field, TOML value)
    ("alpha", '"0.1"'), ("alpha", "2"), ("alpha", "true"),
    ("exempt", "5"), ("exempt", '["x", 3]'),
    ("seed", '"abc"'), ("seed", "1.5"), ("seed", "-1"), ("seed", "true"),
    ("level", '"fast"'), ("device", "3"), ("require", '["nope"]'), ("worlds", '"three_token"'),
]


@pytest.mark.parametrize("field, value", BAD, ids=[f"{f}={v}" for f, v in BAD])
def test_a_bad_subject_field_is_one_usage_error_naming_it(tmp_path, field, value):
    path = _config(tmp_path, f"{field} = {value}")
    with pytest.raises(UsageError) as info:
        read_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message and "'sampler'" in message and f"{field} (" in message and "must be" in message


@pytest.mark.parametrize("field, value", [("seed", '"abc"'), ("alpha", "true"), ("level", '"fast"'),
                                          ("require", '"reproducible"')])
def test_a_bad_shared_default_names_the_section(tmp_path, field, value):
    with pytest.raises(UsageError, match=rf"\[tool\.exactcheck\]: {field} \("):
        read_config(_config(tmp_path, section_lines=f"{field} = {value}"))


@pytest.mark.parametrize("lines, field", [
    ('generations = 0', "generations"), ('greedy = "no"', "greedy"), ('policies = "top_k=2"', "policies"),
    ('policies = ["top_k=two"]', "policies"), ('policies = [{top_k = 0}]', "policies"),
    ('policies = [{top_q = 0.5}]', "policies"), ('shards = 1.5', "shards")])
def test_generator_settings_are_typed(tmp_path, lines, field):
    path = tmp_path / "pyproject.toml"
    path.write_text(f'[[tool.exactcheck.subject]]\nname = "loop"\ngenerator = "reference-loop"\n{lines}\n')
    with pytest.raises(UsageError, match=rf"subject 'loop': {field} \("):
        read_config(path)


def test_unknown_keys_are_still_refused(tmp_path):
    with pytest.raises(UsageError, match="takes no levle"):
        read_config(_config(tmp_path, 'levle = "quick"'))
    with pytest.raises(UsageError, match=r"\[tool\.exactcheck\] takes no worlds"):
        read_config(_config(tmp_path, section_lines='worlds = ["three_token"]'))


def test_the_cli_prints_one_line_and_exits_2_before_any_audit(tmp_path, capsys):
    path = _config(tmp_path, 'seed = "abc"')
    assert main(["gate", "--config", str(path), "--quiet"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("exactcheck: error: ")
    assert "seed ('abc') must be a non-negative integer" in lines[0]
    assert captured.out == ""  # nothing audited, no verdict printed


def test_a_valid_config_still_reads(tmp_path):
    path = _config(tmp_path, 'worlds = ["three_token", "properties/seeded_rows"]\nexempt = ["three_token"]\n'
                             'seed = 7\nalpha = 0.01\ndevice = "cpu"\nrequire = ["reproducible"]\n'
                             'trials = {three_token = 6000}\nmax_seconds = 30\ncall_elements = "auto"',
                   section_lines='level = "quick"\nseed = 3')
    [subject] = read_config(path)
    assert subject.name == "sampler" and subject.kind is AuditKind.VERIFIER and subject.target == REFERENCE
    assert subject.options.seed == 7 and subject.options.alpha == 0.01 and subject.level == "quick"
    assert subject.options.worlds == ("three_token", "properties/seeded_rows")
    assert subject.options.trials == (("three_token", 6000),) and "reproducibility" in subject.options.require
    assert subject.exempt == ("three_token",)
    assert read_config(path, level="standard")[0].level == "standard"


def test_generator_policies_become_decoding_policies(tmp_path):
    from exactcheck.contracts.policy import DecodingPolicy
    path = tmp_path / "pyproject.toml"
    path.write_text('[[tool.exactcheck.subject]]\ngenerator = "reference-loop"\ngreedy = false\ngenerations = 100\n'
                    'policies = ["temperature=0.7,top_k=2", {top_p = 0.8}]\n')
    [subject] = read_config(path)
    assert subject.settings == {"greedy": False, "policies": (DecodingPolicy(0.7, top_k=2), DecodingPolicy(top_p=0.8))}


def test_check_exempt_names_an_unknown_entry_and_takes_checks_and_worlds(tmp_path):
    path = _config(tmp_path, 'exempt = ["properties/seeded_row", "three_token", "properties/same_seed"]')
    [subject] = read_config(path)
    plan = plan_subject(subject.kind, REFERENCE, options=subject.options, **subject.settings)
    with pytest.raises(UsageError) as info:
        check_exempt(subject, plan)
    message = str(info.value)
    assert "'properties/seeded_row'" in message and "did you mean 'properties/seeded_rows'" in message
    assert "'three_token'" in message.split("valid names include")[1]  # a few valid names listed
    assert "properties/same_seed'" not in message.split("valid names")[0]  # only the unknown one named

    [subject] = read_config(_config(tmp_path, 'exempt = ["properties/seeded_rows", "three_token", '
                                              '"ctx_v8_l3_k2/contract"]'))
    check_exempt(subject, plan_subject(subject.kind, REFERENCE, options=subject.options, **subject.settings))


def test_a_tree_verifier_is_a_gate_subject(tmp_path):
    """``tree = "..."`` names a tree verifier: its settings are checked against the tree audit's,
    its exemptions against its plan, and it is audited through the registry (a mutant fails)."""
    from exactcheck.gate import run_gate
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.exactcheck]\nlevel = "quick"\n\n[[tool.exactcheck.subject]]\nname = "ref"\n'
                    'tree = "tree-reference:multi_round"\nworlds = ["tree_iid_v3_3x1"]\n'
                    'exempt = ["tree_iid_v3_3x1/first_token"]\n\n[[tool.exactcheck.subject]]\n'
                    'tree = "tree-mutant:tree_read_as_chain"\nworlds = ["tree_iid_v3_3x1"]\n')
    ref, mutant = read_config(path)
    assert ref.kind is AuditKind.TREE and ref.kind.value == "tree" and ref.options.worlds == ("tree_iid_v3_3x1",)
    results = run_gate([ref, mutant], progress=False, isolate=False)
    assert [r.passed for r in results] == [True, False]
    assert {v.check for v in results[0].audit.verdicts} >= {"tree_iid_v3_3x1/sequence", "tree_iid_v3_3x1/first_token"}
    path.write_text('[[tool.exactcheck.subject]]\ntree = "tree-reference:multi_round"\ngenerations = 5\n')
    with pytest.raises(UsageError, match="a tree audit takes no generations"):
        read_config(path)
    path.write_text('[[tool.exactcheck.subject]]\ntree = "tree-reference:multi_round"\nexempt = ["tree_iid_v3_3x1/firsttoken"]\n')
    with pytest.raises(UsageError, match="did you mean 'tree_iid_v3_3x1/first_token'"):
        run_gate(read_config(path), progress=False)
