"""The convention x precision table (issue 44): each mutant that computes the acceptance ratio
p/q in a dtype coarser than the rows, comparing u (direct) or 1 - u (mirrored), audited as a
user would, at a level, through the command line.

    python benchmarks/convention_precision.py [--level quick] [--markdown]

For each mutant of ``exactcheck.step.mutants.CONVENTION_PRECISION_MUTANTS`` it runs
``exactcheck audit exactcheck.step.mutants:NAME --level LEVEL --report DIR`` in a subprocess and
prints the exit code (1: a defect found), the check the report headlines, the first acceptance
finding's reachability (the set of uniforms that give a wrong decision, as the report states it)
and the wall time. The laws cannot see these mutants (TV about 1e-4 on the built-in worlds); the
acceptance property must, under either convention.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)


def audit(name: str, level: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "exactcheck", "audit", f"exactcheck.step.mutants:{name}",
                               "--level", level, "--report", out, "--quiet"],
                              cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        reports = [f for f in os.listdir(out) if f.endswith(".json")]
        data = json.load(open(os.path.join(out, reports[0]))) if reports else None
    from exactcheck.report.json_md import audit_from_json
    result = audit_from_json(data) if data else None
    headline = result.strongest_failure() if result else None
    acceptance = next((v for v in result.verdicts if v.check == "properties/acceptance"), None) if result else None
    reach = acceptance.reachability if acceptance is not None else None
    return {"mutant": name, "exit": done.returncode, "seconds": seconds,
            "headline": headline.check if headline else "-",
            "acceptance": acceptance.outcome.value if acceptance else "-",
            "reachability": reach.probability if reach else None, "low": reach.low if reach else None,
            "high": reach.high if reach else None, "value": reach.value if reach else None,
            "kind": reach.kind if reach else None, "described": reach.describe() if reach else "-",
            "stderr": done.stderr[-300:]}


def main() -> None:
    from exactcheck.step.mutants import CONVENTION_PRECISION_MUTANTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = [audit(name, args.level) for name in CONVENTION_PRECISION_MUTANTS]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"level {args.level}, seed 0 (`exactcheck audit exactcheck.step.mutants:NAME --level {args.level}`)")
    print()
    print("| mutant | compares | ratio in | exit | caught by | wrong uniforms (their fraction) | time |")
    print("|---|---|---|---:|---|---|---:|")
    for row in rows:
        name = row["mutant"]
        where = (f"[{row['low']:.6g}, {row['high']:.6g}] ({row['reachability']:.3g})" if row["kind"] == "interval"
                 else f"point {row['value']!r} ({row['reachability']})")
        print(f"| {name} | {'1 − u' if name.startswith('mirrored') else 'u'} | "
              f"{'float16' if 'half' in name else 'bfloat16'} | {row['exit']} | {row['headline']} | {where} | "
              f"{row['seconds']:.1f} s |")


if __name__ == "__main__":
    main()
