"""A subject by ``MODULE:CALLABLE`` (the current directory importable, a class instantiated with no
arguments): a leaf every kind's own loader falls back on after its built-in names (the step
verifiers, ``exactcheck.step.subjects``; the generators, ``exactcheck.e2e.subjects``; the tree
verifiers; the recurrent loops), so no kind loads another kind's subjects."""
from __future__ import annotations

import importlib
import os
import sys

from exactcheck.errors import UsageError

__all__ = ["load_subject"]


def load_subject(path: str):
    """Import ``MODULE:CALLABLE`` (the current directory is importable). A class is
    instantiated with no arguments."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise UsageError(f"unknown subject {path!r}: not a built-in name (see `exactcheck list`) nor "
                         f"MODULE:CALLABLE")
    if not module_name or not attr:
        raise UsageError(f"subject ({path!r}) must look like MODULE:CALLABLE (or a built-in name: see `exactcheck list`)")
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
