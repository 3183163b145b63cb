"""Regenerate committed audit reports and compare them with the committed ones, field by field.

    python benchmarks/regenerate_reports.py [--only selftest,tree,recurrent] [--keep DIR] [--committed DIR] [--code DIR]

Each committed report below is an ``exactcheck`` command at a fixed level and seed, so running it
again must write the same report apart from what a run cannot repeat: its durations, its start
time and the environment it ran in (versions, host). The JSON reports are compared field by field
(every leaf, by its path, those keys left out); the Markdown reports line by line, with durations
("2.5 s") and version strings masked. A difference is printed with its path (JSON) or its line
(Markdown), and the exit status is 1 if any report differs. ``--committed DIR`` compares with the
reports in DIR instead of reports/ (another checkout's regenerated ones: a change that must not
alter any report, such as a refactor, is checked this way), ``--code DIR`` runs the commands in
another checkout.

Which reports: the selftest at level standard (its JSON and Markdown), the tree audits of the
built-in tree verifiers at quick, and the recurrent audits of transformers' two generators at quick
(``reports/recurrent-*``; they need transformers). The served audits need their servers (their own
benchmarks regenerate them) and are not here.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
# what a run cannot repeat: left out of the field-by-field comparison (any depth)
UNREPEATABLE = {"duration_s", "started", "environment", "seconds", "wall_s"}

# (group, committed report stem, command arguments after ``exactcheck``)
REPORTS = [
    ("selftest", "selftest-standard-seed0", ["selftest", "--level", "standard", "--seed", "0"]),
    *[("tree", f"tree-tree-reference-{rule}-quick-seed0",
       ["tree", f"tree-reference:{rule}", "--level", "quick", "--seed", "0"])
      for rule in ("deterministic", "multi_round", "target_only", "without_replacement")],
    ("tree", "tree-sglang-tree-target-only-quick-seed0",
     ["tree", "sglang-tree-target-only", "--level", "quick", "--seed", "0"]),
    ("tree", "tree-trtllm-dynamic-tree-quick-seed0", ["tree", "trtllm-dynamic-tree", "--level", "quick", "--seed", "0"]),
    *[("recurrent", f"recurrent-transformers-{name}-quick-seed0",
       ["recurrent", f"transformers-{name}", "--level", "quick", "--seed", "0"])
      for name in ("assisted", "prompt-lookup")],
]


def json_differences(committed, regenerated, path: str = "") -> list[str]:
    """Every leaf that differs, by its path (``UNREPEATABLE`` keys left out at any depth)."""
    if isinstance(committed, dict) and isinstance(regenerated, dict):
        out = []
        for key in sorted(set(committed) | set(regenerated), key=str):
            if key in UNREPEATABLE:
                continue
            if key not in committed or key not in regenerated:
                out.append(f"{path}/{key}: only in the {'regenerated' if key in regenerated else 'committed'} report")
                continue
            out += json_differences(committed[key], regenerated[key], f"{path}/{key}")
        return out
    if isinstance(committed, list) and isinstance(regenerated, list):
        if len(committed) != len(regenerated):
            return [f"{path}: {len(committed)} items committed, {len(regenerated)} regenerated"]
        return [d for i, (a, b) in enumerate(zip(committed, regenerated)) for d in json_differences(a, b, f"{path}[{i}]")]
    return [] if committed == regenerated else [f"{path}: committed {committed!r}, regenerated {regenerated!r}"]


_MASKS = [(re.compile(r"\b\d+(\.\d+)? ?(s|ms|min)\b"), "<time>"),
          (re.compile(r"(exactcheck|torch|transformers|python) \d[\w.+-]*"), r"\1 <version>")]


def markdown_differences(committed: str, regenerated: str) -> list[str]:
    def masked(text: str) -> list[str]:
        lines = text.splitlines()
        for pattern, mask in _MASKS:
            lines = [pattern.sub(mask, line) for line in lines]
        return lines
    a, b = masked(committed), masked(regenerated)
    if len(a) != len(b):
        return [f"{len(a)} lines committed, {len(b)} regenerated"]
    return [f"line {i + 1}: committed {x!r}, regenerated {y!r}" for i, (x, y) in enumerate(zip(a, b)) if x != y]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="groups to regenerate (comma-separated: selftest, tree, recurrent)")
    parser.add_argument("--keep", help="write the regenerated reports here (default: a temporary directory)")
    parser.add_argument("--committed", default=str(ROOT / "reports"), help="the reports to compare with (default: reports/)")
    parser.add_argument("--code", default=str(ROOT), help="the checkout whose exactcheck runs the commands (default: this one)")
    args = parser.parse_args()
    groups = set(filter(None, args.only.split(",")))
    out = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="exactcheck-regenerated-"))
    differing = 0
    for group, stem, command in REPORTS:
        if groups and group not in groups:
            continue
        begun = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "exactcheck", *command, "--report", str(out)], cwd=args.code,
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": args.code})
        seconds = time.perf_counter() - begun
        compared, differences = [], []
        for suffix in (".json", ".md"):
            found = sorted(pathlib.Path(args.committed).glob(stem + suffix)) + sorted(
                pathlib.Path(args.committed).glob(f"{stem}-h*{suffix}"))
            if not found:
                continue
            committed = found[0]
            # a subject named with a colon takes a hash after its stem (exactcheck.report.files.report_stem)
            written = sorted(out.glob(stem + suffix)) + sorted(out.glob(f"{stem}-h*{suffix}"))
            regenerated = written[0] if written else out / (stem + suffix)
            if not written:
                differences.append(f"{regenerated.name} was not written (exit {run.returncode}: "
                                   f"{(run.stderr or run.stdout).strip().splitlines()[-1:]})")
                continue
            compared.append(suffix)
            if suffix == ".json":
                differences += json_differences(json.loads(committed.read_text()), json.loads(regenerated.read_text()))
            else:
                differences += markdown_differences(committed.read_text(), regenerated.read_text())
        differing += bool(differences)
        print(f"{stem}: {'identical' if not differences else f'{len(differences)} differences'} "
              f"({'+'.join(compared) or 'nothing'} compared, exit {run.returncode}, {seconds:.0f} s)", flush=True)
        for line in differences[:20]:
            print(f"    {line}")
    print(f"{differing} report(s) differ; regenerated reports in {out}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
