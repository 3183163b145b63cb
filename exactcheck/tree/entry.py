"""The tree audit's row of ``exactcheck.audit_kinds.AUDIT_KINDS`` (``exactcheck tree``, the gate's
``tree = "..."``): its command-line arguments, its settings from the parsed command line, how a
tree verifier is loaded by name, planned and audited. Light: the runner is imported when an audit
runs (it resolves the device once, ``exactcheck.tree.runner.run_tree_audit``)."""
from __future__ import annotations

from exactcheck import arguments
from exactcheck.options import AuditOptions, AuditPlan

__all__ = ["tree_arguments", "tree_settings", "load", "plan", "run", "OPTIONS"]

# the ``AuditOptions`` fields a tree audit reads
OPTIONS = ("level", "seed", "alpha", "worlds", "device", "detect_tv", "max_samples", "require", "call_timeout",
           "properties", "tree_rule")


def tree_arguments(parser) -> None:
    parser.add_argument("subject", help="tree-reference:NAME, tree-mutant:NAME, sglang-tree-target-only, or "
                                        "MODULE:CALLABLE (the tree contract: docs/checks.md)")
    arguments.option(parser, "worlds")
    parser.add_argument("--rule", metavar="NAME", help="the tree rule to judge conformance by (multi_round, "
                                                       "without_replacement, deterministic, target_only; default: "
                                                       "the subject's tree_rule attribute, else none)")
    arguments.common(parser)
    arguments.isolate(parser)


def tree_settings(args) -> dict:
    settings = {k: v for k, v in arguments.given(args).items() if k != "stop_early"}
    return dict(settings, progress=not args.quiet, isolate=args.isolate, tree_rule=args.rule)


def load(name: str):
    from exactcheck.tree.subjects import load_tree_verifier
    return load_tree_verifier(name)


def plan(subject, options: AuditOptions) -> AuditPlan:
    from exactcheck.tree.plan import plan_tree_audit
    return plan_tree_audit(subject, options)[0]


def run(subject, options: AuditOptions, *, executor=None, **keywords):
    from exactcheck.tree.runner import run_tree_audit
    return run_tree_audit(subject, options=options, **keywords)


def catalogue() -> list[str]:
    """This kind's part of ``exactcheck list``: tree worlds, tree rules, tree verifiers."""
    from exactcheck.tree.rules import TREE_RULES
    from exactcheck.tree.subjects import builtin_tree_verifiers
    from toy_models.tree_worlds import tree_worlds
    lines = ["tree worlds (`exactcheck tree`; siblings drawn as the subject declares):"]
    lines += [f"  {w.name:<26} {w.siblings} siblings, {w.shape_name}, "
              f"V={w.vocab_size}, {w.length} tokens" + (", greedy target" if w.greedy else "") for w in tree_worlds()]
    lines.append(f"tree rules (`exactcheck tree --rule`): {', '.join(TREE_RULES)}")
    lines.append("tree verifiers (`exactcheck tree NAME`):")
    lines += [f"  {name}" for name in builtin_tree_verifiers()]
    return lines
