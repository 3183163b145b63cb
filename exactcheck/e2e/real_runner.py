"""The runner both real-model audits share (``exactcheck greedy``: ``exactcheck.e2e.real_models``;
``exactcheck grammar``: ``exactcheck.e2e.real_grammar``): the plan they execute, the clock, one
progress bar over greedy runs and sampled generations, the environment of the report, and the
typed result in the plan's check order. The audit modules hold only their checks.
"""
from __future__ import annotations

import datetime as _dt
import time

from exactcheck.core import apply_holm, run_environment, unreached_verdicts
from exactcheck.e2e.greedy_identity import GreedyIdentityResult, greedy_identity
from exactcheck.options import AuditPlan
from exactcheck.progress import Progress
from exactcheck.report.result import AuditResult
from exactcheck.report.verdict import Verdict

__all__ = ["RealModelRun"]


class RealModelRun:
    """One real-model audit in progress. ``total``: greedy runs plus sampled generations."""

    def __init__(self, plan: AuditPlan, total: int, desc: str, progress: bool = True):
        self.plan = plan
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.clock = time.perf_counter()
        self.bar = Progress(total, unit="run", desc=desc, enabled=progress)

    def greedy_identity(self, generator, target, draft, prompts, draft_lengths, new_tokens: int, seed: int,
                        vocab: int, **options) -> GreedyIdentityResult:
        """``exactcheck.e2e.greedy_identity.greedy_identity`` with the bar advanced per run."""
        done = [0]

        def show(finished, _total, _name):
            self.bar.step("greedy identity", finished - done[0])
            done[0] = finished

        return greedy_identity(generator, target, draft, prompts, draft_lengths, new_tokens, seed, vocab,
                               progress=show, **options)

    def step(self, label: str) -> None:
        self.bar.step(label)

    def finish(self, result_type: type[AuditResult], verdicts: list[Verdict], *, subject: str, seed: int,
               alpha: float | None, device, samples_planned: int, samples_drawn: int,
               environment: dict, interrupted: bool = False, reproduce: str = "") -> AuditResult:
        """The result: Holm over the statistical verdicts (when the plan spends alpha), verdicts in
        the plan's order (a contract verdict the plan does not name comes last). ``interrupted``
        (Ctrl-C): the checks not reached get "not run" verdicts and the result is marked incomplete."""
        self.bar.close()
        if interrupted:
            verdicts = verdicts + unreached_verdicts(self.plan.checks, verdicts, seed, lambda _world: reproduce)
        if alpha is not None:
            verdicts = apply_holm(verdicts, self.plan.budget)
        order = {name: i for i, name in enumerate(self.plan.names)}
        verdicts = sorted(verdicts, key=lambda v: order.get(v.check, len(order)))
        return result_type(subject=subject, level=None, seed=seed, alpha=alpha, device=str(device),
                           verdicts=tuple(verdicts), started=self.started,
                           duration_s=time.perf_counter() - self.clock, environment=run_environment(**environment),
                           samples_planned=samples_planned, samples_drawn=samples_drawn, interrupted=interrupted)
