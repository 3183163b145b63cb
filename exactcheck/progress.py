"""Progress lines on stderr for runs that last more than a few seconds."""
from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Prints ``exactcheck: [i/n] label (t s)`` once the run has lasted ``after`` seconds."""

    def __init__(self, total: int, prefix: str = "exactcheck", stream: TextIO | None = None,
                 enabled: bool = True, after: float = 2.0):
        self.total, self.prefix, self.enabled, self.after = total, prefix, enabled, after
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.done = 0

    def step(self, label: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        if self.enabled and elapsed >= self.after:
            print(f"{self.prefix}: [{self.done}/{self.total}] {label} ({elapsed:.1f} s)",
                  file=self.stream, flush=True)
