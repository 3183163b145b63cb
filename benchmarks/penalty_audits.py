"""The penalties measured: the reference loop and each penalty mutant audited at one level under
two penalty policies (transformers' repetition penalty 1.8; vLLM's convention with repetition 1.3,
presence 0.4, frequency 0.6 at temperature 0.8) on the two context model worlds, greedy identity
left out (it runs without penalties). Writes reports/penalty-mutants.{md,json}.

    python benchmarks/penalty_audits.py [--level quick] [--subjects reference,penalty_once_per_step]
    python benchmarks/penalty_audits.py --seeds 50     # the reference loop under seeds 1000.., one line each
                                                        # to reports/penalty-false-alarms.jsonl (resumes)
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORLDS = ["hf_v3_l4_k3", "hf_v4_l3_k2"]


def policies():
    from exactcheck.contracts.policy import DecodingPolicy
    return (DecodingPolicy(1.0, repetition_penalty=1.8),
            DecodingPolicy(0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6,
                           penalty_convention="vllm"))


def subjects() -> dict:
    from exactcheck.adapters.hf_generate import AssistedGeneration, PromptLookup
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    from exactcheck.e2e.penalty_mutants import PENALTY_MUTANTS
    return {"reference": ReferenceSpeculativeLoop(), "transformers-assisted": AssistedGeneration(),
            "transformers-prompt-lookup": PromptLookup(), **PENALTY_MUTANTS}


def main() -> None:
    import torch
    torch.set_num_threads(1)
    from exactcheck.e2e.runner import run_generator_audit
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--subjects", help="comma-separated (default: all)")
    parser.add_argument("--seeds", type=int, help="the reference loop alone under this many seeds (1000, 1001, ...): "
                                                   "its false alarms, to reports/penalty-false-alarms.{jsonl,json}")
    args = parser.parse_args()
    if args.seeds:
        return false_alarms(args.seeds, args.level)
    chosen = subjects()
    if args.subjects:
        chosen = {k: v for k, v in chosen.items() if k in args.subjects.split(",")}
    report = ROOT / "reports" / "penalty-mutants.json"
    kept = {r["subject"]: r for r in json.loads(report.read_text())} if args.subjects and report.exists() else {}
    rows = []
    for name, subject in chosen.items():
        clock = time.perf_counter()
        result = run_generator_audit(subject, level=args.level, seed=0, progress=False, greedy=False, worlds=WORLDS,
                                     policies=policies())
        failed = [v for v in result.verdicts if v.outcome.failed]
        rows.append({"subject": name, "passed": result.passed, "seconds": round(time.perf_counter() - clock, 1),
                     "failed": [{"check": v.check, "tv": v.tv_estimate, "summary": v.summary} for v in failed]})
        print(name, "passed" if result.passed else "FAILED", rows[-1]["seconds"], [f["check"] for f in rows[-1]["failed"]],
              flush=True)
    # --subjects: the other subjects' rows as the report held them
    fresh = {r["subject"]: r for r in rows}
    rows = [fresh.get(name) or kept[name] for name in subjects() if name in fresh or name in kept]
    lines = ["# Penalty policies: the reference loop, transformers' assisted generation and prompt lookup, and the "
             "penalty mutants", "",
             f"`python benchmarks/penalty_audits.py` (level {args.level}, seed 0, worlds {', '.join(WORLDS)}, "
             "policies t1_rep1.8 and t0.8_rep1.3_pres0.4_freq0.6_vllm, greedy identity left out).", "",
             "| subject | verdict | found by | largest TV | seconds |", "|---|---|---|---|---|"]
    for row in rows:
        tvs = [f["tv"] for f in row["failed"] if f["tv"] is not None]
        lines.append(f"| `{row['subject']}` | {'passed' if row['passed'] else 'FAILED'} | "
                     f"{', '.join(f['check'] for f in row['failed']) or '-'} | "
                     f"{max(tvs):.3f} |" if tvs else
                     f"| `{row['subject']}` | {'passed' if row['passed'] else 'FAILED'} | "
                     f"{', '.join(f['check'] for f in row['failed']) or '-'} | - |")
        lines[-1] += f" {row['seconds']} |"
    (ROOT / "reports" / "penalty-mutants.md").write_text("\n".join(lines) + "\n")
    report.write_text(json.dumps(rows, indent=1) + "\n")


def false_alarms(seeds: int, level: str) -> None:
    """The exact reference loop under ``seeds`` root seeds with both penalty policies on both worlds:
    every failed verdict is a false alarm (alpha 1e-3 over each audit, Holm). One line per audit is
    appended to the journal as it finishes, so an interrupted run resumes where it stopped."""
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    from exactcheck.e2e.runner import run_generator_audit
    journal = ROOT / "reports" / "penalty-false-alarms.jsonl"
    done = {json.loads(line)["seed"]: json.loads(line) for line in journal.read_text().splitlines()} \
        if journal.exists() else {}
    for seed in range(1000, 1000 + seeds):
        if seed in done:
            continue
        clock = time.perf_counter()
        result = run_generator_audit(ReferenceSpeculativeLoop(), level=level, seed=seed, progress=False, greedy=False,
                                     worlds=WORLDS, policies=policies())
        row = {"seed": seed, "passed": result.passed, "seconds": round(time.perf_counter() - clock, 1),
               "smallest_p": min((v.adjusted_pvalue for v in result.verdicts if v.adjusted_pvalue is not None),
                                 default=None),
               "failed": [{"check": v.check, "p": v.adjusted_pvalue, "summary": v.summary}
                          for v in result.verdicts if v.outcome.failed]}
        with journal.open("a") as out:
            out.write(json.dumps(row) + "\n")
        done[seed] = row
        print(seed, "passed" if row["passed"] else "ALARM", row["seconds"], flush=True)
    rows = [done[s] for s in sorted(done)]
    alarms = [r for r in rows if not r["passed"]]
    summary = {"what": f"the exact reference loop (ReferenceSpeculativeLoop) audited at {level} under "
                       f"{len(rows)} root seeds, worlds {WORLDS}, policies t1_rep1.8 (transformers' convention) and "
                       "t0.8_rep1.3_pres0.4_freq0.6_vllm (vLLM's), greedy identity left out; alpha 1e-3 an audit (Holm)",
               "audits": len(rows), "false_alarms": len(alarms),
               "alarms": [{"seed": r["seed"], "failed": r["failed"]} for r in alarms],
               "smallest_p": min((r["smallest_p"] for r in rows if r["smallest_p"] is not None), default=None),
               "median_seconds": sorted(r["seconds"] for r in rows)[len(rows) // 2] if rows else None}
    (ROOT / "reports" / "penalty-false-alarms.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("audits", "false_alarms", "smallest_p")}))


if __name__ == "__main__":
    main()
