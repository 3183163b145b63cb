"""Audit transformers' `_speculative_sampling` (the installed version) and state, measured, what
it does at the boundaries. Writes reports/transformers-speculative-sampling.{json,md}.

    pip install transformers        # not a dependency of exactcheck
    python examples/audit_transformers.py [--level quick]
"""
from __future__ import annotations

import argparse

import torch

from exactcheck import run_audit
from exactcheck.adapters.hf_transformers import speculative_sampling_verifier
from exactcheck.contracts.verifier import validate_output
from exactcheck.memory import keep_freed_memory
from exactcheck.forcing.randomness import controlled_randomness, value_probability
from exactcheck.report.files import write_report
from exactcheck.report.json_md import audit_to_json
from exactcheck.step.strategies import VerifyCase


def _scenario(verifier, title, p, q, drafts, value):
    """Call the verifier once on explicit rows with every uniform forced to ``value``."""
    p, q, drafts = torch.as_tensor(p), torch.as_tensor(q), torch.as_tensor(drafts)
    if p.dim() == 2:  # one row: add the batch dimension
        p, q, drafts = p[None], q[None], drafts[None]
    record = {"scenario": title, "uniform": value, "target_probs": p[0].tolist(),
              "draft_probs": q[0].tolist(), "draft_tokens": drafts[0].tolist()}
    try:
        with controlled_randomness(value) as log:
            out = verifier(p, q, drafts, torch.Generator().manual_seed(0))
        out = validate_output(out, drafts, p.shape[-1])
        probs = [[float(p[b, i, t]) for i, t in enumerate(row) if t >= 0]
                 for b, row in enumerate(out.tolist())]
        record.update(result="returned", output=out.tolist() if len(out) > 1 else out[0].tolist(),
                      target_probs_of_emitted=probs if len(out) > 1 else probs[0],
                      forbidden_emitted=any(x == 0 for row in probs for x in row),
                      draws=dict(log.controlled),
                      delivered=[{"draw": d.entry, "dtype": str(d.dtype).replace("torch.", ""),
                                  "value": d.value, "per_draw_probability": value_probability(d.value, d.dtype)}
                                 for d in log.draws])
    except Exception as exc:  # what the subject does is the finding
        record.update(result="raised", error=f"{type(exc).__name__}: {exc}")
    return record


def boundary_scenarios(verifier) -> list[dict]:
    p = [0.0, 0.5, 0.5]
    q = [0.5, 0.25, 0.25]
    row = torch.tensor([0.1, 0.2, 0.3, 0.4])
    up = torch.nextafter(row, torch.full_like(row, 2.0)).tolist()
    return [
        _scenario(verifier, "uniform exactly 0, draft token with p(x) = 0 (q(x) = 0.5)",
                  [p, [0.2, 0.3, 0.5]], [q], [0], "zero"),
        _scenario(verifier, "same, uniform = largest value below 1", [p, [0.2, 0.3, 0.5]], [q], [0],
                  "one_minus_ulp"),
        _scenario(verifier, "p == q bitwise, uniform = largest value below 1",
                  [row.tolist(), [0.25] * 4], [row.tolist()], [3], "one_minus_ulp"),
        _scenario(verifier, "q = p moved one float32 ulp up on every token (p == q up to rounding), "
                  "uniform = largest value below 1", [row.tolist(), [0.25] * 4], [up], [3],
                  "one_minus_ulp"),
        _scenario(verifier, "q = p moved one float32 ulp up on every token, uniform 0",
                  [row.tolist(), [0.25] * 4], [up], [3], "zero"),
        _scenario(verifier, "the shrunk case the property search found: fp16-rounded rows (sums "
                  "1 ± 2e-4), q = p moved one float32 ulp up or down per token, uniform = largest "
                  "value below 1", *VerifyCase(3, 2, 2, "fp16", "nearly_equal", "any", 0).tensors(),
                  "one_minus_ulp"),
    ]


def _markdown(scenarios: list[dict]) -> str:
    lines = ["", "## Boundary behaviour, measured", "",
             "Each row: one call with explicit rows and every uniform forced (`exactcheck.forcing.randomness`).", "",
             "| scenario | what happened |", "|---|---|"]
    for s in scenarios:
        if s["result"] == "raised":
            what = f"raised `{s['error']}`"
        else:
            what = f"returned {s['output']}; target probability of each emitted token {s['target_probs_of_emitted']}"
            if s["forbidden_emitted"]:
                what += " — **a token with p = 0 was emitted**"
            what += "; uniforms delivered: " + ", ".join(
                f"{d['draw']} ({d['dtype']}) = {d['value']!r}, probability {d['per_draw_probability']:.3g} per draw"
                for d in s["delivered"])
        lines.append(f"| {s['scenario']} | {what} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", default="quick")
    parser.add_argument("--report", default="reports")
    args = parser.parse_args()
    keep_freed_memory()
    import transformers

    verifier = speculative_sampling_verifier()
    result = run_audit(verifier, subject_name=f"transformers {transformers.__version__} "
                       "_speculative_sampling", level=args.level, seed=0)
    data = audit_to_json(result)
    data["boundary_scenarios"] = boundary_scenarios(verifier)
    json_path, md_path, *_ = write_report(data, args.report, "transformers-speculative-sampling")
    md_path.write_text(md_path.read_text() + _markdown(data["boundary_scenarios"]))
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
