"""The batched generator contract against the batch-1 contract: one end-to-end audit of the
reference loop through each, same level and seed, wall time of each and the ratio (measured in
the same run), and whether every verdict agrees.

``reference-loop`` (``ReferenceSpeculativeLoop``) is driven one generation per call;
``batched-reference-loop`` (``BatchedReferenceLoop``) gets up to 256 requests per call. On the
toy worlds each request's output is the same for the same seed, so every law verdict is the same;
``cache_rollback`` differs by design (the batched loop keeps no cache: "not applicable").

    python benchmarks/batched_e2e.py --level quick [--json]
"""
from __future__ import annotations

import argparse
import json
import time

from exactcheck.e2e.runner import run_generator_audit
from exactcheck.e2e.batched_loop import BatchedReferenceLoop
from exactcheck.e2e.loop import ReferenceSpeculativeLoop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = {}
    for name, generator in (("batch-1", ReferenceSpeculativeLoop()), ("batched", BatchedReferenceLoop())):
        clock = time.perf_counter()
        result = run_generator_audit(generator, level=args.level, seed=args.seed, progress=False)
        runs[name] = (result, time.perf_counter() - clock)
    one, many = runs["batch-1"][0], runs["batched"][0]
    differ = [a.check for a, b in zip(one.verdicts, many.verdicts)
              if (a.check, a.outcome, a.pvalue, a.samples) != (b.check, b.outcome, b.pvalue, b.samples)]
    ratio = runs["batch-1"][1] / runs["batched"][1]
    summary = {"level": args.level, "seed": args.seed, "batch_1_s": round(runs["batch-1"][1], 2),
               "batched_s": round(runs["batched"][1], 2), "ratio": round(ratio, 2),
               "generations": one.samples_drawn, "checks": len(one.verdicts), "verdicts_that_differ": differ,
               "both_passed": one.passed and many.passed}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"e2e audit of the reference loop at {args.level}, seed {args.seed}: {one.samples_drawn:,} generations, "
          f"{len(one.verdicts)} checks")
    print(f"  batch-1 contract: {runs['batch-1'][1]:6.1f} s   passed: {one.passed}")
    print(f"  batched contract: {runs['batched'][1]:6.1f} s   passed: {many.passed}")
    print(f"  ratio {ratio:.1f}x; verdicts that differ: {differ or 'none'}")


if __name__ == "__main__":
    main()
