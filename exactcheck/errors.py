"""exactcheck's exceptions: one root, each subclass for one kind of trouble."""
from __future__ import annotations

import enum
import os
import pickle
import traceback

__all__ = [
    "ExactcheckError",
    "UsageError",
    "SubjectError",
    "SubjectCrashed",
    "SubjectTimedOut",
    "SubjectKilled",
    "ContractViolation",
    "Violation",
    "subject_frames",
]


class ExactcheckError(Exception):
    """Root of every exception exactcheck raises on purpose."""


class UsageError(ExactcheckError, ValueError):
    """exactcheck was called wrongly: a bad subject path, level, alpha or option."""


class SubjectError(ExactcheckError):
    """The subject under test misbehaved; the audit turns this into a verdict, not a traceback.

    Picklable with its attributes (a shard run as a Ray task returns it as a value); the
    subject's own exception travels as a ``RemoteException`` with its type name and message when
    it cannot be pickled itself."""

    def __reduce__(self):
        state = dict(self.__dict__)
        if "exc" in state:
            try:
                pickle.dumps(state["exc"])
            except Exception:
                state["exc"] = RemoteException(f"{type(state['exc']).__name__}: {state['exc']}")
        return _restore, (type(self), self.args, state)


class RemoteException(Exception):
    """A subject's exception that could not cross a process boundary: its type and message."""


def _restore(cls, args, state):
    error = cls.__new__(cls)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


# exactcheck's own driving code: frames here are not the subject's
_DRIVER_FILES = tuple(os.path.join(os.path.dirname(__file__), *name.split("/"))
                      for name in ("contracts/verifier.py", "contracts/generator.py", "forcing/randomness.py",
                                   "subject_call.py", "contracts/tree_verifier.py"))
MAX_FRAMES = 8


def subject_frames(exc: BaseException) -> tuple[str, ...]:
    """The frames of ``exc``'s traceback below exactcheck's driver, as "file:line in function:
    code", innermost last (at most ``MAX_FRAMES``)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename not in _DRIVER_FILES]
    return tuple(f"{f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "")
                 for f in frames[-MAX_FRAMES:])


class SubjectCrashed(SubjectError):
    """The subject raised an exception while being driven; ``frames`` are its own frames."""

    def __init__(self, exc: BaseException):
        self.exc = exc
        self.frames = subject_frames(exc)
        super().__init__(f"subject raised {type(exc).__name__}: {exc}")


class SubjectTimedOut(SubjectCrashed):
    """A subject call ran past the call time limit (``exactcheck.subject_call``): a hang, reported
    with the frames it was stopped in."""

    def __init__(self, seconds: float, stopped: BaseException | None = None, elapsed: float | None = None,
                 again: bool = False):
        late = f" (it came back after {elapsed:.1f} s)" if elapsed is not None else ""
        self.exc = TimeoutError(f"not called: the subject hung on an earlier call of this audit (past {seconds:g} s)"
                                if again else f"the subject did not return within {seconds:g} s (--call-timeout){late}")
        self.frames = subject_frames(stopped) if stopped is not None else ()
        SubjectError.__init__(self, f"subject timed out: {self.exc}")


class SubjectKilled(SubjectCrashed):
    """The subject ended the worker process an isolated audit ran it in (``os._exit``, a signal
    such as SIGSEGV) or hung it past the call time limit where no alarm could reach it
    (``exactcheck.isolation``)."""

    def __init__(self, how: str, during: str = ""):
        self.exc = RuntimeError(how + (f" while running {during}" if during else ""))
        self.frames = ()
        SubjectError.__init__(self, f"the subject killed its process: {self.exc}")


class Violation(enum.Enum):
    """Ways a subject's output can break its contract: the step contract (vLLM's rejection-sampler
    layout) or the generator contract (``exactcheck.contracts.generator``)."""

    NOT_A_TENSOR = "output is not a torch.Tensor"
    WRONG_SHAPE = "output shape is not [B, k+1]"
    WRONG_DTYPE = "output dtype is not int64"
    OUT_OF_VOCABULARY = "an emitted id is outside [0, V) and is not the padding id -1"
    TOKEN_AFTER_PADDING = "a token follows a -1 padding entry"
    NOTHING_EMITTED = "a row emits no token (every step must emit a correction or bonus token)"
    DRAFT_MISMATCH = "an emitted draft position differs from the draft token given"
    PROMPT_CHANGED = "the generated sequence does not start with the prompt"
    WRONG_LENGTH = "the generator did not return exactly the requested number of new tokens"
    NOT_A_TREE_PATH = "the emitted tokens do not follow a root-to-node path of the tree"
    MUTATED_INPUT = "the subject wrote into a tensor it was handed to read"


class ContractViolation(SubjectError):
    """The subject's output broke the contract; ``row`` is the first offending batch row."""

    def __init__(self, violation: Violation, detail: str, row: int | None = None):
        self.violation = violation
        self.detail = detail
        self.row = row
        super().__init__(f"{violation.value}: {detail}")
