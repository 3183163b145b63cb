"""The house: no import circle, light entry points, one plan that every front end reads."""
import ast
import pathlib
import subprocess
import sys

import pytest

from exactcheck import run_audit
from exactcheck.plan import AlphaBudget, AuditOptions, CheckKind, plan_step_audit

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "exactcheck"


def _module_imports() -> dict[str, set[str]]:
    """exactcheck module -> exactcheck modules it imports at module level (imports inside
    functions and under ``if TYPE_CHECKING`` are deferred, so they cannot form a circle)."""
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("exactcheck"):
                targets.add(node.module)
                targets.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("exactcheck"))
        graph[name] = targets
    return {m: {t for t in ts if t in graph and t != m} for m, ts in graph.items()}


def test_no_import_circle_in_the_package():
    graph = _module_imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module):
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(target):] + [target]))
            if target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_library_never_imports_its_cli():
    graph = _module_imports()
    assert not [m for m, targets in graph.items() if "exactcheck.cli" in targets and m != "exactcheck.__main__"]


def _imports_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout.split()
    return set(out)


def test_loading_the_pytest_plugin_imports_neither_torch_nor_scipy():
    loaded = _imports_after("import exactcheck.pytest_plugin")
    assert "torch" not in loaded and "scipy" not in loaded


def test_help_imports_no_torch():
    loaded = _imports_after("from exactcheck.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded


def test_list_imports_no_torch():
    loaded = _imports_after("from exactcheck.cli import main\ntry:\n    main(['list'])\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded and "scipy" not in loaded


def test_the_stored_listing_is_what_the_code_lists():
    """``exactcheck list`` prints a stored copy (no torch); it must equal the listing built from
    the code. On failure: ``python -m exactcheck.catalogue`` rewrites the copy."""
    from exactcheck.catalogue import build_listing
    from exactcheck.catalogue_listing import LISTING
    assert LISTING == build_listing()


def test_the_plan_names_every_verdict_of_the_audit():
    options = AuditOptions.build(level="quick", worlds=["three_token", "ctx_v3_l5_k3", "properties/contract", "inputs"])
    plan = plan_step_audit(options)
    from exactcheck.step.reference import reference_verifier
    audit = run_audit(reference_verifier, options=options, progress=False)
    assert [v.check for v in audit.verdicts] == plan.names
    assert {c.kind for c in plan.checks} == {CheckKind.LAW, CheckKind.PROPERTY, CheckKind.INPUTS}


def test_the_planner_plans_with_the_share_the_tests_use():
    """With early stopping the fixed-budget tests get alpha/2 under Holm: the planner sizes the
    budget at that share, so the detectable TV promised is the one delivered."""
    from exactcheck.stats.planning import default_plan
    options = AuditOptions.build(level="quick")
    plan = plan_step_audit(options)
    assert plan.budget == AlphaBudget(options.alpha, 53, stop_early=True)
    planner = default_plan(options.target_tv, plan.budget.holm_alpha, options.cap, options.level.min_samples)
    assert planner.share == pytest.approx(plan.budget.first_share)
    assert plan.budget.log_e_threshold == pytest.approx(__import__("math").log(2 * 53 / options.alpha))


def test_options_refuse_bad_values_with_the_rule():
    from exactcheck.errors import UsageError
    for bad, words in (({"alpha": 2.0}, "alpha (2.0) must be in (0, 1)"), ({"level": "fast"}, "level ('fast')"),
                       ({"require": ["speed"]}, "category ('speed')")):
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
            AuditOptions.build(**bad)
