"""Chain-rule checks on the V = 50,000 Zipf world: false alarms and power, measured.

False alarms: ``--runs`` correct runs, each ``--sequences`` sequences of 64 tokens drawn exactly
from the target law (ancestral sampling by rank; it is the law an exact speculative sampler
produces, so this measures the tests' false-alarm rate without spending an hour per run in the
speculative loop), the five tests under Holm; counted at several alpha.

Through the loop: the reference verifier and the small-bias mutants driven through the real
speculative loop (``exactcheck.step.drive.drive_chain``, k = 4, float32 rows), tested on nested
prefixes of their sequences to find the fewest sequences at which Holm at alpha = 1e-3 rejects.

    python benchmarks/chain_rule.py --runs 1000 --sequences 2000 --loop-sequences 500
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS, chain_rule_tests
from exactcheck.step.drive import drive_chain
from exactcheck.step.mutants import SMALL_BIAS_MUTANTS
from exactcheck.contracts.reference_verifier import reference_verifier
from exactcheck.stats.goodness_of_fit import holm
from toy_models.zipf_world import zipf_world

ALPHAS = (1e-3, 1e-2, 5e-2)
PREFIXES = (25, 50, 100, 200, 500, 1000, 2000)


def _upper(count: int, n: int, confidence: float = 0.95) -> float:
    from scipy import stats
    return 1.0 if count >= n else float(stats.beta.ppf(confidence, count + 1, n - count))


def false_alarms(runs: int, sequences: int, seed: int) -> None:
    world = zipf_world()
    start = time.perf_counter()
    smallest, per_test = [], np.zeros(len(CHAIN_RULE_TESTS))
    for run in range(runs):
        gen = torch.Generator().manual_seed(seed + run)
        tests = chain_rule_tests(world, world.sample(sequences, gen), seed=seed + run + 10**6)
        p = [t.pvalue for t in tests]
        per_test += np.array(p) <= 1e-2
        smallest.append(min(holm(p, 1.0)[0]))
        if (run + 1) % 100 == 0:
            print(f"chain_rule: {run + 1}/{runs} runs ({time.perf_counter() - start:.0f} s)",
                  file=sys.stderr, flush=True)
    smallest = np.array(smallest)
    print(f"false alarms: {world.name}, {runs} runs x {sequences} sequences x {world.length} tokens "
          f"drawn from the target law ({time.perf_counter() - start:.0f} s)")
    print(f"{'alpha':>8} {'false alarms':>13} {'rate':>8} {'95% upper':>10}")
    for alpha in ALPHAS:
        count = int((smallest <= alpha).sum())
        print(f"{alpha:>8g} {count:>13} {count / runs:>8.4f} {_upper(count, runs):>10.4f}")
    print("unadjusted rejections at 0.01 per test: "
          + ", ".join(f"{n} {int(c)}" for n, c in zip(CHAIN_RULE_TESTS, per_test)))


def through_the_loop(sequences: int, seed: int, names: list[str]) -> None:
    world = zipf_world()
    subjects = [("reference", reference_verifier)] + [
        (n, SMALL_BIAS_MUTANTS[n].verifier) for n in names]
    print(f"\nthrough the speculative loop ({world.name}, k={world.draft_length}): Holm at 1e-3 over "
          "the five tests on the first n sequences")
    print(f"{'subject':<22} " + " ".join(f"{'n=' + str(n):>10}" for n in PREFIXES if n <= sequences)
          + "   detected at   time")
    for name, subject in subjects:
        start = time.perf_counter()
        samples = drive_chain(subject, world, sequences, seed)
        cells, first = [], None
        for n in (n for n in PREFIXES if n <= sequences):
            tests = chain_rule_tests(world, samples.sequences[:n], seed=seed + n)
            adjusted = holm([t.pvalue for t in tests], 1e-3)[0]
            best = int(np.argmin(adjusted))
            cells.append(f"{adjusted[best]:>10.1e}")
            if adjusted[best] <= 1e-3 and first is None:
                first = f"{n} ({CHAIN_RULE_TESTS[best]})"
        print(f"{name:<22} " + " ".join(cells) + f"   {first or 'not detected'}   "
              f"{time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--loop-sequences", type=int, default=500)
    parser.add_argument("--mutant", action="append", help="small-bias mutants to drive (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.runs:
        false_alarms(args.runs, args.sequences, args.seed)
    if args.loop_sequences:
        through_the_loop(args.loop_sequences, args.seed, args.mutant or list(SMALL_BIAS_MUTANTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
