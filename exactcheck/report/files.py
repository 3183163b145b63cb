"""Writing reports to disk: JSON, Markdown and HTML (rendered through ``exactcheck.report.formats``),
plus each verdict's reproducer. Kept apart from the renderers so that they do not import each
other."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Mapping

from exactcheck.errors import UsageError

from exactcheck.report.formats import renderer
from exactcheck.report.json_md import AUDIT_SCHEMA, SELFTEST_SCHEMA
from exactcheck.reproduce import reproducer_path, written_replay_line

__all__ = ["write_report", "report_stem", "check_writable", "atomic_write", "ReportWriteError"]


class ReportWriteError(UsageError):
    """A report could not be written (a full disk, a directory that vanished): what was and what
    was not written, in one line."""


def report_stem(prefix: str, name: str = "", level: str | None = None, seed: int | None = None,
                settings: Mapping[str, object] | None = None) -> str:
    """A file stem from a report's kind, its subject's name and the settings that change what it
    draws or how it is judged: ``report_stem("e2e-", "mod:gen", "quick", 0)`` is
    ``e2e-mod-gen-quick-seed0``. Letters, digits and underscores are kept, every other character
    becomes a dash (filesystem-safe). Two runs never share a stem: when the name is not already in
    that form (``a/b`` and ``a b`` would both read ``a-b``) or ``settings`` names any setting
    (``--world``, ``--alpha``, ``--rule``, ``--trials`` ...: only those that differ from their
    defaults), a short hash of all of them follows (``-h`` and 8 hex digits), and a stem without
    one always ends in its seed or level, so the two forms cannot meet. ``level`` and ``seed`` are
    left out where a command has none."""
    stem = (prefix + _slug(name)).strip("-")
    if level:
        stem += f"-{_slug(str(level))}"
    if seed is not None:
        stem += f"-seed{int(seed)}"
    extra = {k: v for k, v in sorted((settings or {}).items()) if v not in (None, (), [], False)}
    if extra or _slug(name) != name:
        identity = json.dumps([prefix, name, level, seed, {k: repr(v) for k, v in extra.items()}])
        stem += "-h" + hashlib.sha256(identity.encode()).hexdigest()[:8]
    return stem


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "-" for c in text).strip("-")


def check_writable(directory: str | Path, what: str = "--report") -> Path:
    """``directory`` made if needed and shown writable (a file written and removed there), before
    an audit spends its time; otherwise one-line ``UsageError`` saying why."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{what} {directory}: it is a file, not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for sub in (directory / "reproducers",):
            if sub.exists() and not sub.is_dir():
                raise UsageError(f"{what} {directory}: {sub} is a file, where reproducers go")
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".exactcheck-write-test-"):
            pass
    except OSError as exc:
        raise UsageError(f"{what} {directory}: cannot write there ({exc.strerror or exc})") from None
    return directory


def atomic_write(path: str | Path, text: str) -> Path:
    """``text`` at ``path`` all at once: written to a temporary name beside it, flushed to disk,
    then renamed over it, so a reader sees the old file or the new one, never a part; a failed
    write (a full disk) leaves the old file and no temporary behind. The file gets the mode a new
    file from ``open()`` gets, 0o666 less the umask (0o644 under the usual 022), not the
    temporary's 0o600."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(handle, "w", encoding="utf-8", errors="backslashreplace") as f:  # a lone surrogate too
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def _umask() -> int:
    """The process's umask: Linux states it in /proc; elsewhere it is read by setting it and
    setting it back."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as f:
            return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_report(data: dict, directory: str | Path, stem: str) -> tuple[Path, ...]:
    """Write ``STEM.json``, ``STEM.md`` and the self-contained ``STEM.html`` under ``directory``,
    and each reproducer under ``directory/reproducers/`` (named by subject, check, level and
    seed); the reproduce line of each is rewritten (in place) to replay that file. Return the paths."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportWriteError(f"cannot write the report under {directory}: {exc.strerror or exc}") from None
    audits = {AUDIT_SCHEMA: lambda: [data], SELFTEST_SCHEMA: lambda: [data["reference"]]}.get(data["schema"], list)()
    for audit in audits:
        for verdict in audit["verdicts"]:
            if verdict.get("reproducer"):
                subject = verdict["reproducer"].get("subject", "")
                level, seed = audit.get("level"), audit.get("seed")
                path = directory / reproducer_path(verdict["check"], subject, level, seed)
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write(path, json.dumps(verdict["reproducer"], indent=1) + "\n")
                except OSError as exc:
                    raise ReportWriteError(f"cannot write the reproducer {path}: {exc.strerror or exc}") from None
                if verdict.get("reproduce"):  # the replay of the file just written
                    verdict["reproduce"] = written_replay_line(directory, verdict["check"], subject, level, seed)
    json_path, md_path, html_path = (directory / f"{stem}.{suffix}" for suffix in ("json", "md", "html"))
    texts = (json.dumps(data, indent=1) + "\n", renderer(data["schema"], "markdown")(data),
             renderer(data["schema"], "html")(data))  # rendered first: a renderer's error writes nothing
    written = []
    try:
        for path, text in zip((json_path, md_path, html_path), texts):
            written.append(atomic_write(path, text))
    except OSError as exc:
        done = f" (written: {', '.join(map(str, written))})" if written else ""
        raise ReportWriteError(f"cannot write the report {directory / stem}.*: {exc.strerror or exc}{done}") from None
    return json_path, md_path, html_path
