"""The command-line arguments of the audit commands. An option several kinds share is declared once,
on its ``AuditOptions`` field (``exactcheck.options.Option``: flag, type, help, validation), and
``option`` adds it to any parser (a kind's sub-command, ``exactcheck plan``, the gate, the pytest
plugin with its ``--exactcheck-`` prefix); the groups below gather what several kinds add together.
Each kind's row in ``exactcheck.audit_kinds.AUDIT_KINDS`` adds its sub-command's arguments with its
own function, which calls these. Light: argparse and ``exactcheck.options`` only (``exactcheck
--help`` imports no torch)."""
from __future__ import annotations

import argparse

from exactcheck.options import DEFAULT_REQUIRE, LEVEL_NAMES, AuditOptions

__all__ = ["option", "options", "given", "output", "common", "budget", "call_timeout", "isolate", "sharding", "call_size", "require",
           "jobs", "LEVELS"]

LEVELS = list(LEVEL_NAMES)


def option(parser, name: str, *, prefix: str = "--", add=None, **override) -> None:
    """Add the ``AuditOptions`` field ``name`` to ``parser`` as its ``Option`` declares it (``prefix``
    replaces the flag's ``--``: the pytest plugin's ``--exactcheck-``; ``add``: the parser's adding
    function when it is not ``add_argument``, such as a pytest group's ``addoption``; ``override``:
    argparse keywords a front end sets otherwise, such as the gate's ``default=None``)."""
    spec = AuditOptions.option(name)
    default = AuditOptions.__dataclass_fields__[name].default
    flag = prefix + spec.flag[2:]
    add = add or parser.add_argument
    if spec.switch:
        keywords = dict(action="store_false", dest=name, help=spec.help)
    elif spec.append:
        keywords = dict(action="append", default=[] if default == DEFAULT_REQUIRE else None, help=spec.help)
    else:
        keywords = dict(default=getattr(default, "value", default), help=spec.help)
        if spec.type is not None:
            keywords["type"] = spec.type
    for key in ("metavar", "choices"):
        if getattr(spec, key) is not None and not spec.switch:
            keywords[key] = getattr(spec, key)
    add(flag, **{**keywords, **override})


def given(args) -> dict:
    """Every shared option the parsed command line ``args`` holds (the ones its parser declared with
    ``option``), by its ``AuditOptions`` name: what a kind's settings function passes on as it is."""
    out = {}
    for name, spec in AuditOptions.shared().items():
        dest = name if spec.switch else spec.flag[2:].replace("-", "_")
        if hasattr(args, dest):
            out[name] = getattr(args, dest)
    if out.get("jobs") == "auto" and (getattr(args, "shards", 1) > 1 or getattr(args, "executor", "local") != "local"):
        out["jobs"] = 1  # shards on an executor are the other way to spread the draws
    return out


def options(parser, *names: str, **override) -> None:
    """``option`` for each of ``names``, in order."""
    for name in names:
        option(parser, name, **override)


def common(parser: argparse.ArgumentParser) -> None:
    """What a step audit and the audits planned like one take: level, budget, seed, alpha, device,
    report, early stopping, quiet, the categories required and the call timeout."""
    budget(parser)
    options(parser, "seed", "device", "stop_early")
    output(parser)
    require(parser)
    call_timeout(parser)


def budget(parser: argparse.ArgumentParser) -> None:
    """What sizes a step audit's budget: level, detectable TV, cap on trials, alpha (an audit's
    and ``exactcheck plan``'s)."""
    options(parser, "level", "detect_tv", "max_samples", "alpha")


def call_timeout(parser: argparse.ArgumentParser) -> None:
    option(parser, "call_timeout")


def isolate(parser: argparse.ArgumentParser, default: bool = False) -> None:
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


def output(parser: argparse.ArgumentParser) -> None:
    """``--report DIR`` and ``--quiet``: where an audit command writes its reports, and no progress."""
    parser.add_argument("--report", metavar="DIR", help="write JSON, Markdown and HTML reports here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def sharding(parser: argparse.ArgumentParser) -> None:
    """``--shards``, ``--executor``, ``--ray-address``: a row that adds them says ``sharded=True``,
    and the CLI makes the executor (``exactcheck.executors``) its audit runs on."""
    option(parser, "shards")
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where the shards run: this process, or Ray tasks (pip install 'exactcheck[distributed]')")
    parser.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")


def jobs(parser: argparse.ArgumentParser) -> None:
    """``--jobs N|auto``; the command line's default is ``auto``, which ``audit_kinds.audit_subject``
    resolves (``exactcheck.executors.auto_jobs``). A Python caller's default stays 1 (``AuditOptions.jobs``)."""
    option(parser, "jobs", default="auto", type=_jobs_value, metavar="N|auto")


def _jobs_value(text: str):
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: a positive integer or 'auto'") from None


def call_size(parser: argparse.ArgumentParser) -> None:
    option(parser, "call_elements")


def require(parser: argparse.ArgumentParser) -> None:
    option(parser, "require")
