"""The recurrent-state audit of a generator (``exactcheck recurrent``).

For every recurrent world (``toy_models.recurrent_lm.recurrent_worlds``): ``n`` sampled
generations (the level's count) against the world's exact float64 sequence law and its first
token (pooled Pearson, Holm over the laws of every world), the KV record's rollback
(``cache_rollback``, the generator audit's invariants), the recurrent state's rollback
(``state_rollback``: every forward call, every row, layer and state part, and every final cache),
and greedy identity against the target's own greedy decode. The generator takes the world's draft
length where it can (``exactcheck.contracts.generator.with_draft_length``). ``--jobs N`` draws each
world's generations in N worker processes, every generation with its seed: the serial verdicts.
"""
from __future__ import annotations

import dataclasses

from exactcheck.audit_run import AuditRun
from exactcheck.core import resolve_device, run_environment
from exactcheck.generation.drive import GeneratorSamples
from exactcheck.contracts.generator import SAMPLING, draft_length_support, generator_name, with_draft_length
from exactcheck.generation.verdicts import generation_law_verdicts, greedy_verdict, rollback_verdict
from exactcheck.errors import SubjectError, UsageError
from exactcheck.executors import one_torch_thread, split
from exactcheck.options import AuditOptions, derive_seed
from exactcheck.recurrent.drive import RecurrentSamples, drive_shard
from exactcheck.recurrent.plan import plan_recurrent_audit
from exactcheck.recurrent.result import RecurrentAuditResult
from exactcheck.recurrent.verdicts import state_verdict
from exactcheck.subject_call import call_time_limit

__all__ = ["run_recurrent_audit"]


def run_recurrent_audit(generator, *, subject_name: str | None = None, options: AuditOptions | None = None,
                        greedy: bool = True, progress: bool = True, reproduce=None, **settings) -> RecurrentAuditResult:
    """Audit ``generator`` on the recurrent worlds; ``options`` or its fields as keywords (``level``,
    ``seed``, ``alpha``, ``worlds``, ``generations``, ``require``, ``jobs``). ``reproduce(world)``:
    each world's reproduce line (``exactcheck recurrent``'s entry gives it)."""
    options = AuditOptions.of(options, settings)
    if not callable(generator):
        raise UsageError(f"generator ({generator!r}) is not callable")
    with call_time_limit(options.call_timeout), one_torch_thread():
        return _run(generator, options, subject_name, greedy, progress, reproduce)


def _require_hybrid_caches() -> None:
    """The worlds' models keep their states in transformers' hybrid cache (``LinearAttentionLayer``,
    transformers 5.x); an older transformers is the user's setup: one line, exit 2."""
    try:
        from transformers import __version__ as version, cache_utils
    except ImportError as exc:
        raise UsageError(f"exactcheck recurrent needs transformers ({exc}): pip install 'transformers>=5'") from None
    if not hasattr(cache_utils, "LinearAttentionLayer"):
        raise UsageError(f"exactcheck recurrent needs transformers with hybrid caches (cache_utils.LinearAttentionLayer, "
                         f"transformers 5.x); this one is {version}")


def _run(generator, options: AuditOptions, subject_name, greedy, progress, reproduce) -> RecurrentAuditResult:
    _require_hybrid_caches()
    from toy_models.recurrent_lm import recurrent_worlds
    device = resolve_device(options.device)
    plan = plan_recurrent_audit(options, greedy)
    worlds = [w for w in recurrent_worlds() if w.name in {c.world for c in plan.checks}]
    name = generator_name(generator)
    n, seed, budget = options.generations_per_world, options.seed, plan.budget

    def line(world: str) -> str:
        return reproduce(world) if reproduce is not None else (
            f"run_recurrent_audit({subject_name or name!r}, worlds=[{world!r}], seed={seed}, "
            f"level={options.level.value!r})")

    run = AuditRun(plan.checks, budget, seed, line, progress=progress)
    run.planned = n * len(worlds)
    bar = run.bar(run.planned, unit="generation", desc="exactcheck: recurrent worlds")
    executor = run.executor(options.jobs)
    with run.interruptible():
        for world in worlds:
            world_seed = derive_seed(seed, world.name)
            base = dict(world=world.name, seed=world_seed, reproduce=line(world.name))
            subject = generator
            if draft_length_support(generator):
                subject = with_draft_length(generator, world.world.draft_length)
            run_seed = derive_seed(world_seed, "sampling")
            shards = split(n, max(1, options.jobs))
            starts = [sum(shards[:i]) for i in range(len(shards))]
            parts = executor.submit(drive_shard, [(subject, world, size, run_seed, SAMPLING, str(device), first)
                                                  for size, first in zip(shards, starts)])
            try:
                samples = _merged([_value(part, bar, world.name) for part in parts])
            except SubjectError as exc:
                run.crashed(exc, world=world.name, seed=world_seed, samples=n, condition="every generation")
                continue
            run.drawn += samples.size
            run.extend(generation_law_verdicts(samples.samples, budget.first_share, budget.alpha, base, None))
            run.add(rollback_verdict(samples.samples, base))
            run.add(state_verdict(samples, base))
            if greedy:
                bar.step(f"{world.name}/greedy_identity", 0)
                run.add(greedy_verdict(subject, world, world_seed, base, None, device))
    return run.finish(RecurrentAuditResult, order=plan.checks, subject=name, level=options.level.value, seed=seed,
                      alpha=budget.alpha, device=str(device), environment=run_environment(),
                      require=options.require)


def _value(part, bar, label: str):
    value = part()
    if isinstance(value, SubjectError):
        raise value
    bar.step(label, value.size)
    return value


def _merged(parts: list[RecurrentSamples]) -> RecurrentSamples:
    """Consecutive ranges of one run's generations as one run's samples."""
    first = parts[0].samples
    samples = GeneratorSamples(first.world, first.policy, tuple(o for p in parts for o in p.samples.outputs),
                               first.seed, sum(p.samples.forward_calls for p in parts),
                               tuple(b for p in parts for b in p.samples.breaches), 0,
                               sum(p.samples.cached_calls for p in parts), first.batched)
    return dataclasses.replace(parts[0], samples=samples,
                               state_breaches=tuple(b for p in parts for b in p.state_breaches),
                               state_calls=sum(p.state_calls for p in parts),
                               final_states_checked=sum(p.final_states_checked for p in parts))
