"""Tree verifiers under many seeds: the exact ones pass, the mutants are found.

    python benchmarks/tree_audits.py --seeds 50 --level quick [--jobs 2] [--members a,b] [--json FILE]
    python benchmarks/tree_audits.py --mutants --level standard [--jobs 2]

Exact members: the reference tree verifiers (``exactcheck.contracts.tree_reference``), the correct tree corpus
(``exactcheck.corpus.trees``, ``first_branch_only``, ``pruned_by_target_top_k``), SGLang's
target-only walk through its layout adapter; and the lossy references (``tree-lossy:``), which must
pass their own declared rule. Each is audited at
seeds 1..N and the audits with a finding are counted (must be about alpha * N at most: every
finding on exact code is a false alarm). ``--mutants`` audits every tree mutant once (seed 0) and
prints which checks found it and the exit status the command would give (1: found).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def members(mutants: bool) -> dict:
    from exactcheck.tree.subjects import builtin_tree_verifiers
    builtin = builtin_tree_verifiers()
    if mutants:
        return {n: v for n, v in builtin.items() if n.startswith("tree-mutant:")}
    return {n: v for n, v in builtin.items()
            if n.startswith(("tree-reference:", "tree-lossy:", "tree-corpus:")) or n == "sglang-tree-target-only"}


def audit_one(name: str, level: str, seed: int, mutants: bool) -> dict:
    import torch
    torch.set_num_threads(1)
    from exactcheck.tree.runner import run_tree_audit
    start = time.perf_counter()
    result = run_tree_audit(members(mutants)[name], level=level, seed=seed, progress=False)
    return {"member": name, "seed": seed, "level": level, "seconds": time.perf_counter() - start,
            "passed": result.passed, "trials": result.samples_drawn,
            "failed": [(v.check, v.outcome.value, v.summary[:160]) for v in result.failed]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--level", default="quick")
    parser.add_argument("--mutants", action="store_true")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json")
    parser.add_argument("--members", help="comma-separated subset (names as `exactcheck tree` takes them)")
    args = parser.parse_args()
    names = list(members(args.mutants))
    if args.members:
        names = [n for n in names if n in args.members.split(",")]
    seeds = [0] if args.mutants else list(range(1, args.seeds + 1))
    jobs = [(n, args.level, s, args.mutants) for n in names for s in seeds]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(audit_one, *zip(*jobs)))
    print(f"tree {'mutants' if args.mutants else 'exact members'}, level {args.level}, "
          f"{len(seeds)} seed(s), {time.perf_counter() - start:.0f} s")
    for name in names:
        mine = [r for r in rows if r["member"] == name]
        failing = [r for r in mine if not r["passed"]]
        line = (f"{name:<40} audits {len(mine):>3}  with a finding {len(failing):>3}  "
                f"trials/audit {sum(r['trials'] for r in mine) / len(mine):>9,.0f}  "
                f"s/audit {sum(r['seconds'] for r in mine) / len(mine):>6.1f}")
        if args.mutants:
            found = sorted({check for r in mine for check, _, _ in r["failed"]})
            line += f"  exit {1 if failing else 0}  found by: {', '.join(found) or 'nothing'}"
        print(line)
    if not args.mutants:
        for r in rows:
            for check, outcome, summary in r["failed"]:
                print(f"  finding: {r['member']} seed {r['seed']}: {check} ({outcome}): {summary}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
