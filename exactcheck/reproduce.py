"""The reproduce line: the one line in every verdict that re-runs its check with the same samples.

Every audit kind states its settings as ``Setting``s, each in both forms, the command line's
flag and the Python call's argument, and ``reproduce_line`` writes either the command (when the
subject can be named on the command line and every setting can be stated there) or the Python
call. Each kind builds its own line from these pieces, in its own room (``exactcheck.step.reproduce``,
``e2e.reproduce``, ``tree.reproduce``, ``serve.reproduce``, ``cost.reproduce``, ``recurrent.entry``):
only it knows which of its settings change what it draws or how it is judged. ``replay_line`` is
the line of a property counterexample, which re-runs the saved reproducer instead.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from exactcheck.options import DEFAULT_REQUIRE, AuditOptions, Category

__all__ = ["Setting", "reproduce_line", "stated", "flag", "when_set", "head_settings", "required_settings",
           "device_settings", "isolated_audit_line", "replay_line", "written_replay_line", "reproducer_path",
           "DEFAULT_REPORT_DIR"]


@dataclass(frozen=True)
class Setting:
    """One setting of an audit in both forms. ``flag``: as the command states it ("" when the
    command need not: its default; None when the command cannot state it at all, which makes the
    line the Python call); ``argument``: as the Python call states it (a positional value or
    ``keyword=value``; "" when the call need not)."""

    flag: str | None
    argument: str


def reproduce_line(command: str, subject: str, settings: Sequence[Setting], call: str | None = None,
                   by_command: bool = True) -> str:
    """``exactcheck COMMAND SUBJECT FLAG...`` if ``by_command`` and every setting can be stated
    on the command line (or there is no Python ``call``), else ``CALL(SUBJECT, ARGUMENT...)``."""
    if call is None or (by_command and all(s.flag is not None for s in settings)):
        return " ".join([f"exactcheck {command} {subject}"] + [s.flag for s in settings if s.flag])
    return f"{call}(" + ", ".join([subject] + [s.argument for s in settings if s.argument]) + ")"


def stated(options: AuditOptions, name: str, value=None, argument: str | None = None) -> Setting:
    """The option ``name`` (its value in ``options``, or ``value``) in both forms: the flag as its
    ``Option`` (declared on the ``AuditOptions`` field) writes it, and the Python keyword
    (``argument``: another spelling of it)."""
    value = getattr(options, name) if value is None else value
    shown = getattr(value, "value", value)
    return Setting(AuditOptions.option(name).flag_text(shown), argument or f"{name}={shown!r}")


def required_settings(options: AuditOptions) -> list[Setting]:
    """``--require`` with the finding categories ``options`` gates on beyond the default ones (none: nothing)."""
    named = [Category(c) for c in options.require if c not in DEFAULT_REQUIRE]  # the others always gate
    if not named:
        return []
    return [stated(options, "require", [c.flag for c in named], f"require={[c.value for c in named]!r}")]


def head_settings(options: AuditOptions, world: str) -> list[Setting]:
    """Level, seed, alpha and the one world: what every audit line of a world starts with."""
    return [stated(options, "level"), stated(options, "seed"), stated(options, "alpha"),
            stated(options, "worlds", [world], f"worlds=[{world!r}]")]


def flag(name: str, value) -> str:
    """``value`` of the shared option ``name`` as the command line states it (its ``Option``)."""
    return AuditOptions.option(name).flag_text(value)


def when_set(options: AuditOptions, *names: str) -> list[Setting]:
    """The options ``names`` that ``options`` sets away from their defaults, in that order."""
    fields = AuditOptions.__dataclass_fields__
    return [stated(options, name) for name in names if getattr(options, name) != fields[name].default]


def device_settings(device: str, always: bool = False) -> list[Setting]:
    """The device, where it is not the CPU (or ``always``)."""
    device = str(device)
    if device == "cpu" and not always:
        return []
    return [Setting(AuditOptions.option("device").flag_text(device) if device != "cpu" else "", f"device={device!r}")]


def isolated_audit_line(command: str, subject: str, options: AuditOptions) -> str:
    """The line of an isolated audit whose subject killed its worker process: the audit again,
    isolated (the subject is by name: an isolated audit loads it in the worker)."""
    return reproduce_line(command, subject, [stated(options, "level"), stated(options, "seed"),
                                             Setting("--isolate", "")])


def reproducer_path(check: str, subject: str = "", level: str | None = None, seed: int | None = None) -> str:
    """Where a report directory keeps the reproducer of ``check`` of ``subject`` (one file per
    subject and check, so subjects failing the same property in one gate keep theirs apart; with
    the audit's ``level`` and ``seed``, one per level and seed too, as the report files are)."""
    slug = "".join(ch if ch.isalnum() or ch in "._" else "-" for ch in subject).strip("-")
    settings = (f"-{level}" if level else "") + ("" if seed is None else f"-seed{int(seed)}")
    return "reproducers/" + (f"{slug}--" if slug else "") + check.replace("/", "-") + settings + ".json"


DEFAULT_REPORT_DIR = "exactcheck-reports"  # where a printed line asks a rerun to write its reproducer


def replay_line(check: str, subject: str, level: str, seed: int, audit_line: str) -> str:
    """The line of a property counterexample before its reproducer is written anywhere: the audit
    of that check again (``audit_line``), which finds the same counterexample, with a report
    directory where it is a command, so that the rerun writes the reproducer, then the replay of
    that file (a shell comment, so the line pastes as it is). ``written_replay_line`` replaces it
    when a report directory holds the file."""
    where = reproducer_path(check, subject, level, seed)
    if audit_line.startswith("exactcheck "):
        return (f"{audit_line} --report {DEFAULT_REPORT_DIR}  # writes its reproducer; then: "
                f"exactcheck replay {DEFAULT_REPORT_DIR}/{where}")
    return (f"{audit_line}  # the same counterexample; with a report directory (pytest --exactcheck-report DIR, "
            f"the gate's --report DIR) its reproducer is kept for: exactcheck replay DIR/{where}")


def written_replay_line(directory, check: str, subject: str, level: str | None, seed: int | None) -> str:
    """The line of a property counterexample whose reproducer ``directory`` holds."""
    import os
    return f"exactcheck replay {shlex.quote(os.path.join(str(directory), reproducer_path(check, subject, level, seed)))}"
