"""The gate's JUnit XML: a testsuite per subject, a testcase per check, for CI systems."""
from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from exactcheck.report.verdict import Outcome

if TYPE_CHECKING:
    from exactcheck.gate import GateResult

__all__ = ["junit_xml"]


def junit_xml(results: "list[GateResult]") -> str:
    """Failed checks are <failure> (a crash is <error>), inconclusive and exempt failed checks
    are <skipped>; a finding in a category the subject does not require is <skipped> and counted
    as neither."""
    suites = ET.Element("testsuites", name="exactcheck")
    totals = dict(tests=0, failures=0, errors=0, skipped=0)
    for result in results:
        counts = dict(tests=0, failures=0, errors=0, skipped=0)
        suite = ET.SubElement(suites, "testsuite", name=result.subject.name,
                              time=f"{result.audit.duration_s:.3f}")
        for v in result.audit.verdicts:
            counts["tests"] += 1
            case = ET.SubElement(suite, "testcase", classname=f"exactcheck.{result.subject.name}", name=v.check,
                                 time="0")
            if v.outcome.failed and not result.audit.gates(v):
                ET.SubElement(case, "skipped", message=f"{v.category.value} finding, not required: {v.summary}")
            elif v.outcome.failed and result.exempted(v):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"exempt: {v.outcome.value}: {v.summary}")
            elif v.outcome is Outcome.CRASHED:
                counts["errors"] += 1
                ET.SubElement(case, "error", message=v.summary, type=v.outcome.value).text = v.describe()
            elif v.outcome.failed:
                counts["failures"] += 1
                ET.SubElement(case, "failure", message=v.summary, type=v.outcome.value).text = v.describe()
            elif v.outcome is Outcome.INCONCLUSIVE:
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=f"inconclusive: {v.summary}")
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
    for key, value in totals.items():
        suites.set(key, str(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
