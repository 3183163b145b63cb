"""The ``recurrent`` row's parts: arguments, settings, subjects by name, plan, run, its reproduce
line and its part of ``exactcheck list``. Imports no torch (the runner is imported when it runs)."""
from __future__ import annotations

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import BUILTIN_GENERATORS, DEFAULT_ALPHA, AuditOptions, AuditPlan

__all__ = ["OPTIONS", "BUILTIN", "MUTANT_PREFIX", "recurrent_arguments", "recurrent_settings", "load", "plan", "run",
           "reproduce_line", "catalogue"]

OPTIONS = ("level", "seed", "alpha", "device", "worlds", "generations", "require", "jobs", "call_timeout")
BUILTIN = ("recurrent-snapshot", "recurrent-recompute", "recurrent-state-table")
MUTANT_PREFIX = "recurrent-mutant:"


def recurrent_arguments(parser) -> None:
    parser.add_argument("subject", help=f"{', '.join(BUILTIN)} (the exact reference loops), {MUTANT_PREFIX}NAME, a "
                                        f"built-in generator ({', '.join(BUILTIN_GENERATORS[4:6])}, ...) or MODULE:CALLABLE")
    arguments.options(parser, "level", "generations", "worlds")
    parser.add_argument("--no-greedy", dest="greedy", action="store_false", help="skip the greedy-identity sweep")
    arguments.options(parser, "seed", "alpha", "device")
    arguments.output(parser)
    arguments.jobs(parser)
    arguments.require(parser)
    arguments.call_timeout(parser)
    arguments.isolate(parser)


def recurrent_settings(args) -> dict:
    return dict(arguments.given(args), greedy=args.greedy, progress=not args.quiet, isolate=args.isolate)


def builtin_generators() -> dict:
    """Name -> the reference loops and their mutants."""
    from exactcheck.recurrent.loops import RECURRENT_MUTANTS, REFERENCE_LOOPS
    out = {f"recurrent-{name}": loop for name, loop in REFERENCE_LOOPS.items()}
    out.update({MUTANT_PREFIX + name: m for name, m in RECURRENT_MUTANTS.items()})
    return out


def load(name: str):
    """A reference loop or mutant by name (``recurrent-...``), or MODULE:CALLABLE (the registry
    offers the end-to-end audit's built-in generators too: ``exactcheck.audit_kinds``)."""
    if name.startswith("recurrent-"):
        builtin = builtin_generators()
        if name not in builtin:
            raise UsageError(f"unknown recurrent generator {name!r}; built in: {', '.join(builtin)}")
        return builtin[name]
    from exactcheck.loading import load_subject
    return load_subject(name)


def plan(subject, options: AuditOptions, greedy: bool = True) -> AuditPlan:
    from exactcheck.recurrent.plan import plan_recurrent_audit
    return plan_recurrent_audit(options, greedy)


def run(subject, options: AuditOptions, *, subject_name: str | None = None, progress: bool = True, executor=None,
        greedy: bool = True):
    from exactcheck.recurrent.runner import run_recurrent_audit
    if executor is not None:
        raise UsageError("a recurrent audit runs its generations here or in --jobs worker processes, not on an executor")
    named = subject_name is not None and (subject_name.startswith("recurrent-") or ":" in subject_name
                                          or subject_name in BUILTIN_GENERATORS)
    return run_recurrent_audit(subject, subject_name=subject_name, options=options, greedy=greedy, progress=progress,
                               reproduce=(lambda world: reproduce_line(options, subject_name, world, greedy))
                               if named else None)


def reproduce_line(options: AuditOptions, subject: str, world: str, greedy: bool = True) -> str:
    """The command that audits ``subject`` on ``world`` again, as this audit did (each option as
    its ``Option`` states it)."""
    from exactcheck.reproduce import Setting, reproduce_line as line, stated
    settings = [stated(options, "worlds", [world]), stated(options, "level"), stated(options, "seed")]
    settings += [stated(options, name) for name, default in (("generations", None), ("alpha", DEFAULT_ALPHA))
                 if getattr(options, name) != default]
    if not greedy:
        settings.append(Setting("--no-greedy", "greedy=False"))
    return line("recurrent", subject, settings)


def catalogue() -> list[str]:
    """This kind's part of ``exactcheck list``: its worlds, reference loops and mutants."""
    from exactcheck.recurrent.loops import RECURRENT_MUTANTS, REFERENCE_LOOPS
    from toy_models.recurrent_lm import recurrent_worlds
    lines = ["recurrent worlds (`exactcheck recurrent NAME`; hybrid toy LMs whose linear-attention layers keep a "
             "conv window and a recurrent state):"]
    lines += [f"  {w.name:<26} {w.world.description}" for w in recurrent_worlds()]
    lines.append("  real tiny hybrids (greedy identity and the final cache state by state): `exactcheck greedy "
                 "GENERATOR --model tiny-qwen3-next` (and the other hybrids listed under real models)")
    lines.append("recurrent generators (exact reference loops, and mutants from the field):")
    lines += [f"  recurrent-{name:<16} {loop.name}" for name, loop in REFERENCE_LOOPS.items()]
    for name, m in RECURRENT_MUTANTS.items():
        doc = " ".join(type(m).__doc__.split())
        lines.append(f"  {MUTANT_PREFIX + name:<26} {doc[:110] + ('...' if len(doc) > 110 else '')}")
    return lines
