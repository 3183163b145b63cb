"""The traffic mutants of issue 67, each audited under the default traffic and under the older one.

Every mutant is a defect of the toy served model (``toy_models.served_lm``) or a proxy in front of it
(``exactcheck.serve.mutants``) that only the traffic users send can show: a batch of mixed requests
(``batch_mutant``), a streamed answer (the ``stream_*`` proxies), an answer ending on an
end-of-generation token (``finish_mutant``). Each is audited twice at quick (seed 0, --max-samples 2000,
the exact toy server without speculation as the reference): under the default (mixed traffic, a quarter
streamed, the ``-ends`` world) and under the older traffic (``--traffic sequential`` for the batch and
finish mutants, ``--stream-share 0`` for the stream proxies). The table: the check that finds it, its
p-value or count, the seconds of the default audit, and what the older traffic found.

    python benchmarks/traffic_mutants.py   # writes reports/traffic-mutants.json and .md
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.mutants import proxy  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from toy_models.served_lm import ToyServedModel, served_model  # noqa: E402

QUICK = dict(level="quick", seed=0, progress=False, max_samples=2000)
SAMPLINGS = (Sampling(), Sampling(temperature=0.6, top_k=4))
PENALISED = (Sampling(), Sampling(presence_penalty=1.5, frequency_penalty=1.0))
STOPS = (Sampling(), Sampling(stop=("c",)))
ENDING = (Sampling(), Sampling(temperature=0.7, top_k=6))
# (name, the toy's fields, proxy or None, prompts, samplings, the older traffic's settings)
MUTANTS = [
    ("batch_mutant=other_row_settings", dict(batch_mutant="other_row_settings"), None, ([1, 2], [3, 4, 5]), SAMPLINGS,
     dict(traffic="sequential")),
    ("batch_mutant=shared_stream", dict(batch_mutant="shared_stream"), None, ([1, 2], [3, 4, 5]), SAMPLINGS,
     dict(traffic="sequential")),
    ("batch_mutant=other_row_accepted", dict(batch_mutant="other_row_accepted"), None, ([1, 2], [3, 4, 5]),
     SAMPLINGS, dict(traffic="sequential")),
    ("batch_mutant=batch_penalties", dict(batch_mutant="batch_penalties"), None, ([1, 2], [3, 4, 5]), PENALISED,
     dict(traffic="sequential")),
    ("batch_mutant=wide_batch_greedy", dict(batch_mutant="wide_batch_greedy"), None, ([1, 2], [3, 4, 5]),
     (Sampling(),), dict(concurrency=4)),
    ("proxy stream_drops_token", {}, "stream_drops_token", ([1, 2],), STOPS, dict(stream_share=0.0)),
    ("proxy stream_repeats_last", {}, "stream_repeats_last", ([1, 2],), STOPS, dict(stream_share=0.0)),
    ("proxy stream_past_stop", {}, "stream_past_stop", ([1, 2],), STOPS, dict(stream_share=0.0)),
    ("finish_mutant=past_eos", dict(eos=5, sharpness=1.0, finish_mutant="past_eos"), None, ([1, 2],), ENDING,
     dict(traffic="sequential")),
    ("finish_mutant=length_hides_stop", dict(eos=5, sharpness=1.0, finish_mutant="length_hides_stop"), None,
     ([1, 2],), ENDING, dict(traffic="sequential")),
    ("finish_mutant=usage_drafted", dict(eos=5, sharpness=1.0, finish_mutant="usage_drafted"), None, ([1, 2],),
     ENDING, dict(traffic="sequential")),
]


def _found(result) -> list[dict]:
    return [{"check": v.check, "pvalue": v.pvalue, "summary": (v.summary or "")[:240]} for v in result.failed]


def one(name, fields, proxy_name, prompts, samplings, older) -> dict:
    model = ToyServedModel(**fields)
    with served_model(model.as_plain()) as reference, served_model(model) as audited:
        if proxy_name is None:
            url, context = audited.url, None
        else:
            context = proxy(proxy_name, audited.url)
            url = context.__enter__().url
        try:
            begun = time.perf_counter()
            default = run_serve_audit(url, reference=reference.url, prompts=prompts, samplings=samplings, **QUICK)
            seconds = time.perf_counter() - begun
            old = run_serve_audit(url, reference=reference.url, prompts=prompts, samplings=samplings,
                                  **{**QUICK, **older})
        finally:
            if context is not None:
                context.__exit__(None, None, None)
    return {"mutant": name, "older": ", ".join(f"{k}={v}" for k, v in older.items()),
            "default_found": _found(default), "default_seconds": round(seconds, 1),
            "default_requests": default.samples_drawn, "older_found": _found(old)}


def main() -> None:
    rows = []
    for spec in MUTANTS:
        rows.append(one(*spec))
        print(rows[-1]["mutant"], [f["check"] for f in rows[-1]["default_found"]], "| older:",
              [f["check"] for f in rows[-1]["older_found"]], flush=True)
    Path("reports/traffic-mutants.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["# The traffic mutants (issue 67): found under the default traffic, and under the older", "",
             "Quick, seed 0, `--max-samples 2000`, the exact toy server without speculation as the reference "
             "(`benchmarks/traffic_mutants.py`). p: the finding's p-value (0 for a deterministic finding, "
             "whose count is in its words).", "",
             "| mutant | found by (default traffic) | p | what it says | seconds | older traffic | found there |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        first = r["default_found"][0] if r["default_found"] else None
        lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
            r["mutant"], ", ".join(f["check"] for f in r["default_found"]) or "**nothing**",
            "" if first is None or first["pvalue"] is None else f"{first['pvalue']:.3g}",
            "" if first is None else first["summary"][:160].replace("|", "/"), r["default_seconds"], r["older"],
            ", ".join(f["check"] for f in r["older_found"]) or "nothing"))
    Path("reports/traffic-mutants.md").write_text("\n".join(lines) + "\n")
    print("written reports/traffic-mutants.json and .md")


if __name__ == "__main__":
    main()
