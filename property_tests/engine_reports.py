"""The engines step's reports: each engine test writes its audit's JSON, Markdown and HTML under
``$EXACTCHECK_ENGINES_REPORTS`` when it is set (``.ci/engines``; ``reports/engines`` holds a run's)."""
from __future__ import annotations

import os


def write_engine_report(result, name: str) -> None:
    """``engine-NAME.*`` for ``result`` in ``$EXACTCHECK_ENGINES_REPORTS``; nothing when unset."""
    directory = os.environ.get("EXACTCHECK_ENGINES_REPORTS")
    if directory:
        from exactcheck.report.files import write_report
        from exactcheck.report.json_md import audit_to_json
        write_report(audit_to_json(result), directory, f"engine-{name}")
