"""Writing reports to disk: JSON, Markdown and (for audits) the self-contained HTML page, plus
each verdict's reproducer. Kept apart from the renderers so that ``json_md`` and ``html`` do not
import each other."""
from __future__ import annotations

import json
from pathlib import Path

from exactcheck.audit import reproducer_path
from exactcheck.report.cost_report import COST_SCHEMA, render_cost_html, render_cost_markdown
from exactcheck.report.html import render_audit_html, render_selftest_html
from exactcheck.report.json_md import AUDIT_SCHEMA, SELFTEST_SCHEMA, render_audit_markdown, render_selftest_markdown

__all__ = ["write_report"]


def write_report(data: dict, directory: str | Path, stem: str) -> tuple[Path, ...]:
    """Write ``STEM.json``, ``STEM.md`` and the self-contained ``STEM.html`` under ``directory``,
    and each reproducer under ``directory/reproducers/``; reproduce lines in ``data`` are
    rewritten (in place) to name ``directory`` instead of ``REPORT_DIR``. Return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / f"{stem}.json", directory / f"{stem}.md"
    if data["schema"] == COST_SCHEMA:
        html_path = directory / f"{stem}.html"
        json_path.write_text(json.dumps(data, indent=1) + "\n")
        md_path.write_text(render_cost_markdown(data))
        html_path.write_text(render_cost_html(data))
        return json_path, md_path, html_path
    audits = [data] if data["schema"] == AUDIT_SCHEMA else [data["reference"]]
    for audit in audits:
        for verdict in audit["verdicts"]:
            if verdict.get("reproducer"):
                path = directory / reproducer_path(verdict["check"], verdict["reproducer"].get("subject", ""))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(verdict["reproducer"], indent=1) + "\n")
            if verdict.get("reproduce") and "REPORT_DIR" in verdict["reproduce"]:
                verdict["reproduce"] = verdict["reproduce"].replace("REPORT_DIR", str(directory))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    render = render_selftest_markdown if data["schema"] == SELFTEST_SCHEMA else render_audit_markdown
    md_path.write_text(render(data))
    html_path = directory / f"{stem}.html"
    html_path.write_text(render_audit_html(data) if data["schema"] == AUDIT_SCHEMA else render_selftest_html(data))
    return json_path, md_path, html_path
