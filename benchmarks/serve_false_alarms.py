"""False alarms of the serve audit on an exact served system, over many seeds.

The toy served model (``toy_models.served_lm``) speculates losslessly (rejection sampling with the
exact residual), so every finding of the audit on it is a false alarm. Each seed is one whole
quick serve audit (root seed = the seed): continuation laws under Holm at alpha, and the
deterministic checks (logprob fidelity, speculation ran, seed reproducibility, greedy identity).
Answers come in-process (``Client(transport=...)``: the same endpoint code, no HTTP), so hundreds
of audits fit a CI-sized machine. Writes reports/serve-false-alarms.json.

    python benchmarks/serve_false_alarms.py --seeds 200 [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactcheck.serve.endpoint import Sampling  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from toy_models.served_lm import ToyServedModel, respond  # noqa: E402

SAMPLINGS = (Sampling(), Sampling(temperature=0.7, top_k=5, min_p=0.05))


def one(seed: int) -> dict:
    model = ToyServedModel()

    def transport(base, path, body):
        return respond(model, path, body)[1]

    begun = time.perf_counter()
    result = run_serve_audit("local://toy-served", level="quick", seed=seed, alpha=1e-3, progress=False,
                             prompts=([1, 2],), samplings=SAMPLINGS, transport=transport, concurrency=1)
    return {"seed": seed, "passed": result.passed, "failed": [v.check for v in result.failed],
            "requests": result.samples_drawn, "min_pvalue": min((v.pvalue for v in result.verdicts
                                                                 if v.kind.statistical and v.pvalue is not None),
                                                                default=None),
            "seconds": round(time.perf_counter() - begun, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="reports/serve-false-alarms.json")
    args = parser.parse_args()
    begun = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, range(args.seeds)))
    alarms = [r for r in rows if not r["passed"]]
    data = {"what": "quick serve audits of the exact toy served model (2 worlds: 1 prompt x 2 samplings, "
                    "continuation laws of 3 tokens under Holm at alpha 1e-3, plus the deterministic checks)",
            "alpha": 1e-3, "audits": len(rows), "false_alarms": len(alarms),
            "alarms": alarms, "requests_per_audit": rows[0]["requests"] if rows else 0,
            "seconds": round(time.perf_counter() - begun, 1), "rows": rows}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(alarms)} false alarms in {len(rows)} quick serve audits at alpha 1e-3 "
          f"({data['seconds']} s); written {args.out}")


if __name__ == "__main__":
    main()
