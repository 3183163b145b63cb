"""``exactcheck audit --jobs N``: a step audit's law batches and property searches in N worker
processes, with the serial run's verdicts.

The plans' laws carry lambdas (their cells), which do not pickle, so nothing of the plan crosses a
process: each worker (a spawned interpreter, one torch thread, Ctrl-C left to the parent) unpickles
the subject once and builds the same plan from the same options (``plan_step_audit`` is a pure
function of them); a call then names its world, and the worker finds the world and its laws in its
own plan. A batch's calls are driven with the seeds the serial run uses, so the counts, and the
verdicts, are the serial run's; the parent merges them in world order before each look, as it does
a sharded batch (``exactcheck.executors``). Results come back as values: counts, or the subject's
failure (``SubjectError`` pickles with its message and frames).

A subject must pickle (a module-level function or class instance: what ``MODULE:CALLABLE``
loads); one that does not is a usage error that says so.
"""
from __future__ import annotations

import functools
import pickle
from concurrent.futures.process import BrokenProcessPool

from exactcheck.errors import ContractViolation, SubjectCrashed, SubjectKilled, UsageError
from exactcheck.executors import Executor, worker_pool
from exactcheck.options import DEFAULT_CALL_ELEMENTS, AuditOptions
from exactcheck.step.laws import compare
from exactcheck.step.drive import drive

__all__ = ["shard_counts", "PlanWorkers"]


def shard_counts(subject, world, plans, size: int, seed: int, device: str,
                 max_elements: int = DEFAULT_CALL_ELEMENTS):
    """One shard: ``size`` trials of ``world`` driven with ``seed`` in verify calls of at most
    ``max_elements`` target_probs elements, counted into each law's cells (what a Ray task
    returns: counts, not samples), or the subject's failure as a value."""
    try:
        samples = drive(subject, world, size, seed, device, max_elements)
    except (SubjectCrashed, ContractViolation) as exc:
        return exc
    return [compare(plan, samples).counts for plan in plans]


_SUBJECT = None  # in a worker: the subject, and the plan built from the audit's options
_PLAN = None


def _start_worker(subject: bytes, options: AuditOptions) -> None:
    from exactcheck.executors import quiet_worker
    from exactcheck.step.plan import plan_step_audit
    global _SUBJECT, _PLAN
    quiet_worker()
    _SUBJECT = pickle.loads(subject)
    _PLAN = plan_step_audit(options)


def _world_shard(world: str, size: int, seed: int, device: str, max_elements: int):
    return shard_counts(_SUBJECT, _PLAN.world(world), list(_PLAN.world_laws(world)), size, seed, device,
                        max_elements)


def _property_search(prop: str, examples: int, seed: int, device: str, deadline):
    import torch

    from exactcheck.step.plan import judged_rule
    from exactcheck.step.properties import search
    return search(_SUBJECT, prop, examples, seed, torch.device(device), judged_rule(_PLAN.options), deadline)


def _counts_or_killed(world: str, future):
    try:
        return future.result()
    except BrokenProcessPool:
        return SubjectKilled("a --jobs worker process died (os._exit, a signal, or out of memory)",
                             f"a batch of {world}")


class PlanWorkers(Executor):
    """``jobs`` worker processes for one step-audit plan (``options``: the options it was built
    from). ``submit`` takes calls of ``shard_counts``'s shape, the runner's one kind of batch call,
    and sends each as its world's name, size and seed (the worker runs ``shard_counts``); a worker
    the subject ends (``os._exit``, a signal) comes back as that call's failure, as ``shard_counts``
    returns one. ``search`` runs a property search there."""

    name = "processes"

    def __init__(self, subject, options: AuditOptions, jobs: int):
        try:
            payload = pickle.dumps(subject)
        except Exception as exc:  # a lambda, a closure, a local class: not a MODULE:CALLABLE
            raise UsageError(f"--jobs {jobs}: the subject does not pickle ({type(exc).__name__}: {exc}); give a "
                             "module-level function or class instance, or run with --jobs 1") from None
        self.jobs = jobs
        self.pool = worker_pool(jobs, initializer=_start_worker, initargs=(payload, options))

    def submit(self, fn, calls):
        futures = [(world.name, self.pool.submit(_world_shard, world.name, size, seed, device, max_elements))
                   for _subject, world, _plans, size, seed, device, max_elements in calls]
        return [functools.partial(_counts_or_killed, name, future) for name, future in futures]

    def search(self, prop: str, examples: int, seed: int, device, deadline=None):
        """A thunk for the property search ``prop`` run in a worker (the serial run's seed; the
        rule it judges by is the plan's, built there)."""
        return self.pool.submit(_property_search, prop, examples, seed, str(device), deadline).result

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
