"""The correct corpus under many seeds: no finding on exact code.

    python benchmarks/correct_corpus.py --seeds 50 --level quick [--jobs 2] [--members a,b]
    python benchmarks/correct_corpus.py --seeds 1 --level standard
    python benchmarks/correct_corpus.py --seeds 50 --level quick --worlds properties --jobs 2
    python benchmarks/correct_corpus.py --generators --seeds 10 --level quick

For every exact verifier of ``exactcheck.corpus.verifiers`` and ``exactcheck.corpus.other_rules``
(block and target-only members, none declaring its rule), or generator of
``exactcheck.corpus.generators``, audits seeds 1..N and counts, per member: audits with a
deterministic exactness finding (must be 0: such a finding on exact code is a bug in exactcheck),
audits with a statistical false alarm (must be consistent with alpha: at most about alpha * N),
audits with a conformance finding (the member fits no registered exact rule: a false alarm too,
deterministic ones included),
reproducibility findings (expected only for the members that ignore their generator),
unreachable boundary behaviours, inconclusive checks, and a generator's known boundary finding
(``exactcheck.corpus.generators.KNOWN_FINDINGS``: transformers' ``r <= p/q`` at r = 0, counted
apart, expected in every audit). Prints a table; ``--json FILE`` keeps the per-audit rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def audit_one(kind: str, name: str, level: str, seed: int, worlds: tuple | None = None) -> dict:
    import torch
    torch.set_num_threads(1)  # one core per worker: timings stay comparable across --jobs
    from exactcheck.report.verdict import Category, Outcome
    start = time.perf_counter()
    if kind == "verifier":
        from exactcheck import run_audit
        audit = run_audit(_verifiers()[name], level=level, seed=seed, progress=False, worlds=worlds)
    else:
        from exactcheck.corpus.generators import correct_generators
        from exactcheck.e2e.runner import run_generator_audit
        audit = run_generator_audit(correct_generators()[name], level=level, seed=seed, progress=False)
    failed = [v for v in audit.verdicts if v.outcome.failed]
    known = []
    if kind == "generator":  # a member's own true boundary finding is expected, and counted apart
        from exactcheck.corpus.generators import KNOWN_FINDINGS
        known = [v for v in failed if v.law in KNOWN_FINDINGS.get(name, ())]
        failed = [v for v in failed if v not in known]
    exactness = [v for v in failed if v.category is Category.EXACTNESS]
    conformance = [v for v in failed if v.category is Category.CONFORMANCE]
    return {
        "conformance": [v.check for v in conformance], "rule_note": getattr(audit, "rule_note", ""),
        "member": name, "seed": seed, "level": level, "seconds": time.perf_counter() - start,
        "deterministic": [v.check for v in exactness if v.statistic is None],
        "statistical": [v.check for v in exactness if v.statistic is not None],
        "reproducibility": [v.check for v in failed if v.category is Category.REPRODUCIBILITY],
        "input_handling": [v.check for v in failed if v.category is Category.INPUT_HANDLING],
        "unreachable": [v.check for v in audit.verdicts if v.outcome is Outcome.UNREACHABLE],
        "inconclusive": [v.check for v in audit.verdicts if v.outcome is Outcome.INCONCLUSIVE
                         and "not run to its budget" not in v.summary],
        "messages": [v.summary for v in exactness + conformance],
        "known": [v.check for v in known],
    }


def _verifiers() -> dict:
    from exactcheck.corpus.other_rules import OTHER_RULE_VERIFIERS
    from exactcheck.corpus.verifiers import CORRECT_VERIFIERS
    return {**CORRECT_VERIFIERS, **OTHER_RULE_VERIFIERS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--level", default="quick")
    parser.add_argument("--generators", action="store_true", help="audit the corpus generators instead")
    parser.add_argument("--members", help="comma-separated subset")
    parser.add_argument("--worlds", help="comma-separated worlds of the verifiers' audits (e.g. properties: "
                        "the forced-value searches alone)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", help="write every audit's row here")
    args = parser.parse_args()
    kind = "generator" if args.generators else "verifier"
    if args.generators:
        from exactcheck.corpus.generators import CORRECT_GENERATORS as names
    else:
        names = list(_verifiers())
    if args.members:
        names = [n for n in names if n in args.members.split(",")]
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    worlds = tuple(args.worlds.split(",")) if args.worlds else None
    jobs = [(kind, name, args.level, seed, worlds) for name in names for seed in seeds]
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(audit_one, *zip(*jobs)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"correct {kind}s, level {args.level}, seeds {seeds.start}-{seeds.stop - 1}"
          + (f", worlds {args.worlds}" if args.worlds else "") + ", "
          f"{time.perf_counter() - start:.0f} s")
    head = (f"{'member':<28} {'audits':>6} {'determ.':>7} {'stat. FA':>8} {'conform.':>8} {'reprod.':>7} "
            f"{'inputs':>6} {'unreach.':>8} {'inconcl.':>8} {'known':>5} {'s/audit':>7}  rule named")
    print(head)
    print("-" * len(head))
    for name in names:
        mine = [r for r in rows if r["member"] == name]
        count = lambda key: sum(bool(r[key]) for r in mine)  # noqa: E731
        named = sorted({r["rule_note"].split("acceptance_rule = ")[1].split(" ")[0] for r in mine
                        if "acceptance_rule = " in r["rule_note"]})
        print(f"{name:<28} {len(mine):>6} {count('deterministic'):>7} {count('statistical'):>8} "
              f"{count('conformance'):>8} {count('reproducibility'):>7} {count('input_handling'):>6} "
              f"{count('unreachable'):>8} {sum(len(r['inconclusive']) for r in mine) / len(mine):>8.1f} "
              f"{sum(bool(r.get('known')) for r in mine):>5} "
              f"{sum(r['seconds'] for r in mine) / len(mine):>7.1f}  {', '.join(named)}")
    for r in rows:
        for check, message in zip(r["deterministic"] + r["statistical"] + r["conformance"], r["messages"]):
            print(f"  finding: {r['member']} seed {r['seed']}: {check}: {message[:300]}")


if __name__ == "__main__":
    main()
