"""Where an audit's shards run: in this process (``LocalExecutor``) or as Ray tasks across a
cluster (``RayExecutor``, ``pip install 'exactcheck[distributed]'``); ``worker_pool``: the worker
processes of ``--jobs N`` (``ProcessExecutor``; the step audit's ``exactcheck.step.workers``), with
``auto_jobs`` the count ``--jobs auto`` resolves to and ``start_workers_early`` the command line's
head start on them; ``one_torch_thread``: the intra-op threads a toy world's draws run on.

A sharded step audit (``AuditOptions.shards`` = N > 1) splits each world's batch of trials into N
shards, each driven with its own seed derived from the batch seed (``shard_seed``), and merges the
shards' counts by adding them before every look of the sequential test, so early stopping and
alpha are unchanged. The shards' samples depend only on their seeds, so a sharded audit gives the
same counts, and the same verdicts, on any executor: ``LocalExecutor`` with the same N is the
single-process reference.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Sequence

from exactcheck.errors import UsageError
from exactcheck.options import derive_seed

__all__ = ["Executor", "LocalExecutor", "ProcessExecutor", "RayExecutor", "make_executor", "split", "shard_seed",
           "worker_pool", "quiet_worker", "auto_jobs", "AUTO_JOBS_CAP", "one_torch_thread", "SMALL_MODEL_PARAMETERS",
           "start_workers_early"]

SMALL_MODEL_PARAMETERS = 10_000_000  # below this a model's forward is too small to share across threads

AUTO_JOBS_CAP = 8  # ``--jobs auto`` starts at most this many workers (each its own interpreter and torch)


def auto_jobs(subject=None, device: str | None = None) -> int:
    """``--jobs auto`` (the command line's default): one worker process per core this process may
    run on, at most ``AUTO_JOBS_CAP``, for exactcheck's own subjects (its references and mutants,
    ``subject`` None for the selftest's) on the CPU; else 1. A user's subject stays in this process
    unless ``--jobs N`` asks: each worker would import its module again (an engine's import can
    take longer than the audit) and it must pickle; a GPU is not shared out by processes.
    ``EXACTCHECK_JOBS`` (a number), where set, is the count instead: a CI job that already runs
    one audit per core sets 1."""
    import os
    if device not in (None, "cpu") or not _own(subject):
        return 1
    chosen = os.environ.get("EXACTCHECK_JOBS", "").strip()
    if chosen:
        if not chosen.isdigit() or int(chosen) < 1:
            raise UsageError(f"EXACTCHECK_JOBS ({chosen!r}) must be a positive integer")
        return int(chosen)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, AUTO_JOBS_CAP))


@contextlib.contextmanager
def one_torch_thread(enabled: bool = True):
    """Run the block on one torch intra-op thread (``enabled``), the count restored after: the toy
    worlds' tensors and a tiny model's are too small to share across threads, and each op pays the
    threads' start-up and spinning, which on a busy machine costs most of the time (greedy identity
    on tiny-llama under a load of 4: 231 s on two threads, 24 s on one). Every computation
    the audit compares is made under the same setting."""
    import torch
    before = torch.get_num_threads()
    if enabled:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _own(subject) -> bool:
    """Whether ``subject`` is exactcheck's own (defined in ``exactcheck`` or ``toy_models``)."""
    if subject is None:
        return True
    module = getattr(subject, "__module__", None) or type(subject).__module__ or ""
    return module.split(".")[0] in ("exactcheck", "toy_models")


def split(n: int, shards: int) -> list[int]:
    """``n`` trials as ``shards`` parts differing by at most one (empty parts dropped)."""
    base, extra = divmod(n, shards)
    return [size for size in (base + (i < extra) for i in range(shards)) if size > 0]


def shard_seed(batch_seed: int, shard: int, shards: int) -> int:
    """Shard ``shard``'s seed; an unsharded audit keeps the batch seed, so its samples are unchanged."""
    return batch_seed if shards == 1 else derive_seed(batch_seed, f"shard/{shard}")


class Executor:
    name = "executor"

    def submit(self, fn: Callable, calls: Sequence[tuple]) -> list[Callable[[], Any]]:
        """One thunk per call; calling it gives that call's result (waiting for it if needed)."""
        raise NotImplementedError

    def map(self, fn: Callable, calls: Sequence[tuple]) -> list[Any]:
        return [result() for result in self.submit(fn, calls)]

    def close(self) -> None:
        pass


class LocalExecutor(Executor):
    """Every shard in this process, one after another, computed when its result is asked for (a
    shard the audit no longer needs, after an early stop, is never run)."""

    name = "local"

    def submit(self, fn, calls):
        return [lambda args=args: fn(*args) for args in calls]


def quiet_worker() -> None:
    """A worker of ``worker_pool``: one torch thread (the workers share the cores), and Ctrl-C left
    to the parent, which stops the pool and keeps what finished."""
    import signal

    import torch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


def worker_pool(jobs: int, initializer: Callable | None = None, initargs: tuple = ()):
    """``jobs`` spawned worker interpreters (a fresh interpreter each: no fork of torch's threads),
    each started with ``quiet_worker``, or with ``initializer(*initargs)``, which calls it."""
    import concurrent.futures
    import multiprocessing
    return concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                                  initializer=initializer or quiet_worker, initargs=initargs)


_EARLY: list = []  # (jobs, pool) started by ``start_workers_early``, for the first ``ProcessExecutor`` of that size


def _warm(module: str) -> None:
    """A worker's first task from ``start_workers_early``: import what its draws will need."""
    import importlib
    importlib.import_module(module)


def start_workers_early(jobs: int, module: str) -> None:
    """Start ``jobs`` workers now, each importing ``module`` (what the kind's draws run), while this
    process goes on loading the subject and the worlds: their imports (torch, transformers: seconds)
    overlap this process's instead of following them. The first ``ProcessExecutor`` of ``jobs``
    takes the pool; one nobody takes is shut down when this process exits."""
    import atexit
    pool = worker_pool(jobs)
    for _ in range(jobs):  # a task each: the pool starts its workers as tasks wait
        pool.submit(_warm, module)
    _EARLY.append((jobs, pool))
    atexit.register(pool.shutdown, wait=False, cancel_futures=True)


class ProcessExecutor(Executor):
    """Every call in one of ``jobs`` worker processes of this machine (``worker_pool``, or the pool
    ``start_workers_early`` started): what ``--jobs N`` gives an audit kind whose draws split into
    independent calls (each call keeps its seed, so the verdicts are the serial run's). The
    function and its arguments must pickle."""

    name = "processes"

    def __init__(self, jobs: int):
        self.jobs = jobs
        early = next((i for i, (n, _) in enumerate(_EARLY) if n == jobs), None)
        self.pool = _EARLY.pop(early)[1] if early is not None else worker_pool(jobs)

    def submit(self, fn, calls):
        futures = [self.pool.submit(fn, *args) for args in calls]
        return [future.result for future in futures]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class RayExecutor(Executor):
    """Every shard a Ray task (one GPU each where the cluster has GPUs). ``address``: an existing
    cluster (``ray://host:10001`` or ``auto``); None starts a local one with ``num_cpus``."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None, gpus_per_task: float | None = None):
        try:
            import ray
        except ImportError as exc:
            raise UsageError(f"--executor ray needs Ray ({exc}); pip install 'exactcheck[distributed]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            options = dict(address=address, ignore_reinit_error=True, include_dashboard=False,
                           log_to_driver=False, configure_logging=False)
            if address is None and num_cpus is not None:
                options["num_cpus"] = num_cpus
            ray.init(**options)
        if gpus_per_task is None:
            gpus_per_task = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
        self.gpus_per_task = gpus_per_task

    def submit(self, fn, calls):
        remote = self.ray.remote(num_gpus=self.gpus_per_task)(fn)
        refs = [remote.remote(*args) for args in calls]
        return [lambda ref=ref: self.ray.get(ref) for ref in refs]

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()


def make_executor(name: str = "local", address: str | None = None, num_cpus: int | None = None) -> Executor:
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(address, num_cpus)
    raise UsageError(f"executor {name!r}: expected local or ray")
