"""Each constraint mutant of the served toy (issue 68: ``toy_models.served_constraints.CONSTRAINT_MUTANTS``)
under a quick serve audit, and the exact toy beside them, in llama.cpp's dialect (GBNF written by the
audit; temperature 1) and vLLM's (``structured_outputs``; temperature 0.7, top-k 6, masked first): the
continuation verdict of the constrained world, the answers outside the constraint, the estimated TV,
and the seconds.

    python benchmarks/constraint_mutants.py

Writes reports/serve-constraint-mutants.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exactcheck.endpoints.endpoint import Sampling  # noqa: E402
from exactcheck.serve.runner import run_serve_audit  # noqa: E402
from toy_models.served_constraints import CONSTRAINT_MUTANTS  # noqa: E402
from toy_models.served_lm import ToyServedModel, served_model  # noqa: E402

CHOICE, REGEX = "choice=ab|ba|cab|bb", "regex=[a-c]{2,5}"
SETTINGS = dict(level="quick", seed=0, progress=False, traffic="sequential", stream_share=0.1,
                samples_per_request=1, prompts=([1, 2],))


def one(api: str, mutant: str | None) -> dict:
    spec, length = (REGEX, 6) if mutant == "bonus_unmasked" else (CHOICE, 4)
    spec = f"temperature=0.7,top_k=6,{spec}" if api == "vllm" else spec  # where the engines' orders differ
    model = ToyServedModel(eos=5, sharpness=1.0, api=api, constraint_mutant=mutant)
    extra = {"api": "openai", "eos_ids": "5"} if api == "vllm" else {}
    begun = time.perf_counter()
    with served_model(model.as_plain()) as reference, served_model(model) as audited:
        result = run_serve_audit(audited.url, reference=reference.url, samplings=[Sampling.parse(spec)],
                                 length=length, **SETTINGS, **extra)
    law = next(v for v in result.verdicts if v.law == "continuation")
    return {"api": api, "mutant": mutant or "exact", "world": spec, "length": length, "check": law.check,
            "outcome": law.outcome.value, "samples": law.samples, "tv": None if law.tv is None else round(law.tv.estimate, 4), "detectable_tv": None if law.tv is None else law.tv.detectable, "pvalue": law.pvalue,
            "summary": law.summary, "failed": [v.check for v in result.failed],
            "seconds": round(time.perf_counter() - begun, 1)}


def main() -> None:
    rows = [one(api, mutant) for api in ("llama.cpp", "vllm") for mutant in (None, *CONSTRAINT_MUTANTS)]
    for r in rows:
        print(f"{r['api']:9} {r['mutant']:15} {r['outcome']:8} n={r['samples']} tv={r['tv']} {r['seconds']} s "
              f"{(r['summary'] or '')[:110]}")
    out = Path("reports/serve-constraint-mutants.json")
    out.write_text(json.dumps({"what": __doc__.splitlines()[0], "rows": rows}, indent=1) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
