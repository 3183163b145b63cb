"""Subjects, for every front end: by name (``MODULE:CALLABLE``, the current directory importable,
a class instantiated with no arguments; the built-in generators; loop mutants,
``loop-mutant:NAME``), and one audit entry point per kind of subject (``SubjectKind``).

The CLI, the gate and the pytest plugin load subjects, plan their audits and run them through
here: a front end parses its arguments into settings, calls ``plan_subject`` / ``audit_subject``
with the subject's kind, and prints what ``exactcheck.report`` renders. It never branches on the
kind itself and keeps no list of option names: ``EntryPoint.split`` tells the options
(``AuditOptions`` fields) from the settings only one kind takes. The runners are imported when an
audit runs, so loading this module costs no torch import.
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Callable

from exactcheck.errors import UsageError
from exactcheck.options import AuditOptions, AuditPlan, SubjectKind

__all__ = ["load_subject", "load_generator", "builtin_generators", "BUILTIN_GENERATORS", "SubjectKind",
           "EntryPoint", "entry_point", "plan_subject", "audit_subject"]

BUILTIN_GENERATORS = ("reference-loop", "batched-reference-loop", "transformers-assisted",
                      "transformers-prompt-lookup", "transformers-ensemble-0.9")


def load_subject(path: str):
    """Import ``MODULE:CALLABLE`` (the current directory is importable). A class is
    instantiated with no arguments."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"subject ({path!r}) must look like MODULE:CALLABLE")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit at import time included: a usage error, not the end
        raise UsageError(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()
    if not callable(obj):
        raise UsageError(f"{path} is not callable")
    return obj


def load_generator(name: str):
    """A built-in generator by name, a loop mutant (``loop-mutant:NAME``) or MODULE:CALLABLE."""
    builtin = builtin_generators()
    if name in builtin:
        generator = builtin[name]
        if getattr(generator, "ensemble_weight", None) is not None:
            from exactcheck.adapters.transformers_compat import require_ensemble_weight
            try:
                require_ensemble_weight()
            except ImportError as e:
                raise UsageError(f"{name}: {e}") from None
        return generator
    if name.startswith("loop-mutant:"):
        from exactcheck.e2e.loop import LOOP_MUTANTS
        wanted = name.split(":", 1)[1]
        for m in LOOP_MUTANTS:
            if m.name == f"mutant: {wanted}":
                return m
        raise UsageError(f"unknown loop mutant {wanted!r}; known: "
                         f"{[m.name.split(': ')[1] for m in LOOP_MUTANTS]}")
    return load_subject(name)


def builtin_generators() -> dict:
    """Name -> generator, for ``BUILTIN_GENERATORS`` (imports transformers)."""
    from exactcheck.adapters.hf_generate import AssistedGeneration, PromptLookup
    from exactcheck.e2e.batched_loop import BatchedReferenceLoop
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    return {"reference-loop": ReferenceSpeculativeLoop(), "batched-reference-loop": BatchedReferenceLoop(),
            "transformers-assisted": AssistedGeneration(),
            "transformers-prompt-lookup": PromptLookup(),
            "transformers-ensemble-0.9": AssistedGeneration(ensemble_weight=0.9)}


def _plan_verifier(subject, options: AuditOptions, **_extra) -> AuditPlan:
    from exactcheck.step.plan import plan_step_audit
    from exactcheck.step.runner import judged_by
    return plan_step_audit(judged_by(options, subject))


def _run_verifier(subject, options: AuditOptions, **keywords):
    from exactcheck.step.runner import run_audit
    return run_audit(subject, options=options, **keywords)


def _plan_generator(subject, options: AuditOptions, policies=None, greedy: bool = True) -> AuditPlan:
    from exactcheck.e2e.generator import capabilities_of
    from exactcheck.e2e.plan import plan_generator_audit
    return plan_generator_audit(options, policies, greedy, capabilities_of(subject))


def _run_generator(subject, options: AuditOptions, **keywords):
    from exactcheck.e2e.runner import run_generator_audit
    return run_generator_audit(subject, options=options, **keywords)


_ALL_OPTIONS = tuple(AuditOptions.__dataclass_fields__)


@dataclass(frozen=True)
class EntryPoint:
    """How a kind of subject is loaded, planned and audited. ``options``: the ``AuditOptions``
    fields this kind's audit reads; ``settings``: what it takes besides (an end-to-end audit's
    decoding policies and greedy sweep)."""

    kind: SubjectKind
    load: Callable[[str], object]
    plan: Callable[..., AuditPlan]
    run: Callable[..., object]
    options: tuple[str, ...] = _ALL_OPTIONS
    settings: tuple[str, ...] = ()
    command: str = "audit"  # the ``exactcheck`` command of this kind
    result: str = "StepAuditResult"  # its result type in ``exactcheck.report.result``

    def split(self, settings: dict) -> tuple[AuditOptions, dict]:
        """``settings`` as validated options and this kind's own settings; a setting this kind
        does not take is a ``UsageError`` naming it."""
        given = {k for k, v in settings.items() if v is not None}
        stray = sorted(given - set(self.options) - set(self.settings))
        if stray:
            raise UsageError(f"a {self.kind.value} audit takes no {', '.join(stray)} (it takes "
                             f"{', '.join(self.options + self.settings)})")
        own = {k: v for k, v in settings.items() if k in self.settings}
        return AuditOptions.build(**{k: v for k, v in settings.items() if k not in self.settings}), own


ENTRY_POINTS = {
    SubjectKind.VERIFIER: EntryPoint(SubjectKind.VERIFIER, load_subject, _plan_verifier, _run_verifier,
                                     tuple(o for o in _ALL_OPTIONS if o != "generations")),
    SubjectKind.GENERATOR: EntryPoint(SubjectKind.GENERATOR, load_generator, _plan_generator, _run_generator,
                                      ("level", "seed", "alpha", "device", "worlds", "require", "generations",
                                       "shards", "call_timeout"), ("policies", "greedy"), "e2e",
                                      "GeneratorAuditResult"),
}


def entry_point(kind: SubjectKind) -> EntryPoint:
    return ENTRY_POINTS[SubjectKind(kind)]


def _options(entry: EntryPoint, options: AuditOptions | None, settings: dict) -> tuple[AuditOptions, dict]:
    if options is None:
        return entry.split(settings)
    stray = sorted(set(settings) - set(entry.settings))
    if stray:
        raise UsageError(f"give options or keyword settings, not both ({stray})")
    return options, settings


def plan_subject(kind: SubjectKind, subject, *, options: AuditOptions | None = None, **settings) -> AuditPlan:
    """The plan of auditing ``subject`` (a callable, or a name to load) with ``options`` or
    ``settings`` (``AuditOptions`` fields), and the kind's own settings."""
    entry = entry_point(kind)
    subject = entry.load(subject) if isinstance(subject, str) else subject
    options, own = _options(entry, options, settings)
    return entry.plan(subject, options, **own)


def audit_subject(kind: SubjectKind, subject, *, options: AuditOptions | None = None, subject_name: str | None = None,
                  progress: bool = True, executor=None, isolate: bool = False, **settings):
    """Audit ``subject`` (a callable, or a name to load: then it also names the subject in reproduce
    lines) with ``options`` or ``settings`` (``AuditOptions`` fields), and the kind's own
    settings; the result is the kind's ``AuditResult``.

    ``isolate=True`` runs the audit, loading the subject included, in a worker process
    (``exactcheck.isolation``): a subject that ends or hangs that process gets a failed audit
    saying so instead of taking the caller down. The subject must then be a name the worker can
    load (MODULE:CALLABLE or a built-in), and shards run in the worker."""
    entry = entry_point(kind)
    if isolate:
        return _audit_isolated(entry, subject, options, subject_name, progress, executor, settings)
    if isinstance(subject, str):
        subject_name = subject_name or subject
        subject = entry.load(subject)
    options, own = _options(entry, options, settings)
    return entry.run(subject, options, subject_name=subject_name, progress=progress, executor=executor, **own)


def _audit_isolated(entry: EntryPoint, subject, options, subject_name, progress, executor, settings):
    import datetime
    import functools
    import time
    from exactcheck.errors import SubjectKilled
    from exactcheck.isolation import killed_result, run_isolated
    from exactcheck.report import result as results
    if not isinstance(subject, str):
        raise UsageError("an isolated audit needs the subject by name (MODULE:CALLABLE or a built-in): "
                         "the worker process loads it")
    if executor is not None and type(executor).__name__ != "LocalExecutor":
        raise UsageError("an isolated audit runs its shards in its worker process (the local executor)")
    options, own = _options(entry, options, settings)
    name = subject_name or subject
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    audit = functools.partial(audit_subject, entry.kind, subject, options=options, subject_name=name,
                              progress=progress, **own)
    try:
        return run_isolated(audit, call_timeout=options.call_timeout)
    except SubjectKilled as error:
        reproduce = f"exactcheck {entry.command} {name} --level {options.level.value} --seed {options.seed} --isolate"
        return killed_result(getattr(results, entry.result), error, options, name, reproduce, started,
                             time.perf_counter() - clock)
