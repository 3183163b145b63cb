"""The command-line argument groups several audit kinds share. Each kind's row in
``exactcheck.audit_kinds.AUDIT_KINDS`` adds its sub-command's arguments with its own function, which
calls these for what it has in common with the others; the CLI builds its sub-commands from the
rows. Light: argparse and ``exactcheck.options`` only (``exactcheck --help`` imports no torch)."""
from __future__ import annotations

import argparse

from exactcheck.options import DEFAULT_ALPHA, DEFAULT_CALL_TIMEOUT, DEFAULT_LEVEL, REQUIRABLE, Level

__all__ = ["common", "budget", "call_timeout", "isolate", "sharding", "call_size", "require", "LEVELS"]

LEVELS = [lv.value for lv in Level]


def common(parser: argparse.ArgumentParser) -> None:
    """What a step audit and the audits planned like one take: level, budget, seed, alpha, device,
    report, early stopping, quiet, the categories required and the call timeout."""
    budget(parser)
    parser.add_argument("--seed", type=int, default=0, help="root seed (default 0)")
    parser.add_argument("--device", default="cpu", help="torch device for the subject's tensors")
    parser.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    parser.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                        help="run every world to its budget (default: stop at the first defect "
                             "an anytime-valid test makes evident)")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    require(parser)
    call_timeout(parser)


def budget(parser: argparse.ArgumentParser) -> None:
    """What sizes a step audit's budget: level, detectable TV, cap on trials, alpha (an audit's
    and ``exactcheck plan``'s, declared once)."""
    parser.add_argument("--level", default=DEFAULT_LEVEL, choices=LEVELS,
                        help="the TV every law is planned to detect: quick 0.05, standard 0.01, "
                             "release 0.003 (see `exactcheck plan`)")
    parser.add_argument("--detect-tv", type=float, metavar="EPS",
                        help="plan the budget to detect this TV instead of the level's")
    parser.add_argument("--max-samples", type=int, metavar="N",
                        help="cap on trials per world (default: the level's: 50k, 1M, 10M)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help="false-alarm budget for the whole audit (default 1e-3); with early stopping, half "
                             "goes to the early-stopping tests and half to Holm over the statistical checks")


def call_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--call-timeout", type=float, default=DEFAULT_CALL_TIMEOUT, metavar="S",
                        help=f"seconds one call of the subject may take before it is stopped and reported as a "
                             f"hang (default {DEFAULT_CALL_TIMEOUT:g}; 0: no limit)")


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


def sharding(parser: argparse.ArgumentParser, shards_help: str) -> None:
    """``--shards``, ``--executor``, ``--ray-address``: a row that adds them says ``sharded=True``,
    and the CLI makes the executor (``exactcheck.executors``) its audit runs on."""
    parser.add_argument("--shards", type=int, default=1, metavar="N", help=shards_help)
    parser.add_argument("--executor", choices=("local", "ray"), default="local",
                        help="where the shards run: this process, or Ray tasks (pip install 'exactcheck[distributed]')")
    parser.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (default: start a local one)")


def jobs(parser: argparse.ArgumentParser, help_text: str) -> None:
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help=help_text)


def call_size(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--call-elements", metavar="N|auto",
                        help="largest target_probs tensor (B*(k+1)*V elements) per verify call: a number, "
                             "or auto (half the device's free memory); default 2^24 on every machine. "
                             "Another size draws other random numbers: the same seed gives other, "
                             "equally valid samples, and the reproducer names the size")


def require(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--require", action="append", choices=REQUIRABLE,
                        default=[], help="also fail on findings of this category (repeatable; by "
                        "default only exactness findings fail: laws, forbidden tokens, acceptance "
                        "decisions, contract, crashes)")
