"""False-alarm rate of the end-to-end audit's statistical checks (sequence and first-token laws
of every model world, Holm at alpha), measured on samples an exact generator produces.

    python benchmarks/e2e_false_alarms.py --audits 1000 --generations 2000

Each audit draws ``generations`` sequences per model world directly from the world's exact
float64 sequence law (the law every exact generator has), feeds them to the same verdict code
``exactcheck e2e`` uses, applies Holm, and counts audits with any defect verdict at several
alphas. Drawing from the law instead of running transformers' generate (8 ms per generation)
makes 1,000 audits take seconds; the generate path itself is exercised by the tests and the
committed reports.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from exactcheck.core import apply_holm
from exactcheck.generation.drive import GeneratorSamples
from exactcheck.contracts.generator import SAMPLING
from exactcheck.generation.verdicts import generation_law_verdicts
from exactcheck.options import AlphaBudget
from toy_models.hf_toy_lm import model_worlds

ALPHAS = (1e-3, 1e-2, 5e-2, 1e-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--audits", type=int, default=1000)
    parser.add_argument("--generations", type=int, default=2000)
    args = parser.parse_args()
    worlds = model_worlds()
    laws = [w.world.sequence_law() for w in worlds]
    alarms = {a: 0 for a in ALPHAS}
    for audit in range(1, args.audits + 1):
        rng = np.random.default_rng(audit)
        runs = []
        for world, law in zip(worlds, laws):
            index = rng.choice(law.size, size=args.generations, p=law)
            digits = np.stack(np.unravel_index(index, (world.vocab_size,) * world.length), 1)
            outputs = tuple(tuple(int(x) for x in row) for row in digits)
            runs.append(GeneratorSamples(world, SAMPLING, outputs, audit, forward_calls=0))
        for alpha in ALPHAS:
            checks = sum(2 + len(run.world.marginals) for run in runs)  # sequence, first token, marginals
            budget = AlphaBudget(alpha, checks, stop_early=False)
            pending = [v for run in runs for v in generation_law_verdicts(
                run, budget.first_share, alpha, dict(world=run.world.name, seed=audit, reproduce=""), None)]
            if any(v.outcome.failed for v in apply_holm(pending, budget)):
                alarms[alpha] += 1
    n = args.audits
    print(f"{n} audits x {len(worlds)} worlds x {args.generations} generations, exact sequence law, "
          f"{sum(2 + len(w.marginals) for w in worlds)} statistical checks per audit (Holm)")
    for alpha in ALPHAS:
        k = alarms[alpha]
        upper = 1 - (0.05 ** (1 / n)) if k == 0 else min(1.0, (k + 1.645 * math.sqrt(k) + 1.645 ** 2) / n)
        print(f"  alpha {alpha:g}: {k} audits with a false alarm ({k / n:.2%}; rough 95% upper {upper:.2%})")


if __name__ == "__main__":
    main()
