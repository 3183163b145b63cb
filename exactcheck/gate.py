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
    worlds = ["three_token", "ctx_v8_l3_k2", "properties"]  # optional
    exempt = ["properties/seeded_rows"]      # optional: failures reported, not gating

    [[tool.exactcheck.subject]]
    name = "generate"
    generator = "transformers-assisted"      # an end-to-end generator (built-in name or MODULE:CALLABLE)

    [[tool.exactcheck.subject]]
    tree = "my_pkg.eagle:verify_tree"        # a tree verifier (a built-in name or MODULE:CALLABLE)

A subject's key is its audit kind: every row of ``exactcheck.audit_kinds.AUDIT_KINDS`` that says
``gate=True`` (``gate_kinds()``), audited through that row.

``exactcheck gate`` exits 1 when any subject has a failed check that is not exempt, and writes
JUnit XML (one testsuite per subject, one testcase per check) and JSON for CI systems.
"""
from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA, DEFAULT_LEVEL, AuditOptions
from exactcheck.report.result import AuditResult, GateResult, GateSubject
from exactcheck.audit_kinds import audit_subject, entry_point, gate_kinds, plan_subject

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["GateSubject", "GateResult", "read_config", "check_exempt", "run_gate"]

# keys of a [[tool.exactcheck.subject]] entry that are not audit settings (besides its kind's key)
_OWN_KEYS = ("name", "exempt")
# settings [tool.exactcheck] may give every subject
_SHARED = ("level", "seed", "alpha", "device", "require")


def _whole(value) -> bool:
    """An integer as TOML writes one: ``true`` is not 1, ``2.0`` is not 2 (``--seed 2.0`` is refused)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _name(value) -> bool:
    return isinstance(value, str) and bool(value.strip())






_POLICY_RULE = ("a list of decoding policies, each 'temperature=0.7,top_k=2' (as --policy takes it) or a table "
                "{temperature = 0.7, top_k = 2}")


def _policies(value) -> tuple:
    """``policies`` as ``DecodingPolicy`` objects, each read by ``DecodingPolicy.parse`` as ``--policy``
    reads it (a table is the same settings as keys); a ``ValueError`` says why not."""
    from exactcheck.contracts.policy import DecodingPolicy  # torch: only when a subject names policies
    out = []
    for item in value:
        spec = item if isinstance(item, str) else ",".join(f"{key}={setting}" for key, setting in item.items())
        if not spec.strip(", "):
            raise ValueError(f"{item!r} sets nothing")
        out.append(DecodingPolicy.parse(spec))
    return tuple(out)


# every setting a subject (or [tool.exactcheck], for the shared ones) may give: whether a value is
# of its type and range, and the rule it breaks when not. A key no entry point takes is left to
# ``EntryPoint.split``, which names it and lists what the subject's kind takes
SUBJECT_FIELDS = {
    # the options several kinds share: as their ``Option`` (declared on the ``AuditOptions`` field) checks them
    **{name: (spec.valid, spec.rule) for name, spec in AuditOptions.shared().items()},
    "properties": (lambda v: isinstance(v, bool), "true or false"),
    "properties_first": (lambda v: isinstance(v, bool), "true or false"),
    "looks_from_one": (lambda v: isinstance(v, bool), "true or false"),
    "max_seconds": (lambda v: _number(v) and v > 0, "a positive number of seconds"),
    "trials": (lambda v: (isinstance(v, dict) and all(_whole(n) and n >= 1 for n in v.values()))
               or _strings(v), "a table {WORLD = N} or a list of 'WORLD=N', N a positive integer"),
    "rule": (_name, "a rule, a string (NAME or NAME:param=value,...; see `exactcheck rules`)"),
    "acceptance_rule": (_name, "a rule, a string (NAME or NAME:param=value,...; see `exactcheck rules`)"),
    "greedy": (lambda v: isinstance(v, bool), "true or false"),
    "policies": (lambda v: isinstance(v, list) and all(isinstance(p, (str, dict)) for p in v), _POLICY_RULE),
}
# settings turned into what the audit takes once their type is checked
_CONVERT = {"policies": _policies}


def _invalid(key: str, value, rule: str) -> str:
    return f"{key} ({value!r}) must be {rule}"


def _validated(settings: dict, where: str, takes=None, own_fields=None) -> dict:
    """``settings`` with every known field's type and range checked (``takes``: only the keys the
    subject's entry point takes; the others are ``EntryPoint.split``'s to refuse; ``own_fields``:
    the checks of settings only the subject's kind takes, ``EntryPoint.fields``), converted where
    the audit takes another form; a bad value is a one-line ``UsageError`` saying ``where``."""
    fields = {**SUBJECT_FIELDS, **(own_fields or {})}
    out = dict(settings)
    for key, value in settings.items():
        if key not in fields or (takes is not None and key not in takes):
            continue
        valid, rule = fields[key]
        if not valid(value):
            raise UsageError(f"{where}: {_invalid(key, value, rule)}")
        if key in _CONVERT:
            try:
                out[key] = _CONVERT[key](value)
            except ValueError as exc:
                raise UsageError(f"{where}: {key} ({value!r}): {exc}") from None
    return out


def check_exempt(subject: GateSubject, plan) -> None:
    """Refuse an ``exempt`` entry that names no check and no world of ``plan`` (the subject's
    ``AuditPlan``, from ``exactcheck.audit_kinds.plan_subject``): a misspelt exemption would
    otherwise exempt nothing, silently. A world's contract verdict (``WORLD/contract``, standing
    for its checks when the subject breaks its contract there) may be named too."""
    if not subject.exempt:
        return
    import difflib
    worlds = list(dict.fromkeys(check.world for check in plan.checks))
    names = [check.name for check in plan.checks] + worlds + [f"{world}/contract" for world in worlds]
    known = set(names)
    unknown = [entry for entry in subject.exempt if entry not in known]
    if not unknown:
        return
    close = list(dict.fromkeys(match for entry in unknown for match in difflib.get_close_matches(entry, names, n=1)))
    hint = (f"did you mean {', '.join(map(repr, close))}? " if close else "") + "valid names include " + \
        ", ".join(map(repr, list(dict.fromkeys(worlds[:3] + [c.name for c in plan.checks[:3]]))))
    raise UsageError(f"exempt ({list(unknown)!r}) names no check or world of the subject's plan "
                     f"({len(plan.checks)} checks in {len(worlds)} world{'s' * (len(worlds) != 1)}): {hint}")


def read_config(path: str | Path = "pyproject.toml", level: str | None = None,
                device: str | None = None) -> list[GateSubject]:
    """The subjects of ``[tool.exactcheck]`` in ``path`` (``level`` and ``device`` override every
    subject's), every field's type and range checked and each subject's settings validated by its
    kind's entry point: a mistake is one ``UsageError`` line naming the file, the subject, the field,
    the value and its rule, before any audit runs. No subject is loaded here (that imports user
    code: ``run_gate`` does it, and checks each subject's exemptions against its plan with
    ``check_exempt``)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    tool = data.get("tool", {})
    section = tool.get("exactcheck") if isinstance(tool, dict) else None
    if not section:
        raise UsageError(f"{path} has no [tool.exactcheck] section")
    if not isinstance(section, dict):
        raise UsageError(f"{path}: tool.exactcheck ({section!r}) must be a table, [tool.exactcheck]")
    stray = sorted(set(section) - {*_SHARED, "subject"})
    if stray:
        raise UsageError(f"{path}: [tool.exactcheck] takes no {', '.join(stray)} (it takes {', '.join(_SHARED)} "
                         f"for every subject, and [[tool.exactcheck.subject]] tables; the other settings "
                         f"go in a subject's table)")
    entries = section.get("subject") or []
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise UsageError(f"{path}: tool.exactcheck.subject ({entries!r}) must be [[tool.exactcheck.subject]] tables")
    if not entries:
        raise UsageError(f"{path}: [tool.exactcheck] lists no [[tool.exactcheck.subject]]")
    shared = _validated({k: v for k, v in section.items() if k in _SHARED}, f"{path}: [tool.exactcheck]")
    defaults = {"level": DEFAULT_LEVEL, "seed": 0, "alpha": DEFAULT_ALPHA, "device": "cpu", **shared}
    overrides = {k: v for k, v in (("level", level), ("device", device)) if v is not None}
    subjects, names = [], set()
    known = gate_kinds()
    for i, entry in enumerate(entries):
        kinds = [kind for kind in known if kind.value in entry]
        if len(kinds) != 1:
            raise UsageError(f"{path}: subject {i + 1} needs exactly one of "
                             + " or ".join(repr(kind.value) for kind in known))
        kind = kinds[0]
        target = entry[kind.value]
        if not _name(target):
            raise UsageError(f"{path}: subject {i + 1}: {_invalid(kind.value, target, 'a non-empty string')}")
        if "name" in entry and not _name(entry["name"]):
            raise UsageError(f"{path}: subject {i + 1}: {_invalid('name', entry['name'], 'a non-empty string')}")
        name = entry.get("name", target)
        where = f"{path}: subject {name!r}"
        if name in names:
            raise UsageError(f"{path}: two subjects are named {name!r}")
        names.add(name)
        exempt = entry.get("exempt", [])
        if not _strings(exempt):
            raise UsageError(f"{where}: {_invalid('exempt', exempt, 'a list of check or world names (strings)')}")
        entrypoint = entry_point(kind)
        takes = set(entrypoint.options) | set(entrypoint.settings)
        # the defaults and the command line's overrides go to every subject whose kind takes them
        given = {k: v for k, v in entry.items() if k not in (*_OWN_KEYS, *known)}
        own = _validated({**given, **{k: v for k, v in overrides.items() if k in takes}}, where, takes,
                         entrypoint.fields)
        settings = {**{k: v for k, v in defaults.items() if k in takes}, **own}
        try:
            options, own = entrypoint.split(settings)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from None
        subjects.append(GateSubject(name=name, kind=kind, target=target, options=options,
                                    settings=own, exempt=tuple(exempt)))
    return subjects


def run_gate(subjects: list[GateSubject], progress: bool = True, root: str | Path | None = None,
             isolate: bool = False) -> list[GateResult]:
    """Audit every subject (imports resolve from ``root``, default the current directory). Every
    subject is loaded, its device checked and its exemptions matched to its plan before any audit
    runs, so a mistake in the last one costs no audit time. ``isolate``: that check and each audit
    run in worker processes (``exactcheck.isolation``), so a subject that ends or hangs its process
    fails its own audit and the gate goes on to the next. Ctrl-C (or SIGTERM) during an audit ends
    the gate there: that audit's result is marked interrupted and is the last one returned."""
    if root is not None and str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if isolate:
        from exactcheck.errors import SubjectKilled
        from exactcheck.isolation import run_isolated
        try:
            run_isolated(functools.partial(preflight, subjects, keep=False),
                         call_timeout=max((s.options.call_timeout or 0) for s in subjects) or None)
        except SubjectKilled as exc:  # its own audit's worker will say so, as a finding
            if progress:
                print(f"exactcheck gate: {exc}; each subject is loaded in its own worker instead", file=sys.stderr)
        loaded = {s.name: s.target for s in subjects}  # by name: each audit's worker loads its own
    else:
        loaded = preflight(subjects)
    results = []
    for subject in subjects:
        if progress:
            print(f"exactcheck gate: auditing {subject.name} ({subject.kind.value} {subject.target}, "
                  f"level {subject.level})", file=sys.stderr, flush=True)
        try:
            audit = audit_subject(subject.kind, loaded[subject.name], options=subject.options,
                                  subject_name=subject.target, progress=progress, isolate=isolate,
                                  **subject.settings)
        except KeyboardInterrupt:  # between an audit's phases: nothing of it is kept but the mark
            audit = _interrupted(subject)
        results.append(GateResult(subject, audit))
        if audit.interrupted:  # Ctrl-C: the subjects after this one are not audited
            break
    return results


def preflight(subjects: list[GateSubject], keep: bool = True) -> dict | None:
    """Load each subject, check its device and match its exemptions to its plan (``UsageError``
    naming the subject); the loaded subjects by name (``keep``), else None."""
    from exactcheck.core import resolve_device
    from exactcheck.subject_call import WATCH
    loaded = {}
    for subject in subjects:
        WATCH.enter(lambda: f"loading gate subject {subject.name!r} ({subject.target})")
        try:
            resolve_device(subject.options.device)
            loaded[subject.name] = entry_point(subject.kind).load(subject.target)
            check_exempt(subject, plan_subject(subject.kind, loaded[subject.name], options=subject.options,
                                               **subject.settings))
        except UsageError as exc:
            raise UsageError(f"subject {subject.name!r}: {exc}") from None
        finally:
            WATCH.leave()
    return loaded if keep else None


def _interrupted(subject: GateSubject) -> AuditResult:
    import datetime
    return entry_point(subject.kind).result_type()(
        subject=subject.target, level=subject.level, seed=subject.options.seed, alpha=subject.options.alpha,
        device=subject.options.device, verdicts=(), duration_s=0.0, environment={}, interrupted=True,
        started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def write(path: str | Path, text: str) -> Path:
    """``text`` at ``path``, written whole or not at all (``exactcheck.report.files.atomic_write``)."""
    from exactcheck.report.files import atomic_write
    path = Path(path)
    if path.parent and not path.parent.exists():
        os.makedirs(path.parent, exist_ok=True)
    return atomic_write(path, text)


def dumps(data: dict) -> str:
    return json.dumps(data, indent=2) + "\n"
