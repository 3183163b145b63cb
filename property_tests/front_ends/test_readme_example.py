"""The README's front door, run as written (issue 65).

The worked example is the ```python block that follows the comment ``<!-- worked example: ...``
in README.md, and the planted bug the one-line block after ``<!-- planted bug: ...``: it replaces
the example's first line that assigns the same name. Both are taken out of README.md, written to
a file and audited at the quick level on a few small worlds: the example passes, the planted bug
is found on the world the README's printed excerpt names. examples/my_verifier.py holds the same
two functions, and the README stays at most 200 lines.
"""
from __future__ import annotations

import importlib.util
import pathlib
import re

from exactcheck import Outcome, run_audit

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLE_FILE = ROOT / "examples" / "my_verifier.py"
# a context world, a step world, and the boundary-uniform contract search (where a verifier
# without the zero-residual guard crashes)
WORLDS = ["three_token", "random_v5_k3", "properties/contract"]


def _block(marker: str) -> str:
    """The ```python block right after ``<!-- MARKER ... -->`` in README.md."""
    text = README.read_text()
    assert text.count(f"<!-- {marker}") == 1, f"README.md needs exactly one <!-- {marker} ... --> comment"
    after = text.split(f"<!-- {marker}", 1)[1].split("-->", 1)[1]
    found = re.match(r"\s*```python\n(.*?\n)```\n", after, re.S)
    assert found, f"the <!-- {marker} --> comment must be followed by a ```python block"
    return found.group(1)


def _planted(example: str) -> str:
    """The example with the planted bug's line in place of the first line assigning its name."""
    bug = _block("planted bug").strip("\n")
    assert "\n" not in bug, "the planted bug is one line"
    name = bug.split("=", 1)[0].strip()
    lines = example.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name} ="))
    lines[at] = bug + "\n"
    return "".join(lines)


def _load(source: str, tmp_path: pathlib.Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.verifier


def _function(source: str) -> str:
    """From ``def`` to the end: the function without its imports."""
    return source[source.index("def "):]


def test_the_readme_is_at_most_200_lines():
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines; the front door is 200 at most (issue 65)"


def test_the_worked_example_passes_as_written(tmp_path):
    verifier = _load(_block("worked example"), tmp_path, "readme_verifier")
    result = run_audit(verifier, level="quick", worlds=WORLDS, progress=False)
    assert result.passed, "\n\n".join(v.describe() for v in result.failed)
    assert {v.outcome for v in result.verdicts} == {Outcome.EXACT}


def test_the_planted_bug_is_found_where_the_readme_says(tmp_path):
    buggy = _load(_planted(_block("worked example")), tmp_path, "readme_buggy_verifier")
    result = run_audit(buggy, level="quick", worlds=WORLDS, progress=False)
    assert not result.passed and all(v.outcome is Outcome.DEFECT for v in result.failed)
    # the printed excerpt: its first failing check, on the world its reproduce line names
    text = README.read_text()
    failed_on = re.search(r"exactcheck audit examples\.my_verifier:buggy_verifier: FAILED on (\S+)/(\S+) ", text)
    world = re.search(r"reproduce: exactcheck audit examples\.my_verifier:buggy_verifier .*--world (\S+)", text)
    assert failed_on and world and failed_on.group(1) == world.group(1)
    alone = run_audit(buggy, level="quick", worlds=[world.group(1)], progress=False)
    assert [v.check for v in alone.failed][:1] == ["/".join(failed_on.groups())]


def test_without_the_zero_residual_guard_the_contract_search_crashes_it(tmp_path):
    """The README says so: rows one ulp apart and a forced uniform of 1 - 2^-53 leave an
    all-zero residual, and torch.multinomial raises."""
    source = _block("worked example")
    guard = next(line for line in source.splitlines(keepends=True) if line.strip().startswith("residual = torch.where"))
    unguarded = _load(source.replace(guard, ""), tmp_path, "readme_unguarded_verifier")
    result = run_audit(unguarded, level="quick", worlds=["properties/contract"], progress=False)
    assert [(v.check, v.outcome) for v in result.failed] == [("properties/contract", Outcome.CRASHED)]


def test_examples_my_verifier_holds_the_readme_functions():
    """``exactcheck audit examples.my_verifier:verifier`` (and ``:buggy_verifier``) audits what
    the README shows."""
    example = _block("worked example")
    held = EXAMPLE_FILE.read_text()
    assert _function(example) in held
    assert _function(_planted(example)).replace("def verifier(", "def buggy_verifier(", 1) in held
