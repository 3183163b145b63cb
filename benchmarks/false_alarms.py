"""Measure the audit's false-alarm rate: audit the exact reference verifier under many seeds.

Every audit of the reference that reports a defect is a false alarm. One run per seed gives the
false-alarm count at every alpha >= the alpha it ran at (1e-3):

- fixed budget (--no-stop-early): Holm-adjusted p-values do not depend on alpha, so the audit at
  level alpha fails exactly when its smallest adjusted p-value is <= alpha;
- early stopping (the default): the audit at level alpha fails when some law's e-process reached
  2m / alpha at any look (verdicts carry the largest log e-value) or when a fixed-budget
  adjusted p-value is <= alpha. The batches do not depend on alpha, so a run that did not stop
  at 1e-3 shows what every larger alpha would have seen, and a run that stopped at 1e-3 fails at
  every larger alpha too.

    python benchmarks/false_alarms.py --seeds 3000 --level quick --workers 2
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time

ALPHAS = (1e-3, 1e-2, 5e-2, 1e-1)


def _audit(args: tuple[int, str, bool]) -> tuple[int, float, list[str]]:
    import math

    import torch

    torch.set_num_threads(1)
    from exactcheck import reference_verifier, run_audit

    seed, level, stop_early = args
    # the deterministic properties (p = 0 or 1) cannot raise a false alarm; only the statistical
    # checks spend alpha, so they are what is measured
    result = run_audit(reference_verifier, level=level, seed=seed, properties=False, progress=False,
                       stop_early=stop_early)
    tested = [v for v in result.verdicts if v.adjusted_pvalue is not None]
    smallest = min([1.0] + [v.adjusted_pvalue for v in tested])
    watched = [v for v in result.verdicts if v.log_evidence is not None]
    for v in watched:  # the smallest alpha whose e-value bar 2m / alpha this law reached
        smallest = min(smallest, 2 * len(watched) * math.exp(-v.log_evidence))
    # failures other than statistical ones (crash, violation) would be bugs in exactcheck itself
    hard = [v.check for v in result.verdicts if v.outcome.failed and v.pvalue not in (None,)
            and v.pvalue == 0.0]
    return seed, smallest, hard


def _upper(count: int, n: int, confidence: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound on a rate from `count` events in `n` runs."""
    from scipy import stats

    return 1.0 if count >= n else float(stats.beta.ppf(confidence, count + 1, n - count))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--level", default="quick")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-stop-early", dest="stop_early", action="store_false",
                        help="measure the fixed-budget audit instead of the early-stopping one")
    parser.add_argument("--json", help="write the per-seed smallest adjusted p-values here")
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    start = time.perf_counter()
    results = []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for i, row in enumerate(pool.imap_unordered(_audit, [(s, args.level, args.stop_early) for s in seeds]), 1):
            results.append(row)
            if i % 100 == 0:
                print(f"false_alarms: {i}/{args.seeds} audits ({time.perf_counter() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    mode = "early stopping" if args.stop_early else "fixed budget"
    print(f"reference verifier, level {args.level} ({mode}), {args.seeds} seeds "
          f"({args.first_seed}..{args.first_seed + args.seeds - 1}), {elapsed:.0f} s")
    print(f"{'alpha':>8} {'false alarms':>13} {'rate':>9} {'95% upper':>10}")
    for alpha in ALPHAS:
        count = sum(p <= alpha for _, p, _ in results)
        print(f"{alpha:>8g} {count:>13} {count / args.seeds:>9.4f} {_upper(count, args.seeds):>10.4f}")
    certain = [(s, h) for s, _, h in results if h]
    print(f"audits with a certain (p = 0) failure: {len(certain)}" + (f" {certain[:5]}" if certain else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"level": args.level, "seeds": [s for s, _, _ in results],
                       "min_adjusted_p": [p for _, p, _ in results]}, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
