"""An audit: every check of the suite on one subject, under one false-alarm budget.

world -> drive -> samples -> laws -> statistics -> Holm -> verdicts. Each world is driven once
with its own seed (derived from the root seed and the world's name); every law of that world is
checked on the same samples. Holm's method over all checks keeps the probability that an exact
subject gets any defect verdict at most alpha, whatever the dependence between checks.
"""
from __future__ import annotations

import datetime as _dt
import platform
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from exactcheck import __version__
from exactcheck.boundary import BOUNDARY_VALUES, check_forbidden_tokens
from exactcheck.contract import Verifier
from exactcheck.drive import drive
from exactcheck.errors import ContractViolation, SubjectCrashed, UsageError
from exactcheck.laws import LawComparison, compare, planned_laws
from exactcheck.progress import Progress
from exactcheck.statistics import GoodnessOfFit, goodness_of_fit, holm
from exactcheck.suite import BOUNDARY_ROWS, Level, boundary_worlds, default_worlds, derive_seed
from exactcheck.verdict import CellDeviation, Outcome, Verdict

__all__ = ["AuditResult", "run_audit", "DEFAULT_ALPHA"]

DEFAULT_ALPHA = 1e-3
STATISTIC_NAME = "Pearson X^2 (pooled)"


@dataclass(frozen=True)
class AuditResult:
    subject: str
    level: str
    seed: int
    alpha: float
    device: str
    verdicts: tuple[Verdict, ...]
    started: str
    duration_s: float
    environment: dict

    @property
    def failed(self) -> tuple[Verdict, ...]:
        return tuple(v for v in self.verdicts if v.outcome.failed)

    @property
    def passed(self) -> bool:
        return not self.failed

    def count(self, outcome: Outcome) -> int:
        return sum(v.outcome is outcome for v in self.verdicts)

    def strongest_failure(self) -> Verdict | None:
        """The failed verdict with the most evidence (smallest adjusted p-value, then largest TV)."""
        if not self.failed:
            return None
        return min(self.failed, key=lambda v: (v.adjusted_pvalue if v.adjusted_pvalue is not None
                                               else 0.0, -(v.tv_estimate or 0.0)))


def _resolve_level(level: Level | str) -> Level:
    try:
        return level if isinstance(level, Level) else Level(level)
    except ValueError:
        raise UsageError(f"level ({level!r}) must be one of quick, standard, release") from None


def _resolve_device(device: str | torch.device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device ({device}) is not available: torch sees no CUDA device")
    return device


def _evidence(comparison: LawComparison, n: int, most: int = 8) -> tuple[CellDeviation, ...]:
    expected = comparison.plan.expected * n
    observed = comparison.counts
    score = np.where(expected > 0, np.abs(observed - expected) / np.sqrt(np.maximum(expected, 1e-300)),
                     np.where(observed > 0, np.inf, 0.0))
    top = np.argsort(-score, kind="stable")[:most]
    return tuple(CellDeviation(comparison.plan.label(int(i)), int(observed[i]), float(expected[i]))
                 for i in top if score[i] > 0)


def _statistical_summary(gof: GoodnessOfFit) -> str:
    if gof.impossible:
        return f"{gof.impossible:,} samples fell on outcomes of exact probability 0"
    return f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}"


def run_audit(subject: Verifier, *, subject_name: str | None = None,
              level: Level | str = Level.STANDARD, seed: int = 0, alpha: float = DEFAULT_ALPHA,
              device: str | torch.device = "cpu", worlds: list[str] | None = None,
              progress: bool = True) -> AuditResult:
    """Audit a step-level verifier on the built-in worlds and return every verdict."""
    if not callable(subject):
        raise UsageError(f"subject ({subject!r}) is not callable")
    if not 0 < alpha < 1:
        raise UsageError(f"alpha ({alpha}) must be in (0, 1)")
    level, device = _resolve_level(level), _resolve_device(device)
    name = subject_name or getattr(subject, "__name__", None) or type(subject).__name__
    chosen = default_worlds()
    boundary = boundary_worlds()
    if worlds:
        unknown = set(worlds) - {w.name for w in chosen}
        if unknown:
            raise UsageError(f"unknown world(s) {sorted(unknown)}; known: {[w.name for w in chosen]}")
        chosen = [w for w in chosen if w.name in worlds]
        boundary = [w for w in boundary if w.name in worlds]
    n = level.samples_per_world
    plans = {w.name: planned_laws(w, n) for w in chosen}
    planned = sum(len(p) for p in plans.values()) + len(boundary) * len(BOUNDARY_VALUES)
    first_share = alpha / max(planned, 1)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    bar = Progress(len(chosen) + len(boundary), enabled=progress)

    def reproduce(world: str) -> str:
        if ":" in name:  # an importable MODULE:CALLABLE
            return (f"exactcheck audit {name} --level {level.value} --seed {seed} "
                    f"--alpha {alpha:g} --world {world}")
        return (f"run_audit({name}, level={level.value!r}, seed={seed}, alpha={alpha:g}, "
                f"worlds=[{world!r}])")

    pending: list[Verdict] = []
    for world in chosen:
        world_seed = derive_seed(seed, world.name)
        base = dict(world=world.name, seed=world_seed, reproduce=reproduce(world.name))
        try:
            samples = drive(subject, world, n, world_seed, device)
        except (SubjectCrashed, ContractViolation) as exc:
            pending.append(_failure_verdict(exc, samples=n, **base))
            bar.step(world.name)
            continue
        for plan in plans[world.name]:
            comparison = compare(plan, samples)
            gof = goodness_of_fit(comparison.counts, plan.expected, first_share)
            common = dict(base, check=f"{world.name}/{plan.law}", law=plan.law,
                          condition=plan.condition, samples=gof.samples)
            if gof.samples == 0:
                pending.append(Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
                    f"no trial met the condition ({plan.condition}) although the exact law expects "
                    "it often; see the accepted_length verdict"), **common))
                continue
            pending.append(Verdict(
                outcome=Outcome.EXACT, summary=_statistical_summary(gof),
                statistic=gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
                pvalue=gof.pvalue, tv_estimate=gof.tv_estimate, tv_interval=gof.tv_interval,
                detectable_tv=gof.detectable_tv, evidence=_evidence(comparison, gof.samples),
                **common))
        bar.step(world.name)
    for world in boundary:
        for value in BOUNDARY_VALUES:
            pending.append(_boundary_verdict(subject, world, value, seed, device, reproduce))
        bar.step(f"{world.name} (boundary uniforms)")

    verdicts = _apply_holm(pending, alpha)
    return AuditResult(
        subject=name, level=level.value, seed=seed, alpha=alpha, device=str(device),
        verdicts=tuple(verdicts), started=started, duration_s=time.perf_counter() - clock,
        environment={"exactcheck": __version__, "torch": torch.__version__,
                     "python": platform.python_version(), "platform": platform.platform()})


def _failure_verdict(exc: Exception, *, world: str, seed: int, reproduce: str, samples: int,
                     law: str = "contract", condition: str = "every verify call") -> Verdict:
    outcome = Outcome.CRASHED if isinstance(exc, SubjectCrashed) else Outcome.CONTRACT_VIOLATION
    return Verdict(check=f"{world}/{law}", world=world, law=law, condition=condition,
                   outcome=outcome, summary=str(exc), samples=samples, seed=seed,
                   reproduce=reproduce, pvalue=0.0)


def _boundary_verdict(subject, world, value, root_seed, device, reproduce) -> Verdict:
    law = f"forbidden_token@u={value}"
    seed = derive_seed(root_seed, f"{world.name}/{law}")
    common = dict(world=world.name, seed=seed, reproduce=reproduce(world.name), law=law,
                  condition=f"every uniform = {value}", samples=BOUNDARY_ROWS)
    try:
        result = check_forbidden_tokens(subject, world, value, BOUNDARY_ROWS, seed, device)
    except (SubjectCrashed, ContractViolation) as exc:
        return _failure_verdict(exc, **common)
    check = f"{world.name}/{law}"
    if result.violation is not None:
        return Verdict(check=check, outcome=Outcome.DEFECT, summary=str(result.violation),
                       pvalue=0.0, **common)
    if result.controlled_draws == 0:
        return Verdict(check=check, outcome=Outcome.INCONCLUSIVE, summary=(
            "the subject drew no uniforms through torch.rand, torch.rand_like or "
            "Tensor.uniform_, so its random numbers could not be forced"), **common)
    return Verdict(check=check, outcome=Outcome.EXACT, pvalue=1.0, summary=(
        f"no forbidden token in {BOUNDARY_ROWS:,} rows ({result.controlled_draws} forced draws)"),
        **common)


def _apply_holm(pending: list[Verdict], alpha: float) -> list[Verdict]:
    tested = [i for i, v in enumerate(pending) if v.pvalue is not None]
    adjusted, shares = holm([pending[i].pvalue for i in tested], alpha)
    out = list(pending)
    for i, adj, share in zip(tested, adjusted, shares):
        v = pending[i]
        outcome = v.outcome
        if v.outcome is Outcome.EXACT and adj <= alpha:
            outcome = Outcome.DEFECT
        out[i] = replace(v, outcome=outcome, adjusted_pvalue=adj, alpha_share=share)
    return out
