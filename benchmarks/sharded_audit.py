"""Wall time of a reference audit in one process against the same audit sharded on Ray.

Three runs of the reference verifier's audit at ``--level`` (properties off: they are not
sharded): unsharded in this process; ``--shards N`` in this process (the single-process reference
for the sharded seeds); ``--shards N`` as Ray tasks on a local cluster of ``--cpus`` CPUs (or
``--ray-address``). Prints each wall time, the ratio of the first to the third, and whether the
two sharded runs agree on every verdict, sample count and statistic (they must).

    python benchmarks/sharded_audit.py --level release --shards 2 --cpus 2 [--json]
"""
from __future__ import annotations

import argparse
import json
import time

from exactcheck.step.runner import run_audit
from exactcheck.executors import LocalExecutor, RayExecutor
from exactcheck.contracts.reference_verifier import reference_verifier


def _timed(**settings):
    clock = time.perf_counter()
    result = run_audit(reference_verifier, properties=False, progress=False, **settings)
    return result, time.perf_counter() - clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="release")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--ray-address")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    single, single_s = _timed(level=args.level)
    local, local_s = _timed(level=args.level, shards=args.shards, executor=LocalExecutor())
    ray = RayExecutor(args.ray_address, num_cpus=args.cpus)
    try:
        remote, remote_s = _timed(level=args.level, shards=args.shards, executor=ray)
    finally:
        ray.close()
    agree = [(a.check, a.outcome, a.samples, a.statistic) for a in local.verdicts] == \
            [(b.check, b.outcome, b.samples, b.statistic) for b in remote.verdicts]
    summary = {"level": args.level, "shards": args.shards, "cpus": args.cpus, "trials": single.samples_drawn,
               "single_process_s": round(single_s, 1), "sharded_local_s": round(local_s, 1),
               "sharded_ray_s": round(remote_s, 1), "ratio_single_to_ray": round(single_s / remote_s, 2),
               "sharded_runs_agree": agree, "passed": [single.passed, local.passed, remote.passed]}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"reference audit at {args.level}: {single.samples_drawn:,} trials")
    print(f"  one process, unsharded:        {single_s:7.1f} s")
    print(f"  one process, {args.shards} shards:         {local_s:7.1f} s")
    print(f"  Ray ({args.cpus} CPUs), {args.shards} shards:       {remote_s:7.1f} s")
    print(f"  ratio one process / Ray: {single_s / remote_s:.2f}; sharded runs agree on every verdict: {agree}")


if __name__ == "__main__":
    main()
