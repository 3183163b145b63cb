"""The step audits' rows of ``exactcheck.audit_kinds.AUDIT_KINDS``: ``exactcheck audit`` (a
step-level verifier) and ``exactcheck selftest`` (the reference and every mutant): their
command-line arguments, their settings from the parsed command line, how they plan and run, and
the selftest's own presentation. Light: the runners are imported when an audit runs."""
from __future__ import annotations

import sys
import time

from exactcheck import arguments
from exactcheck.options import AuditOptions, AuditPlan

__all__ = ["audit_arguments", "audit_settings", "load", "plan", "run", "selftest_arguments", "selftest_settings", "run_selftest", "selftest_main"]


def audit_arguments(parser) -> None:
    parser.add_argument("subject", help="MODULE:CALLABLE (e.g. my_package.sampling:verifier), or a built-in "
                                        "verifier by the name `exactcheck list` prints (reference, trust_draft, ...)")
    arguments.option(parser, "worlds")
    parser.add_argument("--rule", metavar="NAME[:param=value,...]",
                        help="the verification rule to judge the subject by (see `exactcheck rules`; default: the "
                             "subject's acceptance_rule attribute, else any registered exact rule)")
    arguments.sharding(parser)
    parser.add_argument("--max-seconds", type=float, metavar="S",
                        help="a budget for a slow subject (an interpreted kernel): measure its speed and cut "
                             "each world's trials to fit about 60%% of S in the laws; every verdict states the TV "
                             "it could detect at the trials drawn, and the reproducers name them (--trials)")
    parser.add_argument("--trials", action="append", metavar="WORLD=N",
                        help="draw N trials in WORLD instead of its planned budget (repeatable)")
    parser.add_argument("--looks-from-share", dest="looks_from_one", action="store_false",
                        help="under early stopping, start the looks at the first share of the budget instead of "
                             "doubling from one trial (what --max-seconds does; its reproduce lines say so)")
    arguments.jobs(parser)
    arguments.common(parser)
    arguments.call_size(parser)
    arguments.isolate(parser)


def audit_settings(args) -> dict:
    return dict(arguments.given(args), rule=args.rule, progress=not args.quiet, max_seconds=args.max_seconds,
                trials=args.trials, looks_from_one=args.looks_from_one, isolate=args.isolate)


def load(name: str):
    """A built-in verifier by name, or MODULE:CALLABLE (``exactcheck.step.subjects``)."""
    from exactcheck.step.subjects import load_verifier
    return load_verifier(name)


def plan(subject, options: AuditOptions) -> AuditPlan:
    from exactcheck.step.plan import plan_step_audit
    from exactcheck.step.runner import judged_by
    return plan_step_audit(judged_by(options, subject))


def run(subject, options: AuditOptions, **keywords):
    from exactcheck.step.runner import run_audit
    return run_audit(subject, options=options, **keywords)


def selftest_arguments(parser) -> None:
    parser.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant")
    arguments.jobs(parser)
    arguments.common(parser)
    arguments.call_size(parser)


def selftest_settings(args) -> dict:
    settings = {k: v for k, v in arguments.given(args).items() if k not in ("require", "call_timeout")}
    return dict(settings, mutants=args.mutant, progress=not args.quiet)


def run_selftest(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None,
                 mutants=None, on_audit=None, jobs: int = 1):
    """The selftest (its subject is always the reference and the mutants: ``subject`` is None)."""
    from exactcheck.step.selftest import run_selftest as selftest
    return selftest(level=options.level.value, seed=options.seed, alpha=options.alpha, device=options.device,
                    mutants=mutants, on_audit=on_audit, stop_early=options.stop_early, detect_tv=options.detect_tv,
                    max_samples=options.max_samples, call_elements=options.call_elements, jobs=jobs,
                    progress=progress)


def selftest_main(args, stem: str, audit) -> int:
    """``exactcheck selftest``: a header, one row per audit as it ends, a footer, the report; 1
    when the reference failed or a mutant went undetected, 130 interrupted (what it finished kept)."""
    from exactcheck.console import EXIT_DEFECT, EXIT_INTERRUPTED, EXIT_PASS, write_and_list
    from exactcheck.report.json_md import selftest_to_json
    from exactcheck.report.terminal import selftest_footer, selftest_header, selftest_row
    from exactcheck.step.selftest import REFERENCE_NAME
    print(selftest_header(), flush=True)
    start = time.perf_counter()

    def show(name: str, result) -> None:
        print(selftest_row(name, result, reference=name == REFERENCE_NAME), flush=True)

    result = audit(None, on_audit=show, **selftest_settings(args))
    print()
    print(selftest_footer(result, time.perf_counter() - start))
    paths = ()
    if args.report:
        paths = write_and_list(selftest_to_json(result), args.report, stem)
    if result.interrupted:
        done = f"{len(result.mutants)} of {len(result.planned)} mutants audited"
        if result.reference.interrupted:
            done = "during the reference audit"
        where = f"; partial report, marked incomplete: {paths[0]}" if paths else ""
        print(f"exactcheck: selftest interrupted ({done}){where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_PASS if result.passed else EXIT_DEFECT


def catalogue() -> list[str]:
    """This kind's part of ``exactcheck list``: the step worlds, properties and verifier mutants."""
    from exactcheck.step.mutants import MUTANTS, SMALL_BIAS_MUTANTS
    from exactcheck.step.properties import PROPERTIES
    from toy_models.suite import default_worlds, large_worlds
    lines = ["worlds:"]
    lines += [f"  {w.name:<26} {w.description}" for w in default_worlds()]
    lines.append("large worlds (audited when named with --world; chain-rule tests):")
    lines += [f"  {w.name:<26} {w.description}" for w in large_worlds()]
    lines.append("properties (deterministic, forced random numbers):")
    lines += [f"  properties/{name}" for name in PROPERTIES]
    lines.append("verifiers (`exactcheck audit NAME`): reference (exactcheck's own, exact), and the mutants below")
    lines.append("mutants:")
    lines += [f"  {m.name:<26} {m.defect}" for m in MUTANTS.values()]
    lines.append("small-bias mutants (power benchmark; not in the selftest's must-detect corpus; `exactcheck audit NAME`):")
    lines += [f"  {m.name:<26} {m.defect}"
              for m in SMALL_BIAS_MUTANTS.values()]
    return lines
