"""The run both real-model audits share (``exactcheck greedy``: ``exactcheck.e2e.real_models``;
``exactcheck grammar``: ``exactcheck.e2e.real_grammar``): the one audit run core
(``exactcheck.audit_run.AuditRun``: the clock, the bar, the interrupt, Holm, the typed result) with
one progress bar over greedy runs and sampled generations, and the verdicts in the plan's check
order. The audit modules hold only their checks.
"""
from __future__ import annotations

from exactcheck.audit_run import AuditRun
from exactcheck.core import run_environment
from exactcheck.generation.greedy_identity import GreedyIdentityResult, greedy_identity
from exactcheck.options import AuditPlan
from exactcheck.report.result import AuditResult
from exactcheck.report.verdict import Verdict

__all__ = ["RealModelRun"]


class RealModelRun(AuditRun):
    """One real-model audit in progress. ``total``: greedy runs plus sampled generations;
    ``reproduce``: the audit's reproduce line (one for every check); ``statistical``: whether the
    plan spends alpha (False: deterministic checks only, no Holm)."""

    def __init__(self, plan: AuditPlan, total: int, desc: str, *, seed: int, reproduce: str,
                 statistical: bool, progress: bool = True):
        super().__init__(plan.checks, plan.budget if statistical else None, seed, lambda _world: reproduce,
                         progress=progress)
        self.runs = self.bar(total, unit="run", desc=desc)

    def greedy_identity(self, generator, target, draft, prompts, draft_lengths, new_tokens: int, seed: int,
                        vocab: int, **options) -> GreedyIdentityResult:
        """``exactcheck.generation.greedy_identity.greedy_identity`` with the bar advanced per run."""
        done = [0]

        def show(finished, _total, _name):
            self.runs.step("greedy identity", finished - done[0])
            done[0] = finished

        return greedy_identity(generator, target, draft, prompts, draft_lengths, new_tokens, seed, vocab,
                               progress=show, **options)

    def step(self, label: str) -> None:
        self.runs.step(label)

    def finish_with(self, result_type: type[AuditResult], verdicts: list[Verdict], *, subject: str, alpha: float | None,
                    device, samples_planned: int, samples_drawn: int, environment: dict,
                    interrupted: bool = False) -> AuditResult:
        """The result: Holm over the statistical verdicts (when the plan spends alpha), verdicts in
        the plan's order (a contract verdict the plan does not name comes last). ``interrupted``
        (Ctrl-C): the checks not reached get "not run" verdicts and the result is marked incomplete."""
        self.interrupted = self.interrupted or interrupted
        self.drawn = samples_drawn
        self.extend(verdicts)
        return self.finish(result_type, order=self.checks, strays_last=True, subject=subject, level=None,
                           seed=self.seed, alpha=alpha, device=str(device), environment=run_environment(**environment),
                           samples_planned=samples_planned)
