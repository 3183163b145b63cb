"""The end-to-end audit of a generator: sequence laws, cache rollback and greedy identity.

For every model world (``toy_models.hf_toy_lm.model_worlds``):

- ``sequence``: ``n`` sampled generations (the level's count) against the world's exact float64
  law of the first ``length`` tokens under the policy (pooled Pearson; Holm over all sequence
  checks at alpha; an impossible sequence is a deterministic finding);
- ``cache_rollback``: the invariants of ``exactcheck.generation.cache_invariants`` on every forward call of
  those generations, and any final cache the generator hands back (deterministic: an exact
  generator never breaks them, so a breach spends none of alpha);
- ``greedy_identity``: greedy generations from several prompts at draft lengths 1..8 (passed as
  the generator takes them: ``exactcheck.contracts.generator.draft_length_support``) equal the target's
  own greedy decode (``exactcheck.generation.greedy_identity``); a divergence that float64 shows to be a
  numerical tie is reported, not failed;
- ``draft_follows_q`` (a generator that declares ``reports_draft_q``): its drafted tokens follow
  the q it reported for them (a failure names the cause in the world's law verdicts);
- ``forced_no_forbidden_token``, ``forced_no_crash``, ``forced_greedy``: generations with every
  draw forced to a boundary value (``exactcheck.e2e.forced_draws``);
- ``draft_reuse`` (a generator that drafts in another vocabulary, on the tokenizer worlds
  ``toy_models.tokenizer_worlds``): the same draft used again after a sampled call, and a second
  draft sharing the tokenizers (``exactcheck.e2e.draft_reuse``).

A generator's declared ``capabilities`` make the checks of a world or policy it cannot take "not
applicable" (reported, not run, no alpha spent).

A generator that declares itself lossy (``lossy = True``, e.g. ``assistant_ensemble_weight`` in
(0, 1)) is audited the same way; its sequence verdicts say "lossy by design" and carry the
measured TV with its interval, the price of the mode.
"""
from __future__ import annotations

import dataclasses

from exactcheck.audit_run import AuditRun
from exactcheck.core import not_run_verdict, resolve_device, run_environment
from exactcheck.generation.drive import drive_generator, drive_generator_sharded
from exactcheck.e2e.forced_draws import forced_draw_verdicts
from exactcheck.e2e.draft_reuse import draft_reuse_verdict
from exactcheck.contracts.generator import (SAMPLING, DecodingPolicy, capabilities_of, generator_name, is_lossy,
                                      takes_different_tokenizers)
from exactcheck.e2e.plan import plan_generator_audit, world_policies
from exactcheck.generation.verdicts import policy_suffix
from exactcheck.generation.verdicts import (draft_q_verdict, generation_law_verdicts, greedy_verdict, name_causes,
                                    rollback_verdict, validity_verdict)
from exactcheck.errors import SubjectError, UsageError
from exactcheck.executors import Executor, LocalExecutor, one_torch_thread
from exactcheck.options import AuditOptions, CheckKind, derive_seed
from exactcheck.subject_call import call_time_limit
from exactcheck.e2e.result import GeneratorAuditResult
from exactcheck.e2e.reproduce import generator_audit_line

__all__ = ["run_generator_audit"]


def run_generator_audit(generator, *, subject_name: str | None = None, options: AuditOptions | None = None,
                        policies: tuple[DecodingPolicy, ...] = (SAMPLING,), greedy: bool = True,
                        progress: bool = True, executor: Executor | None = None,
                        **settings) -> GeneratorAuditResult:
    """Audit an end-to-end generator on the model worlds; see the module docstring.
    ``options`` (an ``AuditOptions``) or its fields as keywords (``level``, ``seed``, ``alpha``,
    ``worlds``, ``generations``, ``require``); ``plan_generator_audit`` decides what runs.
    ``subject_name`` is how the ``exactcheck e2e`` command names it (a built-in name or
    MODULE:CALLABLE); given, reproduce lines are commands.

    ``shards`` = N > 1 (or an ``executor``) splits each run's generations into N ranges run on
    ``executor`` (this process by default, or Ray tasks, each building its own copy of the world's
    models); every generation keeps its seed, so the verdicts are the unsharded audit's."""
    options = AuditOptions.of(options, settings)
    # this audit's calls (a hang trips it once), on one torch thread: the worlds are toy models
    with call_time_limit(options.call_timeout), one_torch_thread():
        return _run_generator_audit(generator, options, subject_name, policies, greedy, progress, executor)


def _run_generator_audit(generator, options: AuditOptions, subject_name, policies, greedy, progress,
                         executor) -> GeneratorAuditResult:
    audit = _GeneratorRun(generator, options, subject_name, policies, greedy, progress, executor)
    with audit.run.interruptible():
        for world in audit.worlds:
            audit.drive_world(world)
    return audit.finish()


class _GeneratorRun:
    """One generator audit: its plan (the worlds, each world's sampled policies, the checks the
    generator cannot have), where the generations run (``shards``, ``executor``), and the run."""

    def __init__(self, generator, options: AuditOptions, subject_name, policies, greedy, progress, executor):
        self.device = device = resolve_device(options.device)
        # the report and reproduce lines name the device as torch does
        self.options = options = dataclasses.replace(options, device=str(device))
        if not callable(generator):
            raise UsageError(f"generator ({generator!r}) is not callable")
        self.generator, self.subject_name, self.policies, self.greedy = generator, subject_name, policies, greedy
        self.capabilities = capabilities_of(generator)
        self.plan = plan = plan_generator_audit(options, policies, greedy, self.capabilities,
                                                takes_different_tokenizers(generator))
        self.not_applicable = dict(plan.not_applicable)
        self.seed, self.budget, self.n = options.seed, plan.budget, options.generations_per_world
        self.worlds = list(plan.worlds)
        self.name = name = generator_name(generator)
        self.lossy = name if is_lossy(generator) else None
        sampled = {name for name, _ in plan.samples}  # the world and policy runs some law of the plan judges
        self.runs = {w.name: tuple(p for p in world_policies(w, policies)
                                   if f"{w.name}{policy_suffix(p, w)}" in sampled)
                     for w in self.worlds}
        self.stated = () if tuple(policies) == (SAMPLING,) else tuple(policies)
        # the checks a generator cannot have (not applicable) are reported as such, never as "not run"
        self.run = run = AuditRun([c for c in plan.checks if c.name not in self.not_applicable], self.budget,
                                  self.seed, self.reproduce_in, progress=progress)
        run.planned = self.n * sum(len(v) for v in self.runs.values())
        self.shards, self.executor = options.shards, executor
        if options.jobs > 1:  # --jobs N: each run's generations in N worker processes, every one with its seed
            if executor is not None:
                raise UsageError("--jobs runs the generations in worker processes; give --jobs or an executor, "
                                 "not both")
            self.executor, self.shards = run.executor(options.jobs), max(self.shards, options.jobs)
        self.bar = run.bar(run.planned, unit="generation", desc="exactcheck: generations")

    def reproduce_in(self, world_name: str) -> str:
        return generator_audit_line(self.options, self.subject_name or self.name, world_name, self.stated,
                                    self.greedy, by_command=self.subject_name is not None)

    def drive_world(self, world) -> None:
        """A world's sampled runs (one per policy) and their verdicts, then greedy identity, draft
        reuse and the forced draws (not for a world the generator cannot be driven on)."""
        run, bar, generator, device = self.run, self.bar, self.generator, self.device
        world_seed = derive_seed(self.seed, world.name)
        base = dict(world=world.name, seed=world_seed, reproduce=self.reproduce_in(world.name))
        for policy in self.runs[world.name]:
            self.sample(world, policy, world_seed, base)
        if f"{world.name}/forced_no_crash" in self.not_applicable:
            return
        if self.greedy:
            bar.step(f"{world.name}/greedy_identity", 0)
            run.add(greedy_verdict(generator, world, world_seed, base, self.lossy, device))
        if any(v.world == world.name and v.kind is CheckKind.CONTRACT for v in run.pending):
            return  # its contract verdict stands for the checks of a world it cannot be driven on
        if f"{world.name}/draft_reuse" in self.plan.names:
            bar.step(f"{world.name}/draft_reuse", 0)
            run.add(draft_reuse_verdict(generator, world, world_seed, base, device, self.capabilities))
        bar.step(f"{world.name}/forced_draws", 0)
        run.extend(forced_draw_verdicts(generator, world, self.policies, derive_seed(world_seed, "forced"), base,
                                        device, self.capabilities))

    def sample(self, world, policy, world_seed: int, base: dict) -> None:
        """One policy's generations on a world and the verdicts on them (or the crash that stopped them)."""
        run, n, budget, capabilities = self.run, self.n, self.budget, self.capabilities
        suffix = policy_suffix(policy, world)
        label = f"{world.name}/sampling{suffix}"
        try:
            run_seed = derive_seed(world_seed, "sampling" + suffix)
            if self.shards > 1 or self.executor is not None:
                samples = drive_generator_sharded(self.generator, world, n, run_seed, policy,
                                                  self.executor or LocalExecutor(), self.shards, self.options.device,
                                                  progress=lambda k, label=label: self.bar.step(label, k))
            else:
                samples = drive_generator(self.generator, world, n, run_seed, policy, device=self.device,
                                          progress=lambda k, label=label: self.bar.step(label, k))
        except SubjectError as exc:
            run.crashed(exc, world=world.name, seed=world_seed, samples=n, condition="every generation")
            return
        run.drawn += samples.size
        run.extend(v for v in generation_law_verdicts(samples, budget.first_share, budget.alpha, base, self.lossy)
                   if v.check not in self.not_applicable)  # (a text-law-only generator's token laws)
        if capabilities is not None and capabilities.reports_draft_q:
            run.add(draft_q_verdict(samples, base, suffix))
        if world.validate is not None:
            run.add(validity_verdict(samples, base))
        if policy is world_policies(world, self.policies)[0]:
            run.add(rollback_verdict(samples, base, capabilities))

    def finish(self) -> GeneratorAuditResult:
        """The not-applicable checks reported as such; Holm over the plan's statistical checks."""
        run, plan, seed = self.run, self.plan, self.seed
        reached = {v.check for v in run.pending}
        run.extend(not_run_verdict(c, derive_seed(seed, c.world), self.reproduce_in(c.world),
                                   self.not_applicable[c.name])
                   for c in plan.checks if c.name in self.not_applicable and c.name not in reached)
        return run.finish(GeneratorAuditResult, decide=name_causes, order=plan.checks,
                          subject=self.name + (" [lossy by design]" if self.lossy else ""),
                          level=self.options.level.value, seed=seed, alpha=self.budget.alpha,
                          device=self.options.device, environment=run_environment(), require=self.options.require)
