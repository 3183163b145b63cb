"""Progress on stderr for long runs: what is done of what is planned, the rate and the time left.

On a terminal it is a tqdm bar redrawn in place; anywhere else (a CI log, a file, a pipe) it is a
plain line every ``LOG_EVERY`` seconds, so a redirected log gets a readable trail instead of
kilobytes of carriage returns. Silent for runs shorter than ``after`` seconds and when disabled
(``--quiet``)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm.auto import tqdm

__all__ = ["Progress", "LOG_EVERY"]

LOG_EVERY = 10.0  # seconds between two progress lines in a log


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream: treat it as a log
        return False


class Progress:
    """A bar of ``total`` units (trials, generations, checks); ``step(label, n)`` advances it by
    ``n`` and shows what is being worked on."""

    def __init__(self, total: int, unit: str = "check", desc: str = "exactcheck", enabled: bool = True,
                 stream: TextIO | None = None, after: float = 2.0, growing: bool = False,
                 every: float = LOG_EVERY):
        self.done = 0
        self.total = total
        self.unit, self.desc = unit, desc
        self.stream = stream if stream is not None else sys.stderr
        active = enabled and (total > 0 or growing)
        self.terminal = _is_terminal(self.stream)
        self.bar = tqdm(total=total, unit=unit, desc=desc, file=self.stream,
                        disable=not (active and self.terminal), delay=after, mininterval=0.5, leave=False,
                        unit_scale=unit != "check", dynamic_ncols=True)
        self._log = active and not self.terminal
        self._started = time.monotonic()
        self._next = self._started + max(after, every)
        self._every = every
        self._label = ""

    def step(self, label: str, n: int = 1) -> None:
        self.done += n
        self._label = label
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(n)
        if self._log and time.monotonic() >= self._next:
            self._next = time.monotonic() + self._every
            self._write_line()

    def grow(self, n: int) -> None:
        """``n`` more units planned (a run that plans as it goes: a serve audit, world by world)."""
        self.total += n
        self.bar.total = self.total

    def line(self) -> str:
        """What a log line says: done of planned, elapsed, the time left at the rate so far, and
        what is being worked on."""
        elapsed = time.monotonic() - self._started
        units = self.unit if self.unit.endswith("s") or self.done == 1 else self.unit + "s"
        text = f"{self.desc}: {self.done:,}"
        if self.total > 0:
            text += f" of {self.total:,} {units} ({min(100.0, 100.0 * self.done / self.total):.0f}%)"
        else:
            text += f" {units}"
        text += f", {_duration(elapsed)}"
        if 0 < self.done < self.total:
            text += f", about {_duration(elapsed * (self.total - self.done) / self.done)} left"
        return text + (f" [{self._label}]" if self._label else "")

    def _write_line(self) -> None:
        try:
            print(self.line(), file=self.stream, flush=True)
        except (OSError, ValueError):  # a closed log: progress is not worth failing the audit for
            self._log = False

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
