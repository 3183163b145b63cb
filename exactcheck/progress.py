"""Progress on stderr for long runs, through tqdm: what is done of what is planned, the rate and
the time left. Silent for runs shorter than two seconds and when disabled (``--quiet``)."""
from __future__ import annotations

import sys
from typing import TextIO

from tqdm.auto import tqdm

__all__ = ["Progress"]


class Progress:
    """A bar of ``total`` units (trials, generations, checks); ``step(label, n)`` advances it by
    ``n`` and shows what is being worked on."""

    def __init__(self, total: int, unit: str = "check", desc: str = "exactcheck", enabled: bool = True,
                 stream: TextIO | None = None, after: float = 2.0, growing: bool = False):
        self.done = 0
        self.total = total
        self.bar = tqdm(total=total, unit=unit, desc=desc, file=stream if stream is not None else sys.stderr,
                        disable=not enabled or (total <= 0 and not growing), delay=after, mininterval=0.5, leave=False,
                        unit_scale=unit != "check", dynamic_ncols=True)

    def step(self, label: str, n: int = 1) -> None:
        self.done += n
        self.bar.set_postfix_str(label, refresh=False)
        self.bar.update(n)

    def grow(self, n: int) -> None:
        """``n`` more units planned (a run that plans as it goes: a serve audit, world by world)."""
        self.total += n
        self.bar.total = self.total

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
