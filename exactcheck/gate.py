"""The release gate: audit every subject a project lists in ``[tool.exactcheck]``.

    [tool.exactcheck]
    level = "quick"          # defaults for every subject
    seed = 0
    alpha = 1e-3
    device = "cpu"           # or "cuda", "cuda:1": where subjects and worlds run

    [[tool.exactcheck.subject]]
    name = "sampler"
    verifier = "my_pkg.sampling:verify"      # a step-level verifier, MODULE:CALLABLE
    level = "standard"                       # optional, per subject
    worlds = ["three_token", "ctx_v8_l3_k2"] # optional
    exempt = ["properties/seeded_rows"]      # optional: failures reported, not gating

    [[tool.exactcheck.subject]]
    name = "generate"
    generator = "transformers-assisted"      # an end-to-end generator (built-in name or MODULE:CALLABLE)

``exactcheck gate`` exits 1 when any subject has a failed check that is not exempt, and writes
JUnit XML (one testsuite per subject, one testcase per check) and JSON for CI systems.
"""
from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from exactcheck.audit import AuditResult
from exactcheck.errors import UsageError
from exactcheck.plan import DEFAULT_ALPHA, DEFAULT_LEVEL
from exactcheck.report.verdict import Outcome, Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["GateSubject", "GateResult", "read_config", "run_gate", "junit_xml", "gate_json"]

_KINDS = ("verifier", "generator")


@dataclass(frozen=True)
class GateSubject:
    name: str
    kind: str  # "verifier" or "generator"
    target: str  # MODULE:CALLABLE or a built-in generator name
    level: str
    seed: int
    alpha: float
    worlds: tuple[str, ...] | None = None
    exempt: tuple[str, ...] = ()
    require: tuple[str, ...] = ()  # finding categories that gate besides exactness
    device: str = "cpu"
    call_elements: int | str | None = None  # verifiers: target_probs elements per call, or "auto"


@dataclass(frozen=True)
class GateResult:
    subject: GateSubject
    audit: AuditResult

    def exempted(self, verdict: Verdict) -> bool:
        return verdict.check in self.subject.exempt or verdict.world in self.subject.exempt

    @property
    def blocking(self) -> tuple[Verdict, ...]:
        """Failed checks that are not exempt: each one fails the gate."""
        return tuple(v for v in self.audit.failed if not self.exempted(v))

    @property
    def passed(self) -> bool:
        return not self.blocking


def read_config(path: str | Path = "pyproject.toml", level: str | None = None,
                device: str | None = None) -> list[GateSubject]:
    """The subjects of ``[tool.exactcheck]`` in ``path`` (``level`` and ``device`` override every
    subject's)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    section = data.get("tool", {}).get("exactcheck")
    if not section:
        raise UsageError(f"{path} has no [tool.exactcheck] section")
    entries = section.get("subject") or []
    if not entries:
        raise UsageError(f"{path}: [tool.exactcheck] lists no [[tool.exactcheck.subject]]")
    subjects, names = [], set()
    for i, entry in enumerate(entries):
        kinds = [k for k in _KINDS if k in entry]
        if len(kinds) != 1:
            raise UsageError(f"{path}: subject {i + 1} needs exactly one of 'verifier' or 'generator'")
        kind = kinds[0]
        name = str(entry.get("name", entry[kind]))
        if name in names:
            raise UsageError(f"{path}: two subjects are named {name!r}")
        names.add(name)
        unknown = set(entry) - {"name", kind, "level", "seed", "alpha", "worlds", "exempt", "require", "device",
                                *(("call_elements",) if kind == "verifier" else ())}
        if unknown:
            raise UsageError(f"{path}: subject {name!r} has unknown keys {sorted(unknown)}")
        subjects.append(GateSubject(
            name=name, kind=kind, target=str(entry[kind]),
            level=level or entry.get("level", section.get("level", DEFAULT_LEVEL)),
            seed=int(entry.get("seed", section.get("seed", 0))),
            alpha=float(entry.get("alpha", section.get("alpha", DEFAULT_ALPHA))),
            worlds=tuple(entry["worlds"]) if entry.get("worlds") else None,
            exempt=tuple(entry.get("exempt", ())),
            require=_require(path, name, entry.get("require", section.get("require", ()))),
            device=device or str(entry.get("device", section.get("device", "cpu"))),
            call_elements=entry.get("call_elements")))
    return subjects


def _require(path, name: str, value) -> tuple[str, ...]:
    from exactcheck.plan import AuditOptions
    try:
        return AuditOptions.build(require=[value] if isinstance(value, str) else list(value)).require
    except UsageError as exc:
        raise UsageError(f"{path}: subject {name!r}: require: {exc}") from None


def run_gate(subjects: list[GateSubject], progress: bool = True, root: str | Path | None = None) -> list[GateResult]:
    """Audit every subject (imports resolve from ``root``, default the current directory). Every
    subject is loaded and its options checked before any audit runs, so a mistake in the last
    one costs no audit time. Ctrl-C during an audit ends the gate there: that audit's result is
    marked interrupted and is the last one returned."""
    from exactcheck.audit import resolve_device
    from exactcheck.plan import AuditOptions
    from exactcheck.subjects import load_generator, load_subject
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    loaded = {}
    for subject in subjects:
        try:
            AuditOptions.build(level=subject.level, seed=subject.seed, alpha=subject.alpha,
                               worlds=subject.worlds, require=subject.require, device=subject.device,
                               call_elements=subject.call_elements)
            resolve_device(subject.device)
            loaded[subject.name] = (load_subject if subject.kind == "verifier" else load_generator)(subject.target)
        except UsageError as exc:
            raise UsageError(f"subject {subject.name!r}: {exc}") from None
    results = []
    for subject in subjects:
        if progress:
            print(f"exactcheck gate: auditing {subject.name} ({subject.kind} {subject.target}, "
                  f"level {subject.level})", file=sys.stderr, flush=True)
        worlds = list(subject.worlds) if subject.worlds else None
        if subject.kind == "verifier":
            from exactcheck.audit import run_audit
            audit = run_audit(loaded[subject.name], subject_name=subject.target, level=subject.level,
                              seed=subject.seed, alpha=subject.alpha, worlds=worlds, progress=progress,
                              require=subject.require, device=subject.device,
                              call_elements=subject.call_elements)
        else:
            from exactcheck.e2e.audit import run_generator_audit
            audit = run_generator_audit(loaded[subject.name], subject_name=subject.target,
                                        level=subject.level, seed=subject.seed, alpha=subject.alpha,
                                        worlds=worlds, progress=progress, require=subject.require,
                                        device=subject.device)
        results.append(GateResult(subject, audit))
        if audit.interrupted:  # Ctrl-C: the subjects after this one are not audited
            break
    return results


def junit_xml(results: list[GateResult]) -> str:
    """JUnit XML: a testsuite per subject, a testcase per check. Failed checks are <failure>
    (a crash is <error>), inconclusive and exempt failed checks are <skipped>."""
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


def gate_json(results: list[GateResult]) -> dict:
    from exactcheck.report.json_md import audit_to_json
    return {
        "schema": "exactcheck.gate/1",
        "passed": all(r.passed for r in results) and not any(r.audit.interrupted for r in results),
        "interrupted": any(r.audit.interrupted for r in results),
        "subjects": [{"name": r.subject.name, "kind": r.subject.kind, "target": r.subject.target,
                      "passed": r.passed, "exempt": list(r.subject.exempt),
                      "blocking": [v.check for v in r.blocking], "audit": audit_to_json(r.audit)}
                     for r in results],
    }


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    if path.parent and not path.parent.exists():
        os.makedirs(path.parent, exist_ok=True)
    path.write_text(text)
    return path


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"
