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
from dataclasses import dataclass, field
from pathlib import Path

from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA, DEFAULT_LEVEL, AuditOptions, SubjectKind
from exactcheck.report.result import AuditResult
from exactcheck.report.verdict import Verdict
from exactcheck.subjects import audit_subject, entry_point

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["GateSubject", "GateResult", "read_config", "run_gate"]

# keys of a [[tool.exactcheck.subject]] entry that are not audit settings
_OWN_KEYS = ("name", "exempt", *(kind.value for kind in SubjectKind))
# settings [tool.exactcheck] may give every subject
_SHARED = ("level", "seed", "alpha", "device", "require")


@dataclass(frozen=True)
class GateSubject:
    name: str
    kind: SubjectKind
    target: str  # MODULE:CALLABLE or a built-in generator name
    options: AuditOptions
    settings: dict = field(default_factory=dict, hash=False)  # what only this kind takes (e.g. policies)
    exempt: tuple[str, ...] = ()

    @property
    def level(self) -> str:
        return self.options.level.value


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
    subject's), each with its settings validated by its kind's entry point."""
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
    defaults = {"level": DEFAULT_LEVEL, "seed": 0, "alpha": DEFAULT_ALPHA, "device": "cpu",
                **{k: v for k, v in section.items() if k in _SHARED}}
    overrides = {k: v for k, v in (("level", level), ("device", device)) if v is not None}
    subjects, names = [], set()
    for i, entry in enumerate(entries):
        kinds = [kind for kind in SubjectKind if kind.value in entry]
        if len(kinds) != 1:
            raise UsageError(f"{path}: subject {i + 1} needs exactly one of "
                             + " or ".join(repr(kind.value) for kind in SubjectKind))
        kind = kinds[0]
        name = str(entry.get("name", entry[kind.value]))
        if name in names:
            raise UsageError(f"{path}: two subjects are named {name!r}")
        names.add(name)
        settings = {**defaults, **{k: v for k, v in entry.items() if k not in _OWN_KEYS}, **overrides}
        try:
            options, own = entry_point(kind).split(settings)
        except UsageError as exc:
            raise UsageError(f"{path}: subject {name!r}: {exc}") from None
        subjects.append(GateSubject(name=name, kind=kind, target=str(entry[kind.value]), options=options,
                                    settings=own, exempt=tuple(entry.get("exempt", ()))))
    return subjects


def run_gate(subjects: list[GateSubject], progress: bool = True, root: str | Path | None = None) -> list[GateResult]:
    """Audit every subject (imports resolve from ``root``, default the current directory). Every
    subject is loaded and its device checked before any audit runs, so a mistake in the last one
    costs no audit time. Ctrl-C during an audit ends the gate there: that audit's result is marked
    interrupted and is the last one returned."""
    from exactcheck.core import resolve_device
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    loaded = {}
    for subject in subjects:
        try:
            resolve_device(subject.options.device)
            loaded[subject.name] = entry_point(subject.kind).load(subject.target)
        except UsageError as exc:
            raise UsageError(f"subject {subject.name!r}: {exc}") from None
    results = []
    for subject in subjects:
        if progress:
            print(f"exactcheck gate: auditing {subject.name} ({subject.kind.value} {subject.target}, "
                  f"level {subject.level})", file=sys.stderr, flush=True)
        audit = audit_subject(subject.kind, loaded[subject.name], options=subject.options,
                              subject_name=subject.target, progress=progress, **subject.settings)
        results.append(GateResult(subject, audit))
        if audit.interrupted:  # Ctrl-C: the subjects after this one are not audited
            break
    return results


def write(path: str | Path, text: str) -> Path:
    path = Path(path)
    if path.parent and not path.parent.exists():
        os.makedirs(path.parent, exist_ok=True)
    path.write_text(text)
    return path


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"
