"""Report schema -> renderers: the one table that says how each kind of JSON report is shown.

Every report is a versioned JSON object (``schema``); its Markdown, HTML and pull-request forms
are rendered from that JSON, so a report can be re-rendered without re-running anything. A new
report format is one entry here: ``exactcheck render`` and ``write_report`` both read this table.
"""
from __future__ import annotations

from typing import Callable

from exactcheck.report.cost_report import COST_SCHEMA, render_cost_html, render_cost_markdown
from exactcheck.report.html import render_audit_html, render_pr_comment, render_selftest_html
from exactcheck.report.json_md import AUDIT_SCHEMA, SELFTEST_SCHEMA, render_audit_markdown, render_selftest_markdown
from exactcheck.report.served_cost_report import (SERVED_COST_SCHEMA, render_served_cost_html,
                                                  render_served_cost_markdown)

__all__ = ["RENDERERS", "renderer", "SCHEMAS", "FORMS"]

RENDERERS: dict[str, dict[str, Callable[[dict], str]]] = {
    AUDIT_SCHEMA: {"markdown": render_audit_markdown, "html": render_audit_html, "pr": render_pr_comment},
    SELFTEST_SCHEMA: {"markdown": render_selftest_markdown, "html": render_selftest_html},
    COST_SCHEMA: {"markdown": render_cost_markdown, "html": render_cost_html},
    SERVED_COST_SCHEMA: {"markdown": render_served_cost_markdown, "html": render_served_cost_html},
}
SCHEMAS = tuple(RENDERERS)
FORMS = tuple(dict.fromkeys(form for forms in RENDERERS.values() for form in forms))  # what --format takes


def renderer(schema: str | None, form: str) -> Callable[[dict], str]:
    """The function that renders a report of ``schema`` as ``form`` ("markdown", "html", "pr");
    ValueError naming what exists when there is none."""
    forms = RENDERERS.get(schema)
    if forms is None:
        raise ValueError(f"not an exactcheck report (schema {schema!r}; known: {', '.join(SCHEMAS)})")
    if form not in forms:
        raise ValueError(f"a report of schema {schema} renders as {' or '.join(forms)}, not {form}")
    return forms[form]
