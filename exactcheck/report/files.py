"""Writing reports to disk: JSON, Markdown and HTML (rendered through ``exactcheck.report.formats``),
plus each verdict's reproducer. Kept apart from the renderers so that they do not import each
other."""
from __future__ import annotations

import json
from pathlib import Path

from exactcheck.report.formats import renderer
from exactcheck.report.json_md import AUDIT_SCHEMA, SELFTEST_SCHEMA
from exactcheck.reproduce import REPORT_DIR, reproducer_path

__all__ = ["write_report", "report_stem"]


def report_stem(prefix: str, name: str) -> str:
    """A file stem from a report's kind and its subject's name (letters, digits and underscores
    kept, every other character a dash)."""
    return prefix + "".join(c if c.isalnum() or c == "_" else "-" for c in name).strip("-")


def write_report(data: dict, directory: str | Path, stem: str) -> tuple[Path, ...]:
    """Write ``STEM.json``, ``STEM.md`` and the self-contained ``STEM.html`` under ``directory``,
    and each reproducer under ``directory/reproducers/``; reproduce lines in ``data`` are
    rewritten (in place) to name ``directory`` instead of ``REPORT_DIR``. Return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    audits = {AUDIT_SCHEMA: lambda: [data], SELFTEST_SCHEMA: lambda: [data["reference"]]}.get(data["schema"], list)()
    for audit in audits:
        for verdict in audit["verdicts"]:
            if verdict.get("reproducer"):
                path = directory / reproducer_path(verdict["check"], verdict["reproducer"].get("subject", ""))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(verdict["reproducer"], indent=1) + "\n")
            if verdict.get("reproduce") and REPORT_DIR in verdict["reproduce"]:
                verdict["reproduce"] = verdict["reproduce"].replace(REPORT_DIR, str(directory))
    json_path, md_path, html_path = (directory / f"{stem}.{suffix}" for suffix in ("json", "md", "html"))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(renderer(data["schema"], "markdown")(data))
    html_path.write_text(renderer(data["schema"], "html")(data))
    return json_path, md_path, html_path
