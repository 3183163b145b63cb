"""The tree generation audit's row of ``exactcheck.audit_kinds.AUDIT_KINDS`` (``exactcheck tree-loop
SUBJECT``, the plugin's ``audit_tests("tree-loop", ...)``): its command-line arguments, its
settings from the parsed command line, how a tree generator is loaded by name, planned and
audited. Subjects: ``tree-loop-reference`` (``exactcheck.tree.cached_loop.ReferenceTreeLoop``),
``tree-loop-mutant:NAME`` (its tree-cache and randomness mutants) or MODULE:CALLABLE (the tree-generator
contract, ``exactcheck.contracts.tree_generator``). Light: the audit is imported when it runs
(``exactcheck.tree.generation_audit.run_tree_generation_audit``)."""
from __future__ import annotations

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import AlphaBudget, AuditOptions, AuditPlan, chosen_worlds

__all__ = ["loop_arguments", "loop_settings", "load", "plan", "run", "builtin_tree_generators", "generations",
           "OPTIONS", "GENERATIONS", "REFERENCE", "MUTANT_PREFIX"]

# the ``AuditOptions`` fields a tree generation audit reads
OPTIONS = ("level", "seed", "alpha", "worlds", "generations", "require", "jobs")
# generations per world at each level (``--generations`` replaces it)
GENERATIONS = {"quick": 1_000, "standard": 4_000, "release": 20_000}
REFERENCE = "tree-loop-reference"
MUTANT_PREFIX = "tree-loop-mutant:"
# the checks of each world, in the order the audit reports them
def loop_arguments(parser) -> None:
    parser.add_argument("subject", help=f"{REFERENCE}, {MUTANT_PREFIX}NAME (rejected_branch_kept, "
                                        f"accepted_positions_off_by_depth, sibling_visible, coins_reused_across_rounds) or MODULE:CALLABLE "
                                        f"(the tree-generator contract: docs/checks.md, The whole tree loop)")
    arguments.options(parser, "level", "generations", "worlds", "seed", "alpha")
    arguments.output(parser)
    arguments.jobs(parser)
    arguments.require(parser)
    arguments.isolate(parser)


def loop_settings(args) -> dict:
    return dict(arguments.given(args), progress=not args.quiet, isolate=args.isolate)


def builtin_tree_generators() -> dict:
    """Name -> tree generator: the reference tree loop and its mutants (tree-cache and randomness)."""
    from exactcheck.tree.cached_loop import TREE_LOOP_MUTANTS, ReferenceTreeLoop
    out = {REFERENCE: ReferenceTreeLoop()}
    out.update({MUTANT_PREFIX + name: m for name, m in TREE_LOOP_MUTANTS.items()})
    return out


def load(name: str):
    """A built-in tree generator by name, or MODULE:CALLABLE."""
    builtin = builtin_tree_generators()
    if name in builtin:
        return builtin[name]
    if name.startswith(MUTANT_PREFIX) or name.startswith("tree-loop"):
        raise UsageError(f"unknown tree generator {name!r}; built in: {', '.join(builtin)}")
    from exactcheck.loading import load_subject
    return load_subject(name)


def generations(options: AuditOptions) -> int:
    """Generations per world: ``options.generations``, else the level's."""
    return int(options.generations or GENERATIONS[options.level.value])


def _world_names(options: AuditOptions) -> list[str]:
    from toy_models.tree_worlds import tree_worlds
    return chosen_worlds(options.worlds, (w.name for w in tree_worlds()), "tree world")


def plan(subject, options: AuditOptions) -> AuditPlan:
    """Three checks per world (the sequence law, its first token, the tree-cache invariants);
    alpha split by Holm over the two laws of every world."""
    worlds = _world_names(options)
    from exactcheck.tree.generation_audit import tree_loop_checks
    checks = tree_loop_checks(worlds)
    n = generations(options)
    return AuditPlan(options, checks, AlphaBudget(options.alpha, 2 * len(worlds), stop_early=False),
                     samples=tuple((w, n) for w in worlds))


def run(subject, options: AuditOptions, *, subject_name: str | None = None, progress: bool = True, executor=None):
    from exactcheck.tree.generation_audit import run_tree_generation_audit
    from exactcheck.tree.reproduce import tree_loop_line
    worlds = _world_names(options)
    name = subject_name or getattr(subject, "name", None)
    named = subject_name is not None and (subject_name in builtin_tree_generators() or ":" in subject_name)

    def line(world: str, trials: int) -> str:
        return tree_loop_line(options, subject_name if named else repr(name), world, trials, by_command=named)

    return run_tree_generation_audit(subject, worlds=worlds, trials=generations(options), seed=options.seed,
                                     alpha=options.alpha, name=name, reproduce=line, level=options.level.value,
                                     require=options.require, progress=progress, jobs=options.jobs)


def catalogue() -> list[str]:
    """This kind's part of ``exactcheck list``: the built-in tree generators."""
    return ["tree generators (`exactcheck tree-loop NAME`; whole tree loops through cached toy models, "
            "dynamic EAGLE-2 trees included):"] + [f"  {name:<26} {g.name}" for name, g in builtin_tree_generators().items()]
