"""An isolated audit: the subject runs in a worker process, so nothing it does ends the auditor.

In-process guards (``exactcheck.subject_call``) turn exceptions, ``SystemExit`` included, and
hangs in Python code into findings. What they cannot survive, ``os._exit``, a segfault or an abort
in native code, or a hang inside a C call that never returns to the interpreter, ends or freezes
the process. ``run_isolated`` runs the whole audit (loading the subject included: its import-time
code runs there too) in a fresh worker (``python -m exactcheck.isolation``: a new interpreter, so
nothing of the caller's state, threads or CUDA context is shared, and no ``__main__`` is re-run) and watches it (``exactcheck.audit_kinds.audit_subject``
with ``isolate=True``; the default of ``exactcheck gate``):

- the worker publishes each subject call as it starts (``subject_call.WATCH``: the time and what
  is being called); a call past the time limit plus ``GRACE_S`` that the worker's own alarm did
  not stop is a hang in native code: the worker is killed;
- a worker that dies or is killed before it hands back its result is the subject's doing: the
  result is an audit with one crashed verdict, "the subject killed its process", saying how
  (exit status, signal, or the hang) and during which call (``killed_result``). It fails the
  audit (exit 1), never passes it.

Ctrl-C reaches the worker with the rest of the terminal's process group, and SIGTERM sent to the
auditor is passed on as SIGINT: the worker ends its audit as an interrupted one and hands back
what it finished. A ``UsageError`` in the worker (a subject that cannot be loaded) comes back as one.
"""
from __future__ import annotations

import mmap
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from exactcheck.errors import SubjectKilled, UsageError
from exactcheck.options import AuditOptions, PseudoWorld

__all__ = ["run_isolated", "killed_result", "GRACE_S"]

GRACE_S = 5.0  # past a call's limit, how long the worker's own alarm gets before the worker is killed
_POLL_S = 0.2
_INTERRUPT_WAIT_S = 60.0  # how long an interrupted worker gets to hand back what it finished


def run_isolated(audit, *, call_timeout: float | None, path: list[str] | None = None):
    """``audit()`` (a picklable callable: a module-level function or ``functools.partial`` of one)
    run in a worker process, and what it returns; ``SubjectKilled`` when the worker ends without
    an answer or hangs in a call past ``call_timeout`` + ``GRACE_S``. ``path``: the worker's
    ``sys.path`` (default this process's)."""
    from exactcheck.subject_call import CallWatch
    with tempfile.TemporaryDirectory(prefix="exactcheck-worker-") as tmp:
        job, answer, watch = (Path(tmp) / name for name in ("job.pickle", "answer.pickle", "watch"))
        job.write_bytes(pickle.dumps((audit, list(path or sys.path))))
        watch.write_bytes(bytes(CallWatch.SIZE))
        with open(watch, "r+b") as f, mmap.mmap(f.fileno(), CallWatch.SIZE) as shared:
            worker = subprocess.Popen([sys.executable, "-m", "exactcheck.isolation", str(job), str(answer), str(watch)])
            how = _watch(worker, shared, call_timeout)
            started, label = CallWatch.read(shared)
        if how is None and answer.exists():
            kind, value = pickle.loads(answer.read_bytes())
            if kind == "result":
                return value
            if kind == "usage":
                raise UsageError(value)
            if kind == "interrupt":
                raise KeyboardInterrupt
            how = f"the audit failed in the worker: {value}"  # exactcheck's own error, reported, never a pass
        if how is None:
            code = worker.returncode
            how = (f"it was ended by signal {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"it exited with status {code} before the audit ended (os._exit, or a native exit)")
    raise SubjectKilled(how, label if started else "outside any subject call (loading it, or between calls)")


def _watch(worker: subprocess.Popen, shared, call_timeout: float | None) -> str | None:
    """Wait for the worker; kill it if a subject call hangs past its limit (the reason, returned)
    or if, interrupted, it does not finish within ``_INTERRUPT_WAIT_S``."""
    from exactcheck.subject_call import CallWatch
    interrupted_at = None
    while True:
        try:
            if worker.poll() is not None:
                return None
            started, _ = CallWatch.read(shared)
            if call_timeout and started and time.time() - started > call_timeout + GRACE_S:
                worker.kill()
                worker.wait()
                return (f"it hung past the call time limit of {call_timeout:g} s where no alarm could stop it "
                        f"(native code)")
            if interrupted_at is not None and time.monotonic() - interrupted_at > _INTERRUPT_WAIT_S:
                worker.kill()
                worker.wait()
                raise KeyboardInterrupt
            time.sleep(_POLL_S)
        except KeyboardInterrupt:
            if interrupted_at is not None:
                raise
            interrupted_at = time.monotonic()
            if worker.poll() is None:  # a terminal's Ctrl-C reached it too; a SIGTERM of ours did not
                worker.send_signal(signal.SIGINT)


def _work(job: str, answer: str, watch: str) -> None:
    """The worker: publish subject calls on the shared watch, run the audit, write its answer."""
    from exactcheck.subject_call import WATCH, CallWatch
    signal.signal(signal.SIGTERM, _terminate)  # a SIGTERM for the worker alone ends its audit as Ctrl-C does
    audit, path = pickle.loads(Path(job).read_bytes())
    sys.path[:] = path
    with open(watch, "r+b") as f:
        WATCH.attach(mmap.mmap(f.fileno(), CallWatch.SIZE))
    try:
        message = ("result", audit())
    except UsageError as exc:
        message = ("usage", str(exc))
    except KeyboardInterrupt:
        message = ("interrupt", "")
    except BaseException as exc:  # noqa: BLE001 - reported to the auditor, never a pass
        message = ("error", "".join(traceback.format_exception_only(type(exc), exc)).strip())
    try:
        data = pickle.dumps(message)
    except Exception as exc:  # noqa: BLE001 - an unpicklable result: say so rather than die silently
        data = pickle.dumps(("error", f"the result could not be sent back: {type(exc).__name__}: {exc}"))
    partial = Path(answer + ".part")
    partial.write_bytes(data)
    os.replace(partial, answer)


def _terminate(signum, frame):
    raise KeyboardInterrupt


def killed_result(result_type, error: SubjectKilled, options: AuditOptions, subject_name: str, reproduce: str,
                  started: str, duration: float):
    """An audit of ``result_type`` whose one verdict is ``error``: it fails (exit 1), never passes."""
    from exactcheck.core import failure_verdict, run_environment
    verdict = failure_verdict(error, world=PseudoWorld.PROCESS.value, seed=options.seed, reproduce=reproduce,
                              samples=0, condition="the worker process the isolated audit ran the subject in")
    return result_type(subject=subject_name, level=options.level.value, seed=options.seed, alpha=options.alpha,
                       device=options.device, verdicts=(verdict,), started=started, duration_s=duration,
                       environment=run_environment(isolated=True), require=options.require)


if __name__ == "__main__":
    _work(*sys.argv[1:4])
