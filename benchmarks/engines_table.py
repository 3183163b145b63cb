"""The engines table of docs/engines.md from the engines step's reports (``engine-PATH.json``,
written by ``property_tests/engines/test_engine_kernels.py`` under ``$EXACTCHECK_ENGINES_REPORTS``).

    python benchmarks/engines_table.py reports/engines
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from exactcheck.adapters.engine_paths import PATHS


def _reach(verdict: dict) -> str:
    """A finding's reachability: the forced draw and its per-draw probability."""
    reach = verdict.get("reachability") or {}
    if reach.get("kind") != "forced":
        return verdict["outcome"]
    bits = {"float64": 53, "float32": 24}.get(reach.get("dtype"))
    probability = f"2^-{bits}" if bits and reach["per_draw_probability"] == 2.0 ** -bits else f"{reach['per_draw_probability']:.2g}"
    return (f"{verdict['outcome']}; {reach['draws']} {reach['dtype']} draw of {reach['draw_function']} at "
            f"{reach['value']!r}: {probability} per draw")


def row(path: str, data: dict) -> str:
    release, setting = PATHS[path]
    laws = [v for v in data["verdicts"] if v.get("check_kind") in ("law", "chain_rule") and v.get("detectable_tv")]
    tvs = sorted(v["detectable_tv"] for v in laws)
    trials = data["budget"]["samples_drawn"]
    failed = [v for v in data["verdicts"] if v["outcome"] in ("defect", "crashed", "contract_violation")]
    findings = "; ".join(f"`{v['check']}` ({_reach(v)})" for v in failed) or "none"
    exact = sum(v["outcome"] == "exact" for v in laws)
    rule = (data.get("rule") or {}).get("rule") or "undeclared"
    rule = "relaxed:topk=1,delta=0 (greedy)" if rule == "relaxed" else rule
    return (f"| `{path}` | {release} | {setting} | {rule} | {data['duration_s']:.0f} s | {exact} of {len(laws)} "
            f"exact on {trials:,} trials; detectable TV {tvs[0]:.3f} to {tvs[-1]:.3f} (median "
            f"{tvs[len(tvs) // 2]:.3f}) | {findings} |")


def main(directory: str) -> None:
    for path in PATHS:
        report = Path(directory) / f"engine-{path}.json"
        if report.exists():
            print(row(path, json.loads(report.read_text())))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports/engines")
