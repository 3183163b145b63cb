"""The gate's JUnit XML: a testsuite per subject, a testcase per check, for CI systems."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from exactcheck.report.escaping import xml_text
from exactcheck.report.verdict import Outcome

if TYPE_CHECKING:
    from exactcheck.report.result import GateResult

__all__ = ["junit_xml"]


def junit_xml(results: "list[GateResult]") -> str:
    """Failed checks are <failure> (a crash is <error>), inconclusive and exempt failed checks
    are <skipped>; a finding in a category the subject does not require is <skipped> and counted
    as neither. Every name and message is ``xml_text``: an ANSI escape or another control
    character in a subject's exception text cannot make the file malformed."""
    suites = ET.Element("testsuites", name="exactcheck")
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    for result in results:
        counts = dict(tests=0, failures=0, errors=0, skipped=0)
        name = xml_text(result.subject.name)
        suite = ET.SubElement(suites, "testsuite", name=name, time=f"{result.audit.duration_s:.3f}")
        for v in result.audit.verdicts:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"exactcheck.{name}", name=xml_text(v.check),
                                 time="0")
            summary = xml_text(v.summary)
            if v.outcome.failed and not result.audit.gates(v):
                ET.SubElement(case, "skipped", message=f"{v.category.value} finding, not required: {summary}")
            elif v.outcome.failed and result.exempted(v):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"exempt: {v.outcome.value}: {summary}")
            elif v.outcome is Outcome.CRASHED:
                counts["errors"] += 1
                ET.SubElement(case, "error", message=summary, type=v.outcome.value).text = xml_text(v.describe())
            elif v.outcome.failed:
                counts["failures"] += 1
                ET.SubElement(case, "failure", message=summary, type=v.outcome.value).text = xml_text(v.describe())
            elif v.outcome is Outcome.INCONCLUSIVE:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"inconclusive: {summary}")
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
