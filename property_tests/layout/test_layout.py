"""The house: no import circle and no import that climbs a layer (imports inside functions and
under ``if TYPE_CHECKING:`` counted, toy_models included), no audit kind importing another, the
worlds importing only the contracts, no private name used across subpackages, a leaf every layer
may read, light entry points, one plan every front end reads."""
import ast
import math
import pathlib
import subprocess
import sys

import pytest

from exactcheck import run_audit
from exactcheck.options import AlphaBudget, AuditOptions, CheckKind
from exactcheck.step.plan import alpha_budget, budget_plan, plan_step_audit

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "exactcheck"
# code that imports the package from outside it: none may use its private names
OUTSIDE = ("property_tests", "benchmarks", "examples", "toy_models")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_statements(tree: ast.AST):
    """Every import statement: at module level, inside functions and classes, and under ``if
    TYPE_CHECKING:`` (a type-only import is an arrow too, even though it never runs)."""
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _imports(path: pathlib.Path, roots=("exactcheck",)) -> list[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for every import of the package (and of the
    other top-level ``roots`` named)."""
    out = []
    for node in _import_statements(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in roots:
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, None) for alias in node.names if alias.name.split(".")[0] in roots]
    return out


WORLDS = ROOT / "toy_models"


def _package_graph(with_worlds: bool = False) -> dict[str, set[str]]:
    """Module -> the modules it imports, within exactcheck (and toy_models, ``with_worlds``)."""
    tops = (PACKAGE, WORLDS) if with_worlds else (PACKAGE,)
    roots = ("exactcheck", "toy_models") if with_worlds else ("exactcheck",)
    modules = {_module_name(p): p for top in tops for p in top.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for module, alias in _imports(path, roots):
            # ``from exactcheck import arguments`` is an arrow to the submodule (running a package's
            # __init__ on the way to its submodule is not an arrow of its own)
            targets.add(f"{module}.{alias}" if f"{module}.{alias}" in modules else module)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


# The layers, bottom up (docs/layout.md, "Which way the arrows point"): a module may import its own
# layer and the layers below it, never one above. Within a layer the circle test keeps the order,
# except the audit kinds, which are siblings: no kind imports another (``KINDS``).
LAYERS = (
    ("leaves", ("exactcheck.errors", "exactcheck.rules", "exactcheck.version", "exactcheck.options",
                "exactcheck.progress", "exactcheck.memory", "exactcheck.reachability", "exactcheck.subject_call",
                "exactcheck.executors", "exactcheck.reproduce", "exactcheck.arguments", "exactcheck.loading",
                "exactcheck.catalogue_listing")),
    ("contracts", ("exactcheck.contracts",)),
    ("worlds", ("toy_models",)),
    ("statistics", ("exactcheck.stats",)),
    ("verdicts and reports", ("exactcheck.report", "exactcheck.core", "exactcheck.audit_run", "exactcheck.console",
                              "exactcheck.isolation")),
    ("shared machinery", ("exactcheck.forcing", "exactcheck.generation", "exactcheck.endpoints")),
    ("subjects the kinds build on", ("exactcheck.adapters", "exactcheck.corpus")),
    ("audit kinds", ("exactcheck.step", "exactcheck.tree", "exactcheck.e2e", "exactcheck.recurrent",
                     "exactcheck.serve", "exactcheck.cost")),
    ("the kinds' registry", ("exactcheck.audit_kinds", "exactcheck.catalogue")),
    ("front ends", ("exactcheck.cli", "exactcheck.__main__", "exactcheck.gate", "exactcheck.pytest_plugin",
                    "exactcheck")),
)
KINDS = LAYERS[[name for name, _ in LAYERS].index("audit kinds")][1]
# what toy_models (the worlds) may import of exactcheck: the contracts, and nothing else; and what
# may import toy_models: nothing below the shared machinery (the statistics take laws as data)
WORLDS_READ = ("exactcheck.contracts",)


def layer_of(module: str) -> int:
    """The layer of ``module``: the longest prefix named in ``LAYERS`` decides."""
    best, found = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    if found is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to docs/layout.md)")
    return found


def _kind_of(module: str) -> str | None:
    return next((kind for kind in KINDS if module == kind or module.startswith(kind + ".")), None)


def test_no_import_climbs_a_layer():
    climbing = [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                for module, targets in sorted(_package_graph(with_worlds=True).items()) for target in sorted(targets)
                if layer_of(target) > layer_of(module)]
    assert not climbing, f"{len(climbing)} climbing imports:\n" + "\n".join(climbing)


def test_no_audit_kind_imports_another_kind():
    """The kinds stand side by side on what is below them: what two kinds share lives in the
    contracts or the shared machinery, and only the registry composes kinds."""
    crossing = [f"{module} imports {target}" for module, targets in sorted(_package_graph().items())
                for target in sorted(targets)
                if _kind_of(module) and _kind_of(target) and _kind_of(module) != _kind_of(target)]
    assert not crossing, "\n".join(crossing)


def test_the_worlds_import_only_the_contracts_and_the_statistics_no_world():
    graph = _package_graph(with_worlds=True)
    worlds_out = [f"{m} imports {t}" for m, targets in sorted(graph.items()) if m.startswith("toy_models")
                  for t in sorted(targets) if t.startswith("exactcheck") and not t.startswith(WORLDS_READ)]
    assert not worlds_out, "\n".join(worlds_out)
    shared = [name for name, _ in LAYERS].index("shared machinery")
    worlds_in = [f"{m} imports {t}" for m, targets in sorted(graph.items()) if m.startswith("exactcheck")
                 and layer_of(m) < shared for t in sorted(targets) if t.startswith("toy_models")]
    assert not worlds_in, "\n".join(worlds_in)


def test_the_kind_test_sees_a_kind_importing_another(tmp_path):
    assert _kind_of("exactcheck.serve.runner") == "exactcheck.serve" and _kind_of("exactcheck.endpoints.apis") is None
    assert _kind_of("exactcheck.cost.served") != _kind_of("exactcheck.serve.settings")


def test_the_layer_test_sees_a_type_only_import_that_climbs(tmp_path):
    code = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from exactcheck.gate import GateResult\n"
    assert ("exactcheck.gate", "GateResult") in _imports(_write(tmp_path, code))
    assert layer_of("exactcheck.gate") > layer_of("exactcheck.report.json_md")


def test_no_import_circle_in_the_package_counting_imports_inside_functions():
    graph = _package_graph(with_worlds=True)
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


def test_the_circle_test_sees_an_import_inside_a_function(tmp_path):
    """The walk above reads function bodies: a lazy import that climbs back is an edge."""
    code = "def f():\n    from exactcheck.cli import main\n"
    assert ("exactcheck.cli", "main") in [(m, a) for m, a in _imports(_write(tmp_path, code))]


def _write(tmp_path, code: str) -> pathlib.Path:
    path = tmp_path / "probe.py"
    path.write_text(code)
    return path


def _subpackage(module: str) -> str:
    """exactcheck.step.runner -> exactcheck.step; exactcheck.core -> exactcheck; tests -> property_tests."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "exactcheck" and len(parts) > 2 else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_is_imported_across_subpackages():
    """What runners, reports, benchmarks and tests share is public; a ``_name`` stays in its room."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    found = []
    paths = [*PACKAGE.rglob("*.py"), *(p for top in OUTSIDE for p in (ROOT / top).rglob("*.py"))]
    for path in paths:
        importer = _module_name(path)
        for module, alias in _imports(path):
            target = f"{module}.{alias}" if f"{module}.{alias}" in modules else module
            private = any(_private(part) for part in [alias or "", *target.split(".")[1:]])
            if private and _subpackage(importer) != _subpackage(target):
                found.append(f"{path.relative_to(ROOT)}: {module} import {alias}")
    assert not found, "\n".join(found)


def test_options_is_a_leaf_every_layer_may_read():
    """``exactcheck.options`` reads nothing of the package but the root exception and the rules
    registry (to check a rule's name), which read nothing; none imports torch."""
    graph = _package_graph()
    assert graph["exactcheck.errors"] == set() and graph["exactcheck.rules"] == set()
    assert graph["exactcheck.options"] == {"exactcheck.errors", "exactcheck.rules"}
    loaded = _imports_after("import exactcheck.options")
    assert "torch" not in loaded and "scipy" not in loaded


def test_the_library_never_imports_its_cli():
    graph = _package_graph()
    assert not [m for m, targets in graph.items() if "exactcheck.cli" in targets and m != "exactcheck.__main__"]


def test_front_ends_do_not_branch_on_the_kind_of_subject():
    """The CLI, the gate and the plugin hand a ``AuditKind`` to one entry point
    (``exactcheck.audit_kinds``); none compares a kind with a string or names a runner."""
    for front in ("cli.py", "gate.py", "pytest_plugin.py"):
        text = (PACKAGE / front).read_text()
        for needle in ('== "verifier"', '== "generator"', "step.runner", "e2e.runner", "run_audit(",
                       "run_generator_audit("):
            assert needle not in text, f"{front}: {needle}"


def _imports_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout.split()
    return set(out)


def test_loading_the_pytest_plugin_imports_neither_torch_nor_scipy():
    loaded = _imports_after("import exactcheck.pytest_plugin")
    assert "torch" not in loaded and "scipy" not in loaded


def test_help_imports_neither_torch_nor_scipy():
    loaded = _imports_after("from exactcheck.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded and "scipy" not in loaded


def test_list_imports_no_torch():
    loaded = _imports_after("from exactcheck.cli import main\ntry:\n    main(['list'])\nexcept SystemExit:\n    pass")
    assert "torch" not in loaded and "scipy" not in loaded


def test_the_stored_listing_is_what_the_code_lists():
    """``exactcheck list`` prints a stored copy (no torch); it must equal the listing built from
    the code. On failure: ``python -m exactcheck.catalogue`` rewrites the copy."""
    from exactcheck.catalogue import build_listing
    from exactcheck.catalogue_listing import LISTING
    assert LISTING == build_listing()


def test_the_plan_names_every_verdict_of_the_audit_with_its_kind():
    options = AuditOptions.build(level="quick", worlds=["three_token", "ctx_v3_l5_k3", "properties/contract", "inputs"])
    plan = plan_step_audit(options)
    from exactcheck.contracts.reference_verifier import reference_verifier
    audit = run_audit(reference_verifier, options=options, progress=False)
    assert [(v.check, v.kind) for v in audit.verdicts] == [(c.name, c.kind) for c in plan.checks]
    assert {c.kind for c in plan.checks} == {CheckKind.LAW, CheckKind.PROPERTY, CheckKind.INPUTS}


@pytest.mark.parametrize("worlds", [None, ["three_token"], ["three_token", "zipf_v50000_l64_k4"],
                                    ["ctx_v4_l5_k4", "properties"]])
def test_the_planner_plans_with_the_share_the_tests_use_for_any_world_set(worlds):
    """The alpha family is every law of every built-in world at the cap plus every large world's
    chain-rule tests, whichever worlds run: the planner's share is Holm's first share, and a world's
    budget is the same alone as in the whole audit (before, naming a large world made Holm's family
    larger than the planner's, so the plan overstated its power)."""
    options = AuditOptions.build(level="quick", worlds=worlds)
    plan = plan_step_audit(options)
    whole = plan_step_audit(AuditOptions.build(level="quick"))
    assert plan.budget == whole.budget == alpha_budget(options)
    statistical = sum(c.kind.statistical for c in plan.checks)
    assert statistical <= plan.budget.checks
    planner = budget_plan(options)
    assert planner.share == pytest.approx(plan.budget.first_share)
    assert plan.budget.log_e_threshold == pytest.approx(math.log(2 * plan.budget.checks / options.alpha))
    for world, n in plan.samples:
        if world in dict(whole.samples):
            assert n == whole.world_samples(world)


def test_holm_runs_over_the_whole_family_when_some_checks_do_not_run():
    """Checks of the family an audit does not run count as p = 1: a world audited alone is
    judged at the share the plan states, never a larger one."""
    from exactcheck.stats.goodness_of_fit import holm
    adjusted, shares = holm([0.01, 0.2], 0.05, family=10)
    assert shares == [0.05 / 10, 0.05 / 9] and adjusted == [pytest.approx(0.1), pytest.approx(1.0)]
    assert holm([0.01, 0.2], 0.05) == holm([0.01, 0.2], 0.05, family=2)
    assert AlphaBudget(1e-3, 58).first_share == pytest.approx(0.5e-3 / 58)


def test_options_refuse_bad_values_with_the_rule():
    from exactcheck.errors import UsageError
    for bad, words in (({"alpha": 2.0}, "alpha (2.0) must be a number in (0, 1)"), ({"level": "fast"}, "level ('fast')"),
                       ({"require": ["speed"]}, "category ('speed')"), ({"colour": "red"}, "unknown audit option")):
        with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
            AuditOptions.build(**bad)


def test_each_shared_option_is_declared_once_on_its_field():
    """issue 66: an option several kinds share is declared once, on its ``AuditOptions`` field
    (flag, type, help, validation): every audit command's flag, ``exactcheck plan``'s, the gate's
    check and the pytest plugin's option are that declaration, and a reproduce line writes it so."""
    import argparse

    from exactcheck.audit_kinds import AUDIT_KINDS
    from exactcheck.gate import SUBJECT_FIELDS
    from exactcheck.reproduce import stated
    shared = AuditOptions.shared()
    assert {"level", "seed", "alpha", "device", "worlds", "detect_tv", "max_samples", "require", "generations",
            "shards", "call_timeout", "jobs", "stop_early", "call_elements"} <= set(shared)
    for entry in AUDIT_KINDS.values():  # each flag a kind offers for a shared option is its declaration
        parser = argparse.ArgumentParser(add_help=False)
        entry.arguments(parser)
        for action in parser._actions:
            for name, spec in shared.items():  # (cost's --world names the one world it measures on)
                if spec.flag in action.option_strings and (action.dest == name or spec.append):
                    if spec.append and not isinstance(action, argparse._AppendAction):
                        continue
                    assert action.help == spec.help, (entry.command, spec.flag)
    for name, spec in shared.items():  # the gate checks by the declaration
        assert SUBJECT_FIELDS[name] == (spec.valid, spec.rule)
    options = AuditOptions.build(alpha=0.01, call_timeout=30, worlds=["a"])
    assert stated(options, "alpha").flag == "--alpha 0.01" and stated(options, "call_timeout").flag == "--call-timeout 30"
    assert stated(options, "worlds").flag == "--world a" and stated(options, "stop_early").flag == ""
    for source in ("cli.py", "gate.py", "pytest_plugin.py", "reproduce.py"):  # no flag of a shared option spelt out
        text = (PACKAGE / source).read_text()
        assert '"--alpha"' not in text and '"--seed"' not in text and "--alpha {" not in text, source


def test_an_entry_point_refuses_a_setting_its_kind_does_not_take():
    from exactcheck.errors import UsageError
    from exactcheck.audit_kinds import AuditKind, entry_point
    with pytest.raises(UsageError, match="a generator audit takes no call_elements"):
        entry_point(AuditKind.GENERATOR).split({"call_elements": 100})
    options, own = entry_point(AuditKind.GENERATOR).split({"level": "standard", "greedy": False})
    assert options.level.value == "standard" and own == {"greedy": False}


def test_front_ends_name_no_audit_kind_and_no_runner():
    """The audit kinds are the rows of ``exactcheck.audit_kinds.AUDIT_KINDS``: the CLI, the gate and
    the plugin import no kind's runner or entry module (imports inside functions counted), compare
    no kind or command with a string and keep no table of the audits' commands."""
    kinds = ("audit", "e2e", "tree", "greedy", "grammar", "cost", "selftest", "verifier", "generator")
    forbidden = ("exactcheck.tree.subjects", "exactcheck.e2e.real_models", "exactcheck.e2e.real_grammar",
                 "exactcheck.cost.generators", "exactcheck.step.selftest")
    for front in ("cli.py", "gate.py", "pytest_plugin.py"):
        for module, alias in _imports(PACKAGE / front):
            name = f"{module}.{alias}" if alias else module
            assert not name.endswith((".runner", ".entry")) and ".runner." not in name and ".entry." not in name \
                and not name.startswith(forbidden), f"{front}: imports {name}"
        text = (PACKAGE / front).read_text()
        for kind in kinds:
            for needle in (f'== "{kind}"', f'"{kind}": _', f'in ("{kind}"', f'"{kind}" in '):
                assert needle not in text, f"{front}: {needle}"


def test_every_audit_kind_is_a_row_its_command_is_built_from(capsys):
    """Each row's command is a sub-command offering the row's arguments, its reproduce-line
    builder is callable, its result type resolves (and reads back from a report by the label it
    registered), its catalogue part is in ``exactcheck list``, and the gate takes the kinds that
    say so (with a plan to match exemptions against). A new kind needs no edit here."""
    import argparse

    from exactcheck.catalogue_listing import LISTING
    from exactcheck.cli import main
    from exactcheck.report.result import AuditResult, result_type
    from exactcheck.audit_kinds import AUDIT_KINDS, entry_point, gate_kinds
    commands = [e.command for e in AUDIT_KINDS.values()]
    assert len(set(commands)) == len(commands)
    assert {"audit", "selftest", "tree", "tree-loop", "e2e", "greedy", "grammar", "serve", "cost"} <= set(commands)
    assert all(line in LISTING.splitlines() for e in AUDIT_KINDS.values() if e.catalogue for line in e.catalogue()[:1])
    for kind, entry in AUDIT_KINDS.items():
        assert entry.kind is kind and entry_point(kind.value) is entry and entry_point(entry.command) is entry
        own = argparse.ArgumentParser(add_help=False)
        entry.arguments(own)
        with pytest.raises(SystemExit):
            main([entry.command, "--help"])
        shown = capsys.readouterr().out
        assert shown.startswith(f"usage: exactcheck {entry.command} ")
        assert all(option in shown for action in own._actions for option in action.option_strings)
        assert callable(entry.reproduce)  # a builder in exactcheck.reproduce, or the kind's own
        assert isinstance(entry.result_type(), type)
        if issubclass(entry.result_type(), AuditResult):  # a result type reads back by the label it registered
            assert entry.result_type().kind is entry.kind
            assert result_type({"kind": entry.result_type().label}) is entry.result_type()
    assert {"verifier", "generator", "tree", "serve"} <= set(gate_kinds())
    assert all(AUDIT_KINDS[kind].plan is not None for kind in gate_kinds())


def _toy_row(calls: list):
    """An audit kind no front end has heard of, as one registry row."""
    from exactcheck import arguments
    from exactcheck.options import AlphaBudget, AuditPlan, Check, CheckKind, AuditKind
    from exactcheck.tree.result import TreeAuditResult
    from exactcheck.tree.reproduce import tree_audit_line
    from exactcheck.audit_kinds import EntryPoint

    def add(parser):
        parser.add_argument("subject")
        parser.add_argument("--colour", default="blue")
        arguments.common(parser)

    def plan(subject, options, colour="blue"):
        return AuditPlan(options, (Check(f"{colour}/law", CheckKind.LAW, colour, "law"),), AlphaBudget(options.alpha, 1))

    def run(subject, options, *, subject_name=None, progress=True, executor=None, colour="blue"):
        calls.append((subject, subject_name, options.level.value, colour))
        return TreeAuditResult(subject=subject_name or "toy", level=options.level.value, seed=options.seed,
                               alpha=options.alpha, device=options.device, verdicts=(), started="", duration_s=0.0,
                               environment={})

    return EntryPoint(AuditKind("toy"), "toy", "a toy audit kind", add,
                      lambda args: dict(level=args.level, seed=args.seed, colour=args.colour, progress=not args.quiet),
                      lambda name: ("loaded", name), plan, run, "exactcheck.report.result:TreeAuditResult",
                      tree_audit_line, "toy-", options=("level", "seed", "alpha", "worlds"),
                      settings=("colour",), fields={"colour": (lambda v: v in ("red", "blue"), "red or blue")},
                      gate=True)


def test_a_new_audit_kind_is_one_registry_row(tmp_path, monkeypatch, capsys):
    """One row added to the registry, nothing else: the CLI offers its command with the row's
    arguments and runs it, the gate takes its key (gives it the shared settings it takes, and
    checks its own settings by the row's fields), the plugin's ``audit_tests`` plans it."""
    from exactcheck.cli import main
    from exactcheck.errors import UsageError
    from exactcheck.gate import read_config, run_gate
    from exactcheck.options import AuditKind
    from exactcheck.pytest_plugin import audit_tests
    from exactcheck.audit_kinds import AUDIT_KINDS, plan_subject
    calls = []
    monkeypatch.setitem(AUDIT_KINDS, AuditKind("toy"), _toy_row(calls))
    assert main(["toy", "thing", "--colour", "red", "--quiet"]) == 0
    assert calls == [(("loaded", "thing"), "thing", "quick", "red")]
    config = tmp_path / "pyproject.toml"
    config.write_text('[tool.exactcheck]\ndevice = "cpu"\n[[tool.exactcheck.subject]]\ntoy = "thing"\ncolour = "red"\n')
    (subject,) = read_config(config, device="cpu")  # the shared settings go where the kind takes them
    assert subject.kind is AuditKind("toy") and subject.settings == {"colour": "red"}
    assert run_gate([subject], progress=False)[0].passed and calls[-1] == (("loaded", "thing"), "thing", "quick", "red")
    config.write_text('[tool.exactcheck]\n[[tool.exactcheck.subject]]\ntoy = "thing"\ncolour = "green"\n')
    with pytest.raises(UsageError, match=r"colour \('green'\) must be red or blue"):
        read_config(config)
    test = audit_tests("toy", "thing", colour="red")
    assert test.__exactcheck_spec__.kind is AuditKind("toy")
    assert plan_subject("toy", "thing", level="quick", colour="red").names == ["red/law"]
    capsys.readouterr()


TEST_FOLDERS = {"step", "tree", "e2e", "recurrent", "serve", "cost", "engines", "stats", "report", "layout", "front_ends"}


def test_the_tests_live_in_one_folder_per_kind_or_layer():
    """property_tests/ holds its shared helpers and one folder per kind or layer; every test file is
    in one of those folders (a new test file finds its room, docs/layout.md)."""
    tests = ROOT / "property_tests"
    loose = sorted(p.name for p in tests.glob("test_*.py"))
    assert not loose, f"test files outside a folder: {loose}"
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    assert folders == TEST_FOLDERS, folders ^ TEST_FOLDERS
    assert not list(tests.glob("*/*/test_*.py")), "one level of folders"


def test_a_kind_owns_its_result_type_reproduce_builder_and_check_kinds():
    """Each audit kind's result type and reproduce builder live in its own package (its row names
    them), the check kinds only the served audit has are declared in ``serve/check_kinds.py``, and
    a check kind is one object across a JSON report and a pickle (the --jobs workers)."""
    import pickle

    from exactcheck.audit_kinds import AUDIT_KINDS
    from exactcheck.options import CheckKind
    from exactcheck.serve import check_kinds as serve_kinds
    for entry in AUDIT_KINDS.values():
        if entry.command == "selftest":  # many step audits, composed as the gate's are: report/result.py
            continue
        module = entry.result.partition(":")[0]
        assert not module.startswith("exactcheck.report."), entry.result
        assert entry.reproduce.__module__.split(".")[1] == module.split(".")[1], (entry.command, entry.reproduce)
    options = (PACKAGE / "options.py").read_text()
    for name in serve_kinds.__all__:
        kind = getattr(serve_kinds, name)
        assert CheckKind(kind.value) is kind and pickle.loads(pickle.dumps(kind)) is kind
        assert f'"{kind.value}"' not in options, f"{name} is declared outside the served audit's package"
    assert pickle.loads(pickle.dumps(CheckKind.LAW)) is CheckKind.LAW and CheckKind.LAW.statistical
    with pytest.raises(ValueError, match="not a declared check kind"):
        CheckKind("a kind nobody declared")
