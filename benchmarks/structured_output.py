"""Structured output under speculation, end to end (issue 68): where the grammar's end and the
reasoning boundary fall in the draft windows, the grammar mutants at quick, and the false alarms
of the exact paths over many seeds.

    python benchmarks/structured_output.py boundaries [--generations 2000]
    python benchmarks/structured_output.py mutants [--seed 1] [--worlds think_choice_v9] [--json FILE]
    python benchmarks/structured_output.py false-alarms --seeds 50 [--generators batched-reference-loop]
                                           [--json JOURNAL]
    python benchmarks/structured_output.py summarise --json JOURNAL --report reports/structured-false-alarms.json

``boundaries``: the reference loop (k = 4) on the JSON, choice and reasoning worlds; for each
generation, the offset inside its round's block (0 to k) at which ``<eos>`` and ``</think>`` were
emitted, and whether it was an accepted draft (every emitted token but a block's last) or the
block's correction or bonus.
``mutants``: each grammar mutant's quick audit on the structured worlds (the JSON world too for
the mutants whose own world is the JSON one): the checks that found it, the TV or count, seconds.
``false-alarms``: quick audits of exact generators on ``choice_v9`` and ``think_choice_v9``,
seeds 1..N, counting the audits with any failed check (deterministic and statistical apart); a
generator of ``exactcheck.corpus.generators`` by its corpus name (its known boundary finding,
``KNOWN_FINDINGS``, counted apart).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

STRUCTURED = ("choice_v9", "think_choice_v9")


def boundaries(generations: int) -> None:
    import torch
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop, stop_at
    from exactcheck.generation.drive import drive_generator
    from toy_models.suite import all_model_worlds

    @dataclass(frozen=True)
    class Probe(ReferenceSpeculativeLoop):
        """The reference loop, recording each round's emitted block (measurement only)."""
        log: list = None

        def stop_at(self, emitted, policy):
            self.log.append(emitted.tolist())
            return stop_at(emitted, policy)

    for world in all_model_worlds()[2:]:
        log: list = []
        marks = {"<eos>": world.policy.stop_tokens[0]}
        if world.name.startswith("think"):
            from toy_models.structured import END_OF_THINKING
            marks["</think>"] = END_OF_THINKING
        drive_generator(Probe(4, log=log), world, generations, seed=1, policy=world.policy, probe=False)
        for label, token in marks.items():
            places = [(block.index(token), len(block)) for block in log if token in block]
            offsets = collections.Counter(offset for offset, _ in places)
            drafted = sum(offset < size - 1 for offset, size in places)  # the last emitted token is not a draft
            total = len(places)
            print(f"{world.name} {label}: emitted in {total} blocks; offset in block {dict(sorted(offsets.items()))}; "
                  f"as an accepted draft {drafted} ({drafted / max(total, 1):.0%}), inside a block (offset > 0) "
                  f"{total - offsets[0]} ({(total - offsets[0]) / max(total, 1):.0%})")
    del torch


def mutant_rows(seed: int, worlds: list[str] | None) -> list[dict]:
    from exactcheck.e2e.grammar_mutants import GRAMMAR_MUTANTS
    from exactcheck.e2e.runner import run_generator_audit
    rows = []
    for mutant in GRAMMAR_MUTANTS:
        for world in [w for w in mutant.found_on if not worlds or w in worlds]:
            start = time.perf_counter()
            result = run_generator_audit(mutant, worlds=[world], level="quick", seed=seed, progress=False)
            seconds = time.perf_counter() - start
            rows.append({"mutant": mutant.name, "world": world, "seconds": round(seconds, 1),
                         "found": [{"check": v.check, "tv": v.tv_estimate, "summary": v.summary.split("\n")[0]}
                                   for v in result.failed]})
            found = ", ".join(f"{f['check']} ({f['summary'][:90]})" for f in rows[-1]["found"]) or "NOT FOUND"
            print(f"{mutant.name} on {world}: {seconds:.0f} s; {found}", flush=True)
    return rows


def false_alarm_rows(generators: list[str], seeds: int, first: int, out) -> list[dict]:
    from exactcheck.corpus.generators import KNOWN_FINDINGS, correct_generators
    from exactcheck.e2e.runner import run_generator_audit
    from exactcheck.e2e.subjects import load_generator
    corpus, rows = correct_generators(), []
    for name in generators:
        for seed in range(first, first + seeds):
            start = time.perf_counter()
            result = run_generator_audit(corpus[name] if name in corpus else load_generator(name),
                                         worlds=list(STRUCTURED), level="quick", seed=seed, progress=False)
            known = [v.check for v in result.failed if v.law in KNOWN_FINDINGS.get(name, ())]
            failed = [v for v in result.failed if v.check not in known]
            row = {"generator": name, "seed": seed, "seconds": round(time.perf_counter() - start, 1),
                   "checks": len(result.verdicts), "alpha": result.alpha, "known": known,
                   "deterministic": [v.check for v in failed if v.statistic is None],
                   "statistical": [v.check for v in failed if v.statistic is not None],
                   "p_values": {v.check: v.pvalue for v in result.verdicts if v.statistic is not None}}
            rows.append(row)
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            print(f"{name} seed {seed}: {row['seconds']} s, failed {row['deterministic'] + row['statistical']}",
                  flush=True)
    for name in generators:
        mine = [r for r in rows if r["generator"] == name]
        print(f"{name}: {len(mine)} quick audits of {', '.join(STRUCTURED)}; audits with a deterministic finding "
              f"{sum(bool(r['deterministic']) for r in mine)}, with a statistical false alarm "
              f"{sum(bool(r['statistical']) for r in mine)}")
    return rows


def summarise(journal: str, report: str) -> None:
    """The false-alarm journal (one JSON line per audit) as one versioned JSON report."""
    with open(journal) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    p_values = sorted(p for r in rows for p in r["p_values"].values() if p is not None)
    summary = {"audits": len(rows), "generators": sorted({r["generator"] for r in rows}),
               "worlds": list(STRUCTURED), "level": "quick", "alpha": rows[0]["alpha"] if rows else None,
               "seeds": [min(r["seed"] for r in rows), max(r["seed"] for r in rows)] if rows else [],
               "with_deterministic_finding": sum(bool(r["deterministic"]) for r in rows),
               "with_statistical_false_alarm": sum(bool(r["statistical"]) for r in rows),
               "law_p_values": len(p_values), "smallest_p": p_values[0] if p_values else None,
               "share_at_or_below": {str(t): sum(p <= t for p in p_values) / max(len(p_values), 1)
                                     for t in (0.01, 0.05, 0.1)},
               "median_seconds": sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else None}
    with open(report, "w") as f:
        json.dump({"version": 1, "benchmark": "benchmarks/structured_output.py false-alarms", "summary": summary,
                   "audits": rows}, f, indent=1)
    print(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("boundaries", "mutants", "false-alarms", "summarise"))
    parser.add_argument("--generations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=1)
    parser.add_argument("--generators", default="batched-reference-loop")
    parser.add_argument("--worlds", help="mutants: only these of each mutant's worlds (comma-separated)")
    parser.add_argument("--json", help="write the rows here (false-alarms: one JSON line per audit; summarise: "
                        "read them from here)")
    parser.add_argument("--report", help="summarise: the JSON report to write")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    if args.mode == "summarise":
        summarise(args.json, args.report)
        return
    if args.mode == "boundaries":
        boundaries(args.generations)
    elif args.mode == "mutants":
        rows = mutant_rows(args.seed, args.worlds.split(",") if args.worlds else None)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
    else:
        with open(args.json, "w") if args.json else open(os.devnull, "w") as out:
            false_alarm_rows(args.generators.split(","), args.seeds, args.first_seed, out)


if __name__ == "__main__":
    main()
