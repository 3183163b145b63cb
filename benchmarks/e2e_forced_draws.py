"""Forced draws inside generate under many seeds: no finding on exact generators, the inline
``r > p/q`` mutant found.

    python benchmarks/e2e_forced_draws.py --seeds 20 [--json FILE]

For the corpus generators (``exactcheck.corpus.generators``), exactcheck's reference and batched
loops, and the loop mutants whose defect is a boundary one (``InlineRatioTest``), runs the three
forced-draw checks (``exactcheck.e2e.forced_draws``) on every model world under seeds 1..N (a seed
changes the prompts and the generation seeds) and counts, per member and check, the seeds with a
finding, and the reachability of the first one. An exact generator must have none, apart from a
member's known boundary finding (``KNOWN_FINDINGS``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def members() -> dict:
    from exactcheck.corpus.generators import correct_generators
    from exactcheck.e2e.batched_loop import BatchedReferenceLoop
    from exactcheck.e2e.loop import FORCED_DRAW_MUTANTS, ReferenceSpeculativeLoop
    out = {"reference_loop": ReferenceSpeculativeLoop(), "batched_reference_loop": BatchedReferenceLoop(),
           **correct_generators()}
    out.update({m.name.split(": ")[1]: m for m in FORCED_DRAW_MUTANTS})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--json", help="write every (member, seed, world, check) row here")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    from exactcheck.corpus.generators import KNOWN_FINDINGS
    from exactcheck.e2e.forced_draws import FORCED_CHECKS, forced_draw_verdicts
    from toy_models.suite import all_model_worlds
    from exactcheck.contracts.policy import SAMPLING
    from exactcheck.options import derive_seed
    rows = []
    start = time.perf_counter()
    for name, generator in members().items():
        for seed in range(1, args.seeds + 1):
            for world in all_model_worlds():
                base = dict(world=world.name, seed=seed, reproduce="")
                for v in forced_draw_verdicts(generator, world, (SAMPLING,), derive_seed(seed, world.name), base, "cpu"):
                    reach = v.evidence.reachability
                    rows.append({"member": name, "seed": seed, "world": world.name, "check": v.law,
                                 "outcome": v.outcome.value, "failed": v.outcome.failed,
                                 "reachability": reach.describe() if reach is not None else None,
                                 "summary": v.summary})
    print(f"forced draws inside generate, seeds 1-{args.seeds}, {len(all_model_worlds())} worlds, "
          f"{time.perf_counter() - start:.0f} s")
    seen = defaultdict(set)
    for r in rows:
        if r["failed"]:
            seen[(r["member"], r["check"])].add(r["seed"])
    head = f"{'member':<26} " + " ".join(f"{c:>26}" for c in FORCED_CHECKS) + "  inconclusive"
    print(head)
    print("-" * len(head))
    for name in members():
        cells = []
        for check in FORCED_CHECKS:
            count = len(seen.get((name, check), ()))
            known = check in KNOWN_FINDINGS.get(name, ())
            cells.append(f"{count:>3} of {args.seeds} seeds" + (" (known)" if known else "") + " " * (0 if known else 8))
        inconclusive = sum(r["outcome"] == "inconclusive" for r in rows if r["member"] == name)
        print(f"{name:<26} " + " ".join(f"{c:>26}" for c in cells) + f"  {inconclusive}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    for (name, check), seeds in sorted(seen.items()):
        if not seeds:
            continue
        first = next(r for r in rows if r["member"] == name and r["check"] == check and r["failed"])
        print(f"  {name} {check}: seeds {sorted(seeds)}; first: {first['world']}: {first['reachability']}")


if __name__ == "__main__":
    main()
