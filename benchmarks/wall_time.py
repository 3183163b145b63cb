"""What a user waits for: the wall time of exactcheck's everyday commands, each next to a trivial
Python start-up measured in the same run, and where the selftest's time goes.

Commands (each a fresh process, as a user or CI runs it; the short ones repeated, median kept):
- ``python -c pass`` (the floor: an interpreter starting);
- ``exactcheck --help``;
- ``exactcheck audit exactcheck.contracts.reference_verifier:reference_verifier --level quick``;
- ``exactcheck e2e reference-loop --level quick`` (the default ``--jobs auto``: two workers on two
  cores; and ``--jobs 1``), ``exactcheck tree-loop tree-loop-reference --level quick`` (the same
  two), ``exactcheck recurrent recurrent-snapshot``;
- ``exactcheck selftest --level standard`` (the README's main job; one process), and with ``--jobs 2``.

The breakdown runs the selftest once more in this process with the runner's phases timed (the
worlds' trials, the chain-rule tests, the property searches, the invalid-input probe), per audit:
the reference, the mutants a statistical check stops early, and the mutants that run every world
to its budget because no statistical check can see them.

    python benchmarks/wall_time.py --json reports/wall-time.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "exactcheck --help": [sys.executable, "-m", "exactcheck", "--help"],
    "audit reference, quick": [sys.executable, "-m", "exactcheck", "audit", "exactcheck.contracts.reference_verifier:reference_verifier",
                               "--level", "quick"],
    "e2e reference-loop, quick": [sys.executable, "-m", "exactcheck", "e2e", "reference-loop", "--level", "quick"],
    "e2e reference-loop, quick, --jobs 1": [sys.executable, "-m", "exactcheck", "e2e", "reference-loop", "--level",
                                            "quick", "--jobs", "1"],
    "tree-loop reference, quick": [sys.executable, "-m", "exactcheck", "tree-loop", "tree-loop-reference", "--level",
                                   "quick"],
    "tree-loop reference, quick, --jobs 1": [sys.executable, "-m", "exactcheck", "tree-loop", "tree-loop-reference",
                                             "--level", "quick", "--jobs", "1"],
    "recurrent snapshot loop, quick": [sys.executable, "-m", "exactcheck", "recurrent", "recurrent-snapshot", "--level",
                                       "quick"],
    "selftest, standard (README main job)": [sys.executable, "-m", "exactcheck", "selftest", "--level", "standard"],
    "selftest, standard, --jobs 2": [sys.executable, "-m", "exactcheck", "selftest", "--level", "standard", "--jobs",
                                     "2"],
}
REPEATS = {"python -c pass (floor)": 5, "exactcheck --help": 5}


def wall(command: list[str], directory: str) -> tuple[float, int]:
    """Seconds the command took (a fresh process), and its exit status; reports go to ``directory``."""
    clock = time.perf_counter()
    done = subprocess.run(command + (["--report", directory] if "--level" in command else []),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - clock, done.returncode


@contextlib.contextmanager
def timed_phases(totals: dict[str, float]):
    """Time the step runner's phases (patched in place, restored after)."""
    from exactcheck.step import runner

    originals = {name: getattr(runner, name) for name in ("shard_counts", "chain_verdicts", "search", "inputs_verdict")}
    labels = {"shard_counts": "trials (drive + count)", "chain_verdicts": "chain-rule tests",
              "search": "property search", "inputs_verdict": "invalid-input probe"}

    def wrap(name):
        def timed(*args, **kwargs):
            clock = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                totals[labels[name]] = totals.get(labels[name], 0.0) + time.perf_counter() - clock
        return timed

    for name in originals:
        setattr(runner, name, wrap(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(runner, name, original)


def selftest_breakdown(level: str) -> list[dict]:
    from exactcheck.step.selftest import run_selftest

    rows, totals = [], {}
    last = [time.perf_counter()]

    def on_audit(name, result):
        now = time.perf_counter()
        phases = dict(totals)
        totals.clear()
        stopped = result.stopped_at or ""
        kind = ("reference" if name.endswith("reference_verifier") else
                "stopped early" if stopped else "run to the budget")
        rows.append({"audit": name.split(":")[-1], "kind": kind, "seconds": now - last[0],
                     "trials": result.samples_drawn, "planned": result.samples_planned, "phases": phases})
        last[0] = now

    with timed_phases(totals):
        run_selftest(level=level, on_audit=on_audit)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="standard", help="the selftest's level in the breakdown")
    parser.add_argument("--skip", action="append", default=[], help="a command to leave out")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--reports", help="keep the commands' reports in this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.pop("EXACTCHECK_JOBS", None)  # the commands' own default (--jobs auto)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        directory = args.reports or scratch
        for label, command in COMMANDS.items():
            if label in args.skip:
                continue
            runs = [wall(command, directory) for _ in range(REPEATS.get(label, 1))]
            results[label] = {"seconds": statistics.median(s for s, _ in runs), "exit": runs[0][1],
                              "repeats": len(runs)}
            print(f"{label:<40} {results[label]['seconds']:8.2f} s  (exit {runs[0][1]})", flush=True)
    floor = results.get("python -c pass (floor)", {}).get("seconds")
    print(f"\n| command | wall time | × Python start-up | exit |\n|---|---:|---:|---:|")
    for label, r in results.items():
        ratio = f"{r['seconds'] / floor:.0f}×" if floor else "–"
        print(f"| {label} | {r['seconds']:.2f} s | {ratio} | {r['exit']} |")
    rows = selftest_breakdown(args.level)
    groups: dict[str, dict[str, float]] = {}
    for row in rows:
        group = groups.setdefault(row["kind"], {"audits": 0, "seconds": 0.0})
        group["audits"] += 1
        group["seconds"] += row["seconds"]
        for phase, seconds in row["phases"].items():
            group[phase] = group.get(phase, 0.0) + seconds
    total = sum(r["seconds"] for r in rows)
    print(f"\nselftest --level {args.level} in this process: {total:.1f} s")
    phases = sorted({p for g in groups.values() for p in g if p not in ("audits", "seconds")})
    print("| audits | count | seconds | " + " | ".join(phases) + " |\n|---|---:|---:|" + "---:|" * len(phases))
    for kind, g in groups.items():
        print(f"| {kind} | {g['audits']} | {g['seconds']:.1f} | " + " | ".join(f"{g.get(p, 0.0):.1f}" for p in phases) + " |")
    for row in sorted(rows, key=lambda r: -r["seconds"])[:10]:
        print(f"  {row['audit']:<40} {row['seconds']:6.1f} s  {row['kind']:<18} {row['trials']:>10,} trials  "
              + ", ".join(f"{p} {s:.1f}" for p, s in row["phases"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "exactcheck.wall_time/1", "commands": results, "selftest_level": args.level,
                       "selftest_seconds": total, "selftest_groups": groups, "selftest_audits": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
