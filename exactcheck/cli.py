"""The ``exactcheck`` command.

Its audit sub-commands are the rows of ``exactcheck.audit_kinds.AUDIT_KINDS``: each row adds its
own arguments, turns the parsed command line into settings and shows its result
(``exactcheck.console``); this module parses, runs the row's audit through the registry and keeps
the command's own duties (outputs checked before an audit, SIGTERM, a closed stdout, a lost
report). The other commands (list, plan, rules, lossy, replay, render, gate) are its own.

exit status: 0 every check passed; 1 a defect was found (or, for selftest, the reference failed
or a mutant went undetected); 2 a usage error or a subject that could not be driven at all;
130 interrupted.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import sys
import threading
from pathlib import Path

from exactcheck import arguments
from exactcheck.console import EXIT_DEFECT, EXIT_INTERRUPTED, EXIT_PASS, EXIT_USAGE, LOST, lost_report
from exactcheck.errors import UsageError
from exactcheck.audit_kinds import AUDIT_KINDS, audit_subject, entry_point

__all__ = ["main"]


def _executor(args):
    """Where ``--shards`` run (checked before a Ray cluster is started or joined)."""
    from exactcheck.executors import make_executor
    if args.shards < 1:
        raise UsageError(f"--shards ({args.shards}) must be at least 1")
    return make_executor(args.executor, args.ray_address)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="exactcheck", description=(
        "Audit a speculative-decoding verifier for exactness, with a stated false-alarm rate."))
    from exactcheck.version import __version__
    parser.add_argument("--version", action="version", version=f"exactcheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for entry in AUDIT_KINDS.values():  # every audit kind: its row's command and arguments
        entry.arguments(sub.add_parser(entry.command, help=entry.help))
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
    arguments.budget(plan)  # the audit's own --level, --detect-tv, --max-samples, --alpha
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
    gate = sub.add_parser("gate", help="audit every subject listed in [tool.exactcheck] of pyproject.toml; "
                                       "exit 1 on any failed check that is not exempt")
    gate.add_argument("--config", default="pyproject.toml", help="the TOML file (default pyproject.toml)")
    arguments.option(gate, "level", default=None, help="override every subject's level")
    arguments.option(gate, "device", default=None, help="override every subject's device (cpu, cuda, cuda:1)")
    gate.add_argument("--junit-xml", metavar="FILE", help="write JUnit XML (a testcase per check)")
    gate.add_argument("--json", metavar="FILE", help="write the gate's JSON (every audit included)")
    gate.add_argument("--report", metavar="DIR", help="write each audit's JSON, Markdown and HTML report here")
    gate.add_argument("--quiet", action="store_true")
    arguments.isolate(gate, default=True)
    render = sub.add_parser("render", help="print the Markdown of a JSON report")
    render.add_argument("report", help="a .json report written by exactcheck")
    from exactcheck.report.formats import FORMS  # light: no torch
    render.add_argument("--format", choices=FORMS, default="markdown",
                        help="markdown (default), a self-contained html page, or a short pull-request comment")
    return parser


def _stem_settings(args) -> dict:
    """What the command line set away from its defaults, of the settings that change what an audit
    draws or how it is judged (``--world``, ``--alpha``, ``--rule``, ``--trials`` ...): they name
    the report files (``report_stem``) so runs that differ in them never share a stem. The
    defaults are the ones the kind's row gives its arguments."""
    ignored = {"command", "subject", "level", "seed", "report", "quiet", "isolate", "executor", "ray_address",
               "jobs", "junit_xml", "json", "config", "live"}
    own = argparse.ArgumentParser(add_help=False)
    entry_point(args.command).arguments(own)
    return {k: v for k, v in vars(args).items() if k not in ignored and v != own.get_default(k)}


def _audit_kind(args) -> int:
    """An audit sub-command: its row's settings from the command line, the audit through the
    registry (on the executor ``--shards`` asks for, where the row takes them), its result shown
    as the row says."""
    entry = entry_point(args.command)
    stem = entry.report_stem(args, _stem_settings(args))
    if entry.main is not None:  # a kind that runs its whole command (selftest)
        return entry.main(args, stem, functools.partial(audit_subject, entry.kind))
    _start_workers(entry, args)
    settings = entry.from_args(args)
    executor = _executor(args) if entry.sharded else None
    try:  # in this process the runners make their own local executor
        result = audit_subject(entry.kind, args.subject, **settings,
                               executor=None if executor is None or executor.name == "local" else executor)
    finally:
        if executor is not None:
            executor.close()
    return entry.show(result, args, stem)


def _start_workers(entry, args) -> None:
    """Under ``--jobs auto`` for a kind whose workers pay, and a subject named as exactcheck names its
    own (a built-in name or ``*-mutant:NAME``; MODULE:CALLABLE stays in one process), on the CPU:
    the workers ``audit_subject`` will ask for, started now so that their imports overlap this
    process's (``exactcheck.executors.start_workers_early``)."""
    from exactcheck.executors import auto_jobs, start_workers_early
    subject = getattr(args, "subject", None) or ""
    own = ":" not in subject or subject.split(":")[0].endswith("-mutant")
    # ``given`` turns auto into 1 where shards spread the draws; an isolated audit keeps its own process
    if entry.auto_workers is None or arguments.given(args).get("jobs") != "auto" or getattr(args, "isolate", False) \
            or not own:
        return
    jobs = auto_jobs(None, getattr(args, "device", None))
    if jobs > 1:
        start_workers_early(jobs, entry.auto_workers)


def _gate(args) -> int:
    from exactcheck import gate
    from exactcheck.report.files import ReportWriteError, report_stem, write_report
    from exactcheck.report.json_md import audit_from_json, audit_to_json, gate_to_json
    from exactcheck.report.junit import junit_xml
    from exactcheck.report.result import GateResult
    from exactcheck.report.terminal import gate_lines, gate_verdict
    config = Path(args.config)
    subjects = gate.read_config(config, level=args.level, device=args.device)
    results = gate.run_gate(subjects, progress=not args.quiet, root=config.resolve().parent, isolate=args.isolate)
    interrupted = bool(results) and results[-1].audit.interrupted
    written = []
    if args.report:  # first, so every line printed below names the files written
        for index, result in enumerate(results):
            stem = report_stem("audit-", result.subject.name, result.audit.level, result.audit.seed)
            data = audit_to_json(result.audit)
            try:
                paths = write_report(data, args.report, stem)
            except ReportWriteError as exc:
                lost_report(exc)
                continue
            results[index] = GateResult(result.subject, audit_from_json(data))
            written += [f"report: {path}" for path in (paths[:1] if interrupted else paths)]
    if not interrupted:
        print(gate_lines(results))
    try:
        if args.junit_xml:
            written.append(f"junit xml: {gate.write(args.junit_xml, junit_xml(results))}")
        if args.json:
            written.append(f"json: {gate.write(args.json, gate.dumps(gate_to_json(results)))}")
    except OSError as exc:
        lost_report(f"cannot write {exc.filename or 'a gate file'}: {exc.strerror or exc}")
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
    from toy_models.suite import rule_worlds
    try:
        print(lossy_table(spec, rule_worlds(args.world)))
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
            loaded[name] = entry_point("verifier").load(name)
        try:
            outcome = replay(loaded[name], record, as_recorded=name == record["subject"])
        except UsageError as exc:
            raise UsageError(f"{args.file}: {exc}") from None
        print(outcome.line(record, name))
        failed = failed or not outcome.holds
    return EXIT_DEFECT if failed else EXIT_PASS


def _render(args) -> int:
    from exactcheck.audit_kinds import load_result_types
    from exactcheck.report.formats import renderer
    load_result_types()  # every kind's result type registered, wherever it lives
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


# the commands that are not audit kinds (those are the rows of ``exactcheck.audit_kinds.AUDIT_KINDS``)
_COMMANDS = {"list": _list, "render": _render, "rules": _rules, "lossy": _lossy, "replay": _replay, "plan": _plan,
             "gate": _gate}


def main(argv: list[str] | None = None) -> int:
    from exactcheck.memory import keep_freed_memory
    args = _parser().parse_args(argv)
    keep_freed_memory()
    LOST.clear()
    stdout, sys.stdout = sys.stdout, _PipeSafe(sys.stdout)
    terminate = None
    if threading.current_thread() is threading.main_thread():
        terminate = signal.signal(signal.SIGTERM, _terminate)
    try:
        _check_outputs(args)
        code = _COMMANDS.get(args.command, _audit_kind)(args)  # not one of its own: an audit kind's
        return EXIT_USAGE if LOST and code == EXIT_PASS else code  # a report asked for and lost is no pass
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
