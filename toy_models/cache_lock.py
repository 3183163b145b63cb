"""One writer at a time for a directory of the model cache (``$EXACTCHECK_CACHE``).

The worlds write converted weights and tokenizers once per settings and mark them ``.complete``;
two processes asking for the same directory at once (the tests' two xdist workers, two audits side
by side) must not write it together, or one reads the files the other is rewriting. A writer takes
the lock (``fcntl.flock`` on ``NAME.lock`` beside the directory), looks again for ``.complete``
(another writer may have finished while it waited) and writes only if it is still missing. Where
``fcntl`` does not exist (Windows) the lock is a no-op, as before.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["cache_lock"]


@contextlib.contextmanager
def cache_lock(path: str | os.PathLike):
    """Hold the exclusive lock of the cache entry ``path`` for the ``with`` block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover (Windows)
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
