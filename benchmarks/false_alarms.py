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

``--from-laws`` measures the same statistical procedure (every law of every built-in world, the
audit's plan, batch schedule, e-processes, thresholds and Holm) on trials drawn from the exact
laws themselves instead of from the reference verifier: the law every exact subject's trials
follow, without the cost of a subject, so thousands of audits fit in minutes.

    python benchmarks/false_alarms.py --from-laws --seeds 3000 --level quick --workers 2
"""
from __future__ import annotations

import argparse
import math
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


def _law_audit(args: tuple[int, str, bool]) -> tuple[int, float, list[str]]:
    """The statistical part of an audit at ``level`` on trials drawn from the exact laws: the
    smallest alpha at which it would have reported a defect (as ``_audit``)."""
    import os

    import numpy as np
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from efficiency import fixed_pvalues, sampled_world_run
    from exactcheck.options import AuditOptions, derive_seed
    from exactcheck.rules import reference_sequence_law
    from exactcheck.stats.goodness_of_fit import holm
    from exactcheck.step.drive import SequenceSamples, StepSamples
    from exactcheck.step.mutant_laws import exact_output_law
    from exactcheck.step.plan import plan_step_audit
    from toy_models import StepWorld

    seed, level, _ = args
    if level not in _PLANS:  # the plan does not depend on the seed
        _PLANS[level] = plan_step_audit(AuditOptions.build(level=level, properties=False))
    plan = _PLANS[level]
    budget = plan.budget
    largest, pvalues = [], []
    for name, n in plan.samples:
        world = plan.world(name)
        rng = np.random.default_rng(derive_seed(seed, name))
        step = isinstance(world, StepWorld)
        law = _law_of(world, exact_output_law, reference_sequence_law)
        cdf = np.cumsum(law)

        def sample(size: int):
            cells = np.minimum(np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right"), law.size - 1)
            if step:
                rows = torch.from_numpy(_OUTPUT_ROWS[name][cells])
                return StepSamples(world, rows, rows[:, :-1], seed, 1)
            tokens = np.stack(np.unravel_index(cells, (world.vocab_size,) * world.length), 1)
            return SequenceSamples(world, torch.from_numpy(tokens.astype(np.int64)), seed, 1, 0)

        run = sampled_world_run(world, plan.world_laws(name), n, budget, sample)
        largest += run.largest
        pvalues += fixed_pvalues(run, budget.first_share)
    adjusted, _ = holm(pvalues, budget.holm_alpha, family=budget.checks)
    smallest = min([1.0] + [p * budget.holm_scale for p in adjusted])
    smallest = min([smallest] + [2 * budget.checks * math.exp(-e) for e in largest])
    return seed, smallest, []


_PLANS: dict = {}
_OUTPUT_ROWS: dict = {}
_LAWS: dict = {}


def _law_of(world, exact_output_law, reference_sequence_law):
    """The exact law of a world's trials (cached per process), and its cells' output rows."""
    if world.name not in _LAWS:
        from efficiency import output_rows
        if hasattr(world, "sequence_law"):
            _LAWS[world.name] = reference_sequence_law(world, False)
        else:
            _LAWS[world.name] = exact_output_law(world)
            _OUTPUT_ROWS[world.name] = output_rows(world.draft_length, world.vocab_size)
    return _LAWS[world.name]


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
    parser.add_argument("--from-laws", action="store_true",
                        help="draw the trials from the exact laws, not from the reference verifier")
    parser.add_argument("--json", help="write the per-seed smallest adjusted p-values here")
    args = parser.parse_args(argv)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    start = time.perf_counter()
    results = []
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for i, row in enumerate(pool.imap_unordered(_law_audit if args.from_laws else _audit, [(s, args.level, args.stop_early) for s in seeds]), 1):
            results.append(row)
            if i % 100 == 0:
                print(f"false_alarms: {i}/{args.seeds} audits ({time.perf_counter() - start:.0f} s)",
                      file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - start
    mode = "early stopping" if args.stop_early else "fixed budget"
    source = "trials drawn from the exact laws" if args.from_laws else "reference verifier"
    print(f"{source}, level {args.level} ({mode}), {args.seeds} seeds "
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
