"""How many samples early stopping saves: every mutant audited with and without it.

For each mutant of the corpus (and the small-bias mutants), the statistical part of the audit
(``properties=False``: the deterministic property search draws no samples) runs once with the
fixed budget (every world to its planned trials) and once with anytime-valid early stopping, at
the same level and seed. Samples-to-detection is the number of trials driven before the verdict:
the whole plan for the fixed-budget audit, the trials drawn when it stopped for the sequential
one. Mutants that only the property search can see (no statistical check fails them) are listed
apart. The false-alarm side is measured by ``benchmarks/false_alarms.py``.

    python benchmarks/early_stopping.py --level quick
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from exactcheck import run_audit
from exactcheck.step.mutants import MUTANTS, SMALL_BIAS_MUTANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small-bias", action="store_true", help="include the small-bias mutants")
    args = parser.parse_args(argv)
    corpus = dict(MUTANTS, **(SMALL_BIAS_MUTANTS if args.small_bias else {}))
    print(f"level {args.level}, seed {args.seed}: trials driven until the audit's verdict")
    print(f"{'mutant':<28} {'fixed':>10} {'sequential':>11} {'saving':>7}  stopped on")
    ratios, invisible, missed = [], [], []
    fixed_n, seq_n = [], []
    start = time.perf_counter()
    for name, m in corpus.items():
        fixed = run_audit(m.verifier, level=args.level, seed=args.seed, properties=False,
                          progress=False, stop_early=False)
        if fixed.passed:
            invisible.append(name)
            continue
        seq = run_audit(m.verifier, level=args.level, seed=args.seed, properties=False,
                        progress=False, stop_early=True)
        if seq.passed:
            missed.append(name)
            print(f"{name:<28} {fixed.samples_planned:>10,} {'missed':>11}")
            continue
        drawn = seq.samples_drawn
        fixed_n.append(fixed.samples_planned)
        seq_n.append(drawn)
        ratios.append(fixed.samples_planned / max(drawn, 1))
        print(f"{name:<28} {fixed.samples_planned:>10,} {drawn:>11,} {ratios[-1]:>6.1f}x  "
              f"{seq.stopped_at or 'full budget'}", flush=True)
    print(f"\n{len(ratios)} mutants detected by both; median trials to detection: fixed "
          f"{int(np.median(fixed_n)):,}, sequential {int(np.median(seq_n)):,} "
          f"(median ratio {np.median(ratios):.1f}x, smallest {min(ratios):.1f}x); "
          f"{time.perf_counter() - start:.0f} s")
    if missed:
        print("detected at the fixed budget but not with early stopping: " + ", ".join(missed))
    print("no statistical check fails (only the property search sees them): "
          + (", ".join(invisible) if invisible else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
