"""Calling the subject: foreign code that must not take the auditor down with it.

``call_subject(fn, *args)`` is the one way every audit calls a subject (a verifier, a tree
verifier, a generator):

- any exception the subject raises, ``BaseException`` subclasses included (``SystemExit`` from a
  ``sys.exit()`` inside it, ``GeneratorExit``, custom ones), becomes ``SubjectCrashed``: a verdict,
  never the end of the audit. Only ``KeyboardInterrupt`` (the user's Ctrl-C, or SIGTERM, which
  the command turns into one) passes through.
- each call is bounded by the call time limit (``call_time_limit``; default
  ``DEFAULT_CALL_TIMEOUT`` seconds, ``--call-timeout`` on the command line): past it the call is
  interrupted with SIGALRM (re-sent every second, so a subject that swallows it is interrupted
  again) and ``SubjectTimedOut`` names the frame it was in. A call that swallowed every alarm and
  returned late is a timeout too. The alarm works in the main thread of a POSIX process and in
  Python code; a hang inside native code that never returns to the interpreter, ``os._exit`` and a
  segfault are out of any in-process guard's reach: ``exactcheck.isolation`` runs the audit in a
  worker process for those, and reads the watch this module keeps (``WATCH``) to tell a hung call
  from a slow audit.

``SnapshotInputs`` checks a subject handed tensors it must only read: the subject gets copies, and
an input it wrote into is a ``ContractViolation`` (``Violation.MUTATED_INPUT``) naming it, so the
driver's own tensors, from which expected laws and later calls are built, are never touched.
"""
from __future__ import annotations

import contextlib
import contextvars
import signal
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

from exactcheck.errors import ContractViolation, SubjectCrashed, SubjectError, SubjectTimedOut, Violation
from exactcheck.options import DEFAULT_CALL_TIMEOUT

__all__ = ["call_subject", "call_time_limit", "CallLimits", "CallShape", "current_call_timeout", "SnapshotInputs", "WATCH", "CallWatch"]

_REALARM_S = 1.0  # after the limit, the alarm is sent again this often until the call ends


@dataclass
class CallLimits:
    """One audit's limit on a subject call, and the hang that tripped it: once a call of the
    audit has hung, every later call fails at once with the same finding (a subject that hung is
    not called again for the full limit on each of the audit's hundreds of calls)."""

    seconds: float | None
    hung: SubjectTimedOut | None = None


_LIMITS: contextvars.ContextVar[CallLimits | None] = contextvars.ContextVar("exactcheck_call_limits", default=None)


@contextlib.contextmanager
def call_time_limit(seconds: float | None):
    """Within this block (one audit) every subject call is bounded by ``seconds`` (None or 0:
    unbounded); outside any block, by ``DEFAULT_CALL_TIMEOUT``."""
    token = _LIMITS.set(CallLimits(seconds or None))
    try:
        yield
    finally:
        _LIMITS.reset(token)


def current_call_timeout() -> float | None:
    limits = _LIMITS.get()
    return DEFAULT_CALL_TIMEOUT if limits is None else limits.seconds


class CallWatch:
    """Where a worker process publishes the subject call in progress: ``exactcheck.isolation``
    attaches a shared buffer (a double, time.time() when the current call began or 0, then the
    call's description); in a plain process it is a no-op."""

    LAYOUT = struct.Struct("d")
    SIZE = 256

    def __init__(self):
        self.buffer = None

    def attach(self, buffer) -> None:
        self.buffer = buffer

    def enter(self, label: Callable[[], str]) -> None:
        if self.buffer is not None:
            text = label().encode("utf-8", "replace")[:self.SIZE - self.LAYOUT.size - 1]
            self.buffer[self.LAYOUT.size:self.LAYOUT.size + len(text) + 1] = text + b"\0"
            self.LAYOUT.pack_into(self.buffer, 0, time.time())

    def leave(self) -> None:
        if self.buffer is not None:
            self.LAYOUT.pack_into(self.buffer, 0, 0.0)

    @classmethod
    def read(cls, buffer) -> tuple[float, str]:
        """(when the call in progress began or 0, what it is) from a buffer a worker writes."""
        started = cls.LAYOUT.unpack_from(buffer, 0)[0]
        label = bytes(buffer[cls.LAYOUT.size:cls.SIZE]).split(b"\0", 1)[0].decode("utf-8", "replace")
        return started, label


WATCH = CallWatch()


class _Overran(BaseException):
    """Raised in the subject's frame by the alarm: its call ran past the time limit."""


class _Alarm:
    """SIGALRM armed for one call (main thread only; nested calls run under the outer alarm)."""

    active = False

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.armed = bool(seconds) and hasattr(signal, "setitimer") and not _Alarm.active \
            and threading.current_thread() is threading.main_thread()
        self.in_call = False

    def _fire(self, signum, frame):
        if self.in_call:
            raise _Overran()

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            self.outer = signal.setitimer(signal.ITIMER_REAL, self.seconds, _REALARM_S)
            self.begun = time.monotonic()
            _Alarm.active = True
        self.in_call = True
        return self

    def __exit__(self, *exc):
        self.in_call = False  # from here on the handler raises nothing
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
            _Alarm.active = False
            delay, interval = self.outer
            if delay:  # an outer timer (e.g. the test runner's) keeps what was left of it
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, delay - (time.monotonic() - self.begun)), interval)
        return False


def _describe(fn, args) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    parts = []
    for a in args:
        shape = getattr(a, "shape", None)
        parts.append(f"{type(a).__name__}{list(shape)}" if shape is not None else type(a).__name__)
    return f"{name}({', '.join(parts)})"


def call_subject(fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with its failures as ``SubjectError`` (see the module docstring)."""
    limits = _LIMITS.get()
    if limits is not None and limits.hung is not None:
        raise SubjectTimedOut(limits.seconds, again=True)
    limit = current_call_timeout()
    begun = time.monotonic()
    WATCH.enter(lambda: _describe(fn, args))
    try:
        with _Alarm(limit):
            result = fn(*args, **kwargs)
    except KeyboardInterrupt:
        raise
    except _Overran as exc:
        raise _tripped(limits, SubjectTimedOut(limit, exc)) from None
    except SubjectError:  # a nested call_subject already classified it
        raise
    except BaseException as exc:  # foreign code: whatever it raises is a finding, SystemExit included
        raise SubjectCrashed(exc) from exc
    finally:
        WATCH.leave()
    if limit and time.monotonic() - begun > limit:  # it swallowed every alarm and came back late
        raise _tripped(limits, SubjectTimedOut(limit, None, elapsed=time.monotonic() - begun))
    return result


def _tripped(limits: CallLimits | None, error: SubjectTimedOut) -> SubjectTimedOut:
    if limits is not None:
        limits.hung = error
    return error


class SnapshotInputs:
    """The tensors a subject is handed, as copies; ``check()`` after the call raises
    ``ContractViolation(MUTATED_INPUT)`` naming the first input the subject wrote into.

        guard = SnapshotInputs(("target_probs", p), ("draft_probs", q), ("draft_tokens", tokens))
        out = call_subject(verifier, *guard.copies, generator)
        guard.check()
    """

    def __init__(self, *named: tuple[str, object]):
        self.names = tuple(n for n, _ in named)
        self.originals = tuple(t for _, t in named)
        self.copies = tuple(_copy(t) for t in self.originals)

    def check(self) -> None:
        for name, original, copy in zip(self.names, self.originals, self.copies):
            if not _same(original, copy):
                raise ContractViolation(Violation.MUTATED_INPUT, f"the subject wrote into {name} (it must only read "
                                                                 f"its inputs; copy them first for scratch space)")


def _copy(t):
    return t.clone() if hasattr(t, "clone") else t


def _same(a, b) -> bool:
    if not hasattr(a, "clone"):
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return _bits(a).equal(_bits(b))  # bit for bit: a NaN the subject left alone is unchanged


def _bits(t):
    import torch
    if not (t.is_floating_point() or t.is_complex()):
        return t
    return t.contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()])


@dataclass(frozen=True)
class CallShape:
    """How an audit kind calls its subject, checked before anything is drawn: ``what`` it is (a
    verifier, a generator), the call in words (``call``) and the number of positional arguments
    every call passes (``positional``)."""

    what: str
    call: str
    positional: int

    def check(self, subject, name: str | None = None) -> None:
        """A ``UsageError`` naming the expected call when ``subject`` is not callable or cannot take
        ``positional`` arguments (a subject whose signature Python cannot read is let through: its
        first call will tell)."""
        import inspect

        from exactcheck.errors import UsageError
        shown = name or getattr(subject, "__name__", None) or type(subject).__name__
        if not callable(subject):
            raise UsageError(f"{shown} is not callable: a {self.what} is called as {self.call}")
        try:
            signature = inspect.signature(subject)
        except (TypeError, ValueError):
            return
        try:
            signature.bind(*([None] * self.positional))
        except TypeError as exc:
            raise UsageError(f"{shown} cannot be called as a {self.what}: its signature is {signature} ({exc}); "
                             f"a {self.what} is called as {self.call}") from None
