"""The penalties measured: the reference loop and each penalty mutant audited at one level under
two penalty policies (transformers' repetition penalty 1.8; vLLM's convention with repetition 1.3,
presence 0.4, frequency 0.6 at temperature 0.8) on the two context model worlds, greedy identity
left out (it runs without penalties). Writes reports/penalty-mutants.{md,json}.

    python benchmarks/penalty_audits.py [--level quick] [--subjects reference,penalty_once_per_step]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORLDS = ["hf_v3_l4_k3", "hf_v4_l3_k2"]


def policies():
    from exactcheck.e2e.policy import DecodingPolicy
    return (DecodingPolicy(1.0, repetition_penalty=1.8),
            DecodingPolicy(0.8, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.6,
                           penalty_convention="vllm"))


def subjects() -> dict:
    from exactcheck.adapters.hf_generate import AssistedGeneration
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    from exactcheck.e2e.penalty_mutants import PENALTY_MUTANTS
    return {"reference": ReferenceSpeculativeLoop(), "transformers-assisted": AssistedGeneration(),
            **PENALTY_MUTANTS}


def main() -> None:
    import torch
    torch.set_num_threads(1)
    from exactcheck.e2e.runner import run_generator_audit
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--subjects", help="comma-separated (default: all)")
    args = parser.parse_args()
    chosen = subjects()
    if args.subjects:
        chosen = {k: v for k, v in chosen.items() if k in args.subjects.split(",")}
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
    lines = ["# Penalty policies: the reference loop, transformers' assisted generation and the penalty mutants", "",
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
    (ROOT / "reports" / "penalty-mutants.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
