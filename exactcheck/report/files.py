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


def report_stem(prefix: str, name: str = "", level: str | None = None, seed: int | None = None) -> str:
    """A file stem from a report's kind, its subject's name and the settings that change what it
    draws: ``report_stem("e2e-", "mod:gen", "quick", 0)`` is ``e2e-mod-gen-quick-seed0``, so runs
    of other seeds, levels or subjects written to one directory keep their files apart. Letters,
    digits and underscores are kept, every other character becomes a dash (filesystem-safe);
    ``level`` and ``seed`` are left out where a command has none."""
    stem = (prefix + _slug(name)).strip("-")
    if level:
        stem += f"-{_slug(str(level))}"
    if seed is not None:
        stem += f"-seed{int(seed)}"
    return stem


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "-" for c in text).strip("-")


def write_report(data: dict, directory: str | Path, stem: str) -> tuple[Path, ...]:
    """Write ``STEM.json``, ``STEM.md`` and the self-contained ``STEM.html`` under ``directory``,
    and each reproducer under ``directory/reproducers/`` (named by subject, check, level and
    seed); reproduce lines in ``data`` are rewritten (in place) to name that file in ``directory``
    instead of ``REPORT_DIR``. Return the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    audits = {AUDIT_SCHEMA: lambda: [data], SELFTEST_SCHEMA: lambda: [data["reference"]]}.get(data["schema"], list)()
    for audit in audits:
        for verdict in audit["verdicts"]:
            if verdict.get("reproducer"):
                subject = verdict["reproducer"].get("subject", "")
                where = reproducer_path(verdict["check"], subject, audit.get("level"), audit.get("seed"))
                path = directory / where
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(verdict["reproducer"], indent=1) + "\n")
                if verdict.get("reproduce"):  # the replay line names the file of this level and seed
                    verdict["reproduce"] = verdict["reproduce"].replace(
                        f"{REPORT_DIR}/{reproducer_path(verdict['check'], subject)}", f"{REPORT_DIR}/{where}")
            if verdict.get("reproduce") and REPORT_DIR in verdict["reproduce"]:
                verdict["reproduce"] = verdict["reproduce"].replace(REPORT_DIR, str(directory))
    json_path, md_path, html_path = (directory / f"{stem}.{suffix}" for suffix in ("json", "md", "html"))
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    md_path.write_text(renderer(data["schema"], "markdown")(data))
    html_path.write_text(renderer(data["schema"], "html")(data))
    return json_path, md_path, html_path
