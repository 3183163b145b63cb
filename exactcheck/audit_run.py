"""One audit run: the prologue and epilogue every runner shares, written once.

A runner (step, e2e, tree, tree-loop, serve) keeps what is its own, its driver and its verdict
builders, and hands the rest to an ``AuditRun``:

- the start time and the clock (``started``, ``seconds``);
- progress bars (``bar``), closed when the run finishes;
- the pending verdicts (``add``), and a subject that crashed or broke its contract on a world
  (``crashed``): one failure verdict standing for that world's checks;
- the interrupt: Ctrl-C (and SIGTERM, which the command turns into it) inside ``interruptible()``
  ends the drawing; the verdicts so far are kept and every planned check that has none gets a
  "not run" verdict, so the partial result is marked incomplete, never a pass;
- ``--jobs N`` (``executor``): the kind's independent draws in N worker processes, closed with the
  run, each draw keeping its seed, so the verdicts are the serial run's;
- ``finish(ResultType, ...)``: Holm over the plan's statistical checks (``core.apply_holm``), the
  plots kept where needed, the kind's typed result with the run's timing, samples and interrupt.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import time
from typing import Callable, Iterable, Sequence

from exactcheck.core import INTERRUPTED, apply_holm, failure_verdict, keep_plots_where_needed, unreached_verdicts
from exactcheck.errors import UsageError
from exactcheck.options import AlphaBudget, Check
from exactcheck.progress import Progress
from exactcheck.report.result import AuditResult
from exactcheck.report.verdict import Verdict

__all__ = ["AuditRun", "INTERRUPTED"]



class AuditRun:
    """``checks``: the plan's checks, in order (what an interrupted run still owes a verdict);
    ``budget``: alpha's split (Holm's family); ``reproduce(world)``: each world's reproduce line;
    ``progress``: whether bars are shown; ``unreached``: the words of a check an interrupt left.
    A run whose plan is known only once it has started (a served system's worlds come from its
    tokenizer) is given them by ``plan``."""

    def __init__(self, checks: Sequence[Check], budget: AlphaBudget | None, seed: int,
                 reproduce: Callable[[str], str], *, progress: bool = True, unreached: str = INTERRUPTED):
        self.checks, self.budget, self.seed, self.reproduce = tuple(checks), budget, seed, reproduce
        self.progress, self.unreached = progress, unreached
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._clock = time.perf_counter()
        self.pending: list[Verdict] = []
        self.planned = self.drawn = 0
        self.interrupted = False
        self._bars: list[Progress] = []
        self._executors: list = []

    def plan(self, checks: Sequence[Check], budget: AlphaBudget) -> None:
        self.checks, self.budget = tuple(checks), budget

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._clock

    def bar(self, total: int, *, unit: str, desc: str, growing: bool = False) -> Progress:
        bar = Progress(total, unit=unit, desc=desc, enabled=self.progress, growing=growing)
        self._bars.append(bar)
        return bar

    def executor(self, jobs: int = 1):
        """Where the kind's independent draws run: this process (``jobs`` 1), or ``jobs`` worker
        processes (``exactcheck.executors.ProcessExecutor``), shut down when the run finishes."""
        from exactcheck.executors import LocalExecutor, ProcessExecutor
        if jobs < 1:
            raise UsageError(f"--jobs ({jobs}) must be at least 1")
        if jobs == 1:
            return LocalExecutor()
        executor = ProcessExecutor(jobs)
        self._executors.append(executor)
        return executor

    def add(self, *verdicts: Verdict) -> None:
        self.pending.extend(verdicts)

    def extend(self, verdicts: Iterable[Verdict]) -> None:
        self.pending.extend(verdicts)

    def crashed(self, exc: Exception, *, world: str, seed: int, samples: int, condition: str,
                reproduce: str | None = None) -> None:
        """The subject crashed or broke its contract on ``world``: one verdict stands for its checks."""
        self.pending.append(failure_verdict(exc, world=world, seed=seed, samples=samples, condition=condition,
                                            reproduce=reproduce if reproduce is not None else self.reproduce(world)))

    @contextlib.contextmanager
    def interruptible(self):
        """Ctrl-C inside the block ends it; the run goes on to ``finish`` with what it has."""
        try:
            yield
        except KeyboardInterrupt:
            self.interrupted = True

    def close_bars(self) -> None:
        for bar in self._bars:
            bar.close()
        self._bars.clear()
        for executor in self._executors:
            executor.close()
        self._executors.clear()

    def finish(self, result_type: type[AuditResult], *, decide: Callable[[list[Verdict]], list[Verdict]] | None = None,
               order: Sequence[Check] | None = None, strays_last: bool = False, **fields) -> AuditResult:
        """The typed result: Holm over the pending verdicts (none for a run without a budget: its
        checks are deterministic; ``decide`` then names causes, where a kind does), plots kept where
        needed, the run's timing, samples and interrupt. ``order``: the plan's checks, in the order to
        report (a verdict the plan does not name goes where its world's checks are, or last with
        ``strays_last``)."""
        self.close_bars()
        if self.interrupted:
            self.pending += unreached_verdicts(self.checks, self.pending, self.seed, self.reproduce, self.unreached)
        if order is not None:
            rank = {c.name: i for i, c in enumerate(order)}
            first: dict[str, int] = {}
            for c in order:
                first.setdefault(c.world, rank[c.name])
            if strays_last:
                self.pending.sort(key=lambda v: rank.get(v.check, len(rank)))
            else:
                self.pending.sort(key=lambda v: rank.get(v.check, first.get(v.world, len(rank)) - 0.5))
        verdicts = apply_holm(self.pending, self.budget) if self.budget is not None else list(self.pending)
        if decide is not None:
            verdicts = decide(verdicts)
        fields.setdefault("samples_planned", self.planned)
        return result_type(verdicts=tuple(keep_plots_where_needed(verdicts)), started=self.started,
                           duration_s=self.seconds, samples_drawn=self.drawn, interrupted=self.interrupted, **fields)
