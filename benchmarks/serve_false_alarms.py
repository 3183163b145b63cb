"""False alarms of the serve audit on exact served systems, over many seeds.

The toy served model (``toy_models.served_lm``) speculates losslessly (rejection sampling with the
exact residual), so every finding of the audit on it is a false alarm. Each seed is one whole
quick serve audit (root seed = the seed) of one exact path: continuation laws and speculation_ran
tests under Holm at alpha, and the deterministic checks (logprob fidelity, seed reproducibility,
greedy identity). Three paths take turns by seed:

- ``draft-model``: drafts from a draft table at every step (llama.cpp's API, counters per request);
- ``ngram-rare``: prompt lookup (n-gram 1) over a 64-token vocabulary, which drafts on about 5% of
  the requests at temperature 1 and on none at temperature 0.7 / top-k 5 (llama.cpp's API);
- ``ngram-rare-vllm``: the same through vLLM's dialect (server-wide ``/metrics`` counters).

Answers come in-process (``Client(transport=...)``: the same endpoint code, no HTTP), so hundreds
of audits fit a CI-sized machine. Writes reports/serve-false-alarms.json.

    python benchmarks/serve_false_alarms.py --seeds 300 [--jobs 2]
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
RARE = dict(vocab=64, sharpness=1.0, drafter="ngram", ngram=1)
PATHS = {"draft-model": (dict(), "auto"), "ngram-rare": (RARE, "auto"), "ngram-rare-vllm": (dict(RARE, api="vllm"), "openai")}


def one(seed: int) -> dict:
    path = list(PATHS)[seed % len(PATHS)]
    fields, api = PATHS[path]
    model = ToyServedModel(**fields)

    def transport(base, route, body):
        return respond(model, route, body)[1]

    begun = time.perf_counter()
    result = run_serve_audit("local://toy-served", level="quick", seed=seed, alpha=1e-3, progress=False, api=api,
                             prompts=([1, 2],), samplings=SAMPLINGS, transport=transport, concurrency=1)
    spec = [v for v in result.verdicts if v.law == "speculation_ran"]
    return {"seed": seed, "path": path, "passed": result.passed, "failed": [v.check for v in result.failed],
            "requests": result.samples_drawn,
            "min_pvalue": min((v.pvalue for v in result.verdicts if v.kind.statistical and v.pvalue is not None),
                              default=None),
            "speculation_ran": [(v.outcome.value, v.pvalue) for v in spec],
            "seconds": round(time.perf_counter() - begun, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=300)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="reports/serve-false-alarms.json")
    args = parser.parse_args()
    begun = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, range(args.seeds)))
    alarms = [r for r in rows if not r["passed"]]
    by_path = {}
    for name in PATHS:
        mine = [r for r in rows if r["path"] == name]
        judged = [p for r in mine for outcome, p in r["speculation_ran"] if p is not None]
        by_path[name] = {"audits": len(mine), "false_alarms": sum(not r["passed"] for r in mine),
                         "speculation_ran_false_alarms": sum(any(c.endswith("/speculation_ran") for c in r["failed"])
                                                             for r in mine),
                         "speculation_ran_judged": len(judged),
                         "speculation_ran_not_judged": sum(p is None for r in mine for _, p in r["speculation_ran"]),
                         "smallest_speculation_pvalue": min(judged, default=None)}
    data = {"what": "quick serve audits of exact toy served models (2 worlds: 1 prompt x 2 samplings; continuation "
                    "laws of 3 tokens and speculation_ran tests under Holm at alpha 1e-3, plus the deterministic "
                    "checks), three paths by seed: " + ", ".join(PATHS),
            "alpha": 1e-3, "audits": len(rows), "false_alarms": len(alarms), "by_path": by_path,
            "alarms": alarms, "seconds": round(time.perf_counter() - begun, 1), "rows": rows}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(alarms)} false alarms in {len(rows)} quick serve audits at alpha 1e-3 ({data['seconds']} s); "
          f"by path: {json.dumps(by_path)}; written {args.out}")


if __name__ == "__main__":
    main()
