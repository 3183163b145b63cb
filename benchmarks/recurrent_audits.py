"""The recurrent-state audit measured: every reference loop and every mutant at one level (the
mutant table: found by which check, seconds), and the false alarms of the exact references over
many seeds (``--false-alarms N``: N audits, spread over the three reference loops).

    python benchmarks/recurrent_audits.py --mutants            # reports/recurrent-mutants.{md,json}
    python benchmarks/recurrent_audits.py --false-alarms 200   # reports/recurrent-false-alarms.json

Worker processes (``--jobs``, default 2) run one audit each; every audit is seeded, so the figures
reproduce.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
REFERENCES = ("recurrent-snapshot", "recurrent-recompute", "recurrent-state-table")


def _audit(name: str, seed: int, level: str) -> dict:
    import torch
    torch.set_num_threads(1)
    from exactcheck.audit_kinds import audit_subject
    clock = time.perf_counter()
    result = audit_subject("recurrent", name, level=level, seed=seed, progress=False)
    failed = [v for v in result.verdicts if v.outcome.failed]
    return {"subject": name, "seed": seed, "passed": result.passed, "seconds": round(time.perf_counter() - clock, 1),
            "failed": [{"check": v.check, "outcome": v.outcome.value, "summary": v.summary,
                        "tv": v.tv_estimate} for v in failed]}


def _pool(jobs: int):
    return concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))


def mutants(level: str, jobs: int) -> list[dict]:
    from exactcheck.recurrent.entry import MUTANT_PREFIX
    from exactcheck.recurrent.loops import RECURRENT_MUTANTS
    names = list(REFERENCES) + [MUTANT_PREFIX + m for m in RECURRENT_MUTANTS]
    with _pool(jobs) as pool:
        rows = list(pool.map(_audit, names, [0] * len(names), [level] * len(names)))
    lines = ["# The recurrent-state audit: reference loops and mutants", "",
             f"`python benchmarks/recurrent_audits.py --mutants` (level {level}, seed 0, one worker process per "
             "audit, one torch thread each).", "",
             "| subject | verdict | failed checks | the law's TV; the state breach named | seconds |", "|---|---|---|---|---|"]
    for row in rows:
        law = next((f for f in row["failed"] if f["tv"] is not None), None)
        state = next((f for f in row["failed"] if f["check"].endswith("/state_rollback")), None)
        what = "; ".join(x for x in (f"{law['check']}: {law['summary']}" if law else "",
                                     state["summary"].replace("|", "/")[:260] if state else "") if x)
        lines.append(f"| `{row['subject']}` | {'passed' if row['passed'] else 'FAILED'} | "
                     f"{', '.join(f['check'] for f in row['failed']) or '-'} | {what} | {row['seconds']} |")
    (ROOT / "reports" / "recurrent-mutants.md").write_text("\n".join(lines) + "\n")
    (ROOT / "reports" / "recurrent-mutants.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def false_alarms(audits: int, level: str, jobs: int) -> dict:
    """``audits`` quick audits of the reference loops (in turn), seeds 1000...; each finished audit is
    appended to reports/recurrent-false-alarms.jsonl as it ends, and a rerun skips those there."""
    names = [REFERENCES[i % len(REFERENCES)] for i in range(audits)]
    seeds = [1000 + i for i in range(audits)]
    log = ROOT / "reports" / "recurrent-false-alarms.jsonl"
    done = {}
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line)
            done[(row["subject"], row["seed"])] = row
    todo = [(n, s) for n, s in zip(names, seeds) if (n, s) not in done]
    clock = time.perf_counter()
    with _pool(jobs) as pool, open(log, "a") as out:
        futures = [pool.submit(_audit, n, s, level) for n, s in todo]
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            done[(row["subject"], row["seed"])] = row
            out.write(json.dumps(row) + "\n")
            out.flush()
    rows = [done[(n, s)] for n, s in zip(names, seeds)]
    alarms = [r for r in rows if not r["passed"]]
    out = {"audits": audits, "level": level, "alpha": 1e-3, "false_alarms": len(alarms),
           "per_subject": {n: sum(r["subject"] == n for r in rows) for n in REFERENCES},
           "alarms": alarms, "audit_seconds_median": sorted(r["seconds"] for r in rows)[len(rows) // 2],
           "wall_s_this_run": round(time.perf_counter() - clock, 1), "seeds": f"{seeds[0]}..{seeds[-1]}"}
    (ROOT / "reports" / "recurrent-false-alarms.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", action="store_true")
    parser.add_argument("--false-alarms", type=int, default=0, metavar="N")
    parser.add_argument("--level", default="quick")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.mutants:
        for row in mutants(args.level, args.jobs):
            print(row["subject"], "passed" if row["passed"] else "FAILED", row["seconds"],
                  [f["check"] for f in row["failed"]])
    if args.false_alarms:
        out = false_alarms(args.false_alarms, args.level, args.jobs)
        print(f"{out['false_alarms']} false alarms in {out['audits']} audits ({out['wall_s_this_run']} s this run)")


if __name__ == "__main__":
    main()
