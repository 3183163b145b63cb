"""The end-to-end audit of a generator: sequence laws, cache rollback and greedy identity.

For every model world (``toy_models.hf_toy_lm.model_worlds``):

- ``sequence``: ``n`` sampled generations (the level's count) against the world's exact float64
  law of the first ``length`` tokens under the policy (pooled Pearson; Holm over all sequence
  checks at alpha; an impossible sequence is a deterministic finding);
- ``cache_rollback``: the invariants of ``exactcheck.e2e.cache_invariants`` on every forward call of
  those generations, and any final cache the generator hands back (deterministic: an exact
  generator never breaks them, so a breach spends none of alpha);
- ``greedy_identity``: greedy generations from several prompts at draft lengths 1..8 equal the
  target's own greedy decode (``exactcheck.e2e.greedy_identity``); a divergence that float64 shows
  to be a numerical tie is reported, not failed.

A generator that declares itself lossy (``lossy = True``, e.g. ``assistant_ensemble_weight`` in
(0, 1)) is audited the same way; its sequence verdicts say "lossy by design" and carry the
measured TV with its interval, the price of the mode.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import platform
import time

import numpy as np
import torch

from exactcheck import __version__
from exactcheck.report.result import GeneratorAuditResult
from exactcheck.audit import (STATISTIC_NAME, unreached_verdicts, _apply_holm, _evidence, _failure_verdict,
                              keep_plots_where_needed, plot_cells, resolve_device)
from exactcheck.plan import AuditOptions, derive_seed, plan_generator_audit
from exactcheck.errors import SubjectError, UsageError
from exactcheck.e2e.generator import GREEDY, SAMPLING, DecodingPolicy, generator_name, is_lossy
from exactcheck.e2e.drive import GeneratorSamples, drive_generator, drive_generator_sharded
from exactcheck.executors import Executor, LocalExecutor
from exactcheck.e2e.greedy_identity import greedy_identity
from exactcheck.stats.laws import LawComparison, LawPlan, policy_sequence_law
from exactcheck.progress import Progress
from exactcheck.reachability import observed_in
from exactcheck.stats.goodness_of_fit import goodness_of_fit, tv_certificate
from exactcheck.report.verdict import Evidence, Outcome, Verdict
from toy_models.hf_toy_lm import ModelWorld, model_worlds, prompt_for_state

__all__ = ["run_generator_audit", "planned_generator_checks", "GREEDY_PROMPTS", "GREEDY_DRAFT_LENGTHS",
           "GREEDY_NEW_TOKENS"]

# Sampled generations per world and level (about 8 ms each through transformers' generate).
GREEDY_PROMPTS = 6
GREEDY_DRAFT_LENGTHS = tuple(range(1, 9))
GREEDY_NEW_TOKENS = 8


def policy_suffix(policy: DecodingPolicy, world: ModelWorld | None = None) -> str:
    """Check-name suffix of a policy: none for plain sampling or the world's own policy."""
    if policy == SAMPLING or (world is not None and policy is world.policy):
        return ""
    return "_" + policy.label()


def _law_verdicts(run: GeneratorSamples, share: float, alpha: float, base: dict, lossy: str | None) -> list[Verdict]:
    """The law of whole outputs (up to ``length`` tokens or a stop token), its first-token
    marginal (few cells, so its TV is measured tightly: the figure a lossy mode is priced by),
    and with stop tokens the law of the output length (where the stop falls). Expected laws are
    enumerated exactly from the world under the policy (``laws.policy_sequence_law``); an output
    outside their support lands in an "other" cell of probability 0."""
    world, policy = run.world.world, run.policy
    law = policy_sequence_law(world, policy, run.world.new_tokens)
    outcomes = sorted(law)
    index = {o: i for i, o in enumerate(outcomes)}
    observed = np.array([index.get(o, len(outcomes)) for o in run.outputs], dtype=np.int64)
    expected = np.array([law[o] for o in outcomes] + [0.0])
    vocab, length = world.vocab_size, run.world.new_tokens
    first = np.zeros(vocab + 1)
    for o, prob in law.items():
        first[o[0]] += prob
    first_observed = np.array([o[0] if o else vocab for o in run.outputs], dtype=np.int64)
    describe = policy.describe()
    laws = [
        ("sequence", f"whole outputs (at most {length} tokens), {describe}", expected, observed,
         lambda i: str(list(outcomes[i])) if i < len(outcomes) else "any other output"),
        ("first_token", f"first generated token, {describe}", first, first_observed,
         lambda i: f"token {i}" if i < vocab else "no token"),
    ]
    if policy.stop_tokens:
        lengths = np.zeros(length + 1)
        for o, prob in law.items():
            lengths[len(o)] += prob
        laws.append(("stop_position", f"number of tokens up to and including the stop token, {describe}", lengths,
                     np.array([len(o) for o in run.outputs], dtype=np.int64),
                     lambda j: f"{j} tokens"))
    for name, description, cell in run.world.marginals:
        marginal: dict = {}
        for o, prob in law.items():
            marginal[cell(o)] = marginal.get(cell(o), 0.0) + prob
        cells = sorted(marginal, key=str)
        position = {c: i for i, c in enumerate(cells)}
        laws.append((name, f"{description}, {describe}", np.array([marginal[c] for c in cells] + [0.0]),
                     np.array([position.get(cell(o), len(cells)) for o in run.outputs], dtype=np.int64),
                     lambda i, cells=cells: str(cells[i]) if i < len(cells) else "any other"))
    suffix = policy_suffix(policy, run.world)
    verdicts = []
    for name, condition, expected, index_, label in laws:
        counts = np.bincount(index_, minlength=expected.size).astype(np.int64)
        plan = LawPlan(name + suffix, condition, expected, label)
        gof = goodness_of_fit(counts, expected, share)
        if gof.impossible:
            summary = f"{gof.impossible:,} generations fell on outcomes of exact probability 0"
        else:
            summary = f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}"
        if lossy:
            low, high = gof.tv_interval
            summary = (f"lossy by design ({lossy}): TV {gof.tv_estimate:.4f}, 95% interval {low:.4f} to "
                       f"{high:.4f}; p = {gof.pvalue:.3g}")
        verdicts.append(Verdict(
            outcome=Outcome.EXACT, summary=summary, statistic=None if gof.impossible else gof.statistic,
            statistic_name=STATISTIC_NAME, df=gof.df, pvalue=gof.pvalue,
            evidence_kind=Evidence.DETERMINISTIC if gof.impossible else Evidence.FIXED_BUDGET,
            tv_certificate=tv_certificate(counts, expected, alpha),
            check=f"{run.world.name}/{plan.law}", law=plan.law, condition=condition, samples=gof.samples,
            tv_estimate=gof.tv_estimate, tv_interval=gof.tv_interval, detectable_tv=gof.detectable_tv,
            evidence=_evidence(LawComparison(plan, counts), gof.samples),
            law_cells=plot_cells(LawComparison(plan, counts), gof.samples),
            reachability=observed_in(gof.impossible, gof.samples, "generations on outcomes of exact probability 0:")
            if gof.impossible else None, **base))
    return verdicts


def _validity_verdict(run: GeneratorSamples, base: dict) -> Verdict:
    """Every output of a grammar world must be valid (deterministic: spends none of alpha)."""
    invalid = [o for o in run.outputs if not run.world.validate(o)]
    common = dict(base, check=f"{run.world.name}/valid_outputs", law="valid_outputs", samples=run.size,
                  condition="every output parses as JSON of the schema and ends with the stop token")
    if invalid:
        return Verdict(outcome=Outcome.DEFECT, pvalue=0.0, summary=(
            f"{len(invalid):,} of {run.size:,} outputs are invalid; first: {list(invalid[0])}"),
            reachability=observed_in(len(invalid), run.size, "invalid outputs:"), **common)
    return Verdict(outcome=Outcome.EXACT, pvalue=1.0, summary=f"{run.size:,} of {run.size:,} outputs valid",
                   **common)


def _rollback_verdict(run: GeneratorSamples, base: dict) -> Verdict:
    name = run.world.name
    common = dict(base, check=f"{name}/cache_rollback", law="cache_rollback", samples=run.size,
                  condition=f"{run.forward_calls:,} forward calls, {run.final_caches_checked:,} final caches")
    if run.breaches:
        kinds = sorted({b.invariant for _, b in run.breaches})
        generations = len({i for i, _ in run.breaches})
        first_i, first = run.breaches[0]
        return Verdict(outcome=Outcome.DEFECT, pvalue=0.0, summary=(
            f"{len(run.breaches):,} breaches ({', '.join(kinds)}) in {generations:,} of {run.size:,} "
            f"generations; first, in generation {first_i}: {first.describe()}"),
            reachability=observed_in(generations, run.size, "generations with a breach:"), **common)
    if run.forward_calls == 0 and run.final_caches_checked == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            "the generator made no forward call on the probe models and returned no cache"), **common)
    if run.batched and run.cached_calls:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not checked: the generator was driven through the batched contract, where one forward call "
            f"serves many generations ({run.final_caches_checked:,} final caches compared"
            + (", all matched" if run.final_caches_checked else "") + "); audit its cache through __call__"
            " (batch-1) to check rollback"), **common)
    if not run.keeps_cache:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not applicable: the generator keeps no cache (each of its {run.forward_calls:,} forward "
            "calls recomputed its prefix from an empty cache); the laws decide"), **common)
    return Verdict(outcome=Outcome.EXACT, pvalue=1.0, summary=(
        "every forward call saw the committed prefix with contiguous positions"
        + (", and every final cache matched a fresh recompute" if run.final_caches_checked else "")), **common)


def _greedy_verdict(generator, world: ModelWorld, seed: int, base: dict, lossy: str | None,
                    device: str = "cpu") -> Verdict:
    target, draft = (m.to(device) for m in world.models())
    prompts = [torch.tensor(prompt_for_state(world.world, len(world.prompt), derive_seed(seed, f"prompt/{i}"))[0])
               for i in range(GREEDY_PROMPTS)]
    has_length = hasattr(generator, "draft_length")
    lengths = GREEDY_DRAFT_LENGTHS if has_length else (None,)
    policy = GREEDY if world.policy is None else dataclasses.replace(world.policy, temperature=0.0)
    new_tokens = GREEDY_NEW_TOKENS if world.policy is None else world.new_tokens
    result = greedy_identity(generator, target, draft, prompts, lengths, new_tokens, seed, world.vocab_size,
                             policy=policy)
    condition = (f"{len(prompts)} prompts x draft lengths {'1..8' if has_length else '(its own)'}, "
                 f"{new_tokens} new tokens, {policy.describe()}")
    return result.verdict(f"{world.name}/greedy_identity", condition, lossy, **base)


def _policy_settings(policies: tuple[DecodingPolicy, ...], greedy: bool) -> tuple[tuple[tuple[str, str], ...], bool]:
    """(command-line flag, Python keyword) pairs that state ``policies`` and ``greedy`` in a
    reproduce line, and whether the command line can state them at all."""
    extra, stateable = [], True
    if tuple(policies) != (SAMPLING,):
        specs = [policy.spec() for policy in policies]
        stateable = all(specs)
        extra.append((" ".join(f"--policy {spec}" for spec in specs if spec),
                      f"policies=[{', '.join(policy.code() for policy in policies)}]"))
    if not greedy:
        extra.append(("--no-greedy", "greedy=False"))
    return tuple(extra), stateable


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
    resolve_device(options.device)
    if not callable(generator):
        raise UsageError(f"generator ({generator!r}) is not callable")
    plan = plan_generator_audit(options, policies, greedy)
    level, seed, budget = options.level, options.seed, plan.budget
    n = level.generations if options.generations is None else int(options.generations)
    chosen = list(plan.worlds)
    name = generator_name(generator)
    lossy = generator_name(generator) if is_lossy(generator) else None
    world_policies = {w.name: ((w.policy,) if w.policy is not None else tuple(policies)) for w in chosen}
    share = budget.first_share
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    bar = Progress(n * sum(len(world_policies[w.name]) for w in chosen), unit="generation",
                   desc="exactcheck: generations", enabled=progress)
    pending: list[Verdict] = []
    drawn = 0
    interrupted = False  # Ctrl-C: report what was generated, marked incomplete

    extra, stateable = _policy_settings(policies, greedy)

    def reproduce_in(world_name: str) -> str:
        return options.reproduce(subject_name or name, world_name, "e2e", extra=extra,
                                 importable=subject_name is not None and stateable)

    try:
        for world in chosen:
            world_seed = derive_seed(seed, world.name)
            base = dict(world=world.name, seed=world_seed, reproduce=reproduce_in(world.name))
            for policy in world_policies[world.name]:
                suffix = policy_suffix(policy, world)
                label = f"{world.name}/sampling{suffix}"
                try:
                    run_seed = derive_seed(world_seed, "sampling" + suffix)
                    if options.shards > 1 or executor is not None:
                        run = drive_generator_sharded(generator, world, n, run_seed, policy, executor or LocalExecutor(),
                                                      options.shards, options.device,
                                                      progress=lambda k, label=label: bar.step(label, k))
                    else:
                        run = drive_generator(generator, world, n, run_seed, policy, device=options.device,
                                              progress=lambda k, label=label: bar.step(label, k))
                except SubjectError as exc:
                    pending.append(_failure_verdict(exc, world=world.name, seed=world_seed, reproduce=base["reproduce"],
                                                    samples=n, condition="every generation"))
                    continue
                drawn += run.size
                pending.extend(_law_verdicts(run, share, budget.alpha, base, lossy))
                if world.validate is not None:
                    pending.append(_validity_verdict(run, base))
                if policy is world_policies[world.name][0]:
                    pending.append(_rollback_verdict(run, base))
            if greedy:
                bar.step(f"{world.name}/greedy_identity", 0)
                pending.append(_greedy_verdict(generator, world, world_seed, base, lossy, options.device))
    except KeyboardInterrupt:
        interrupted = True
        pending += unreached_verdicts(plan, pending, seed, reproduce_in)
    bar.close()
    verdicts = keep_plots_where_needed(_apply_holm(pending, budget))
    environment = {"exactcheck": __version__, "torch": torch.__version__, "python": platform.python_version(),
                   "numpy": np.__version__, "machine": platform.machine()}
    try:
        import transformers
        environment["transformers"] = transformers.__version__
    except ImportError:  # the toy worlds need it; kept for symmetry with the step audit
        pass
    return GeneratorAuditResult(subject=name + (" [lossy by design]" if lossy else ""), level=level.value, seed=seed,
                       alpha=budget.alpha, device=options.device, verdicts=tuple(verdicts), started=started,
                       duration_s=time.perf_counter() - clock, environment=environment,
                       samples_planned=n * sum(len(v) for v in world_policies.values()), samples_drawn=drawn,
                       require=options.require, interrupted=interrupted)


def all_model_worlds() -> list[ModelWorld]:
    """The toy model worlds, then the grammar world (generated under its own policy)."""
    from toy_models.grammar import grammar_world
    return [*model_worlds(), grammar_world()]


def planned_generator_checks(worlds: list[str] | None = None, policies: tuple[DecodingPolicy, ...] = (SAMPLING,),
                             greedy: bool = True) -> list[str]:
    """The names of the checks ``run_generator_audit`` with these options reports, in order
    (``plan_generator_audit(...).names``). A world where the generator crashes or breaks its
    contract is reported by one ``WORLD/contract`` verdict per policy in place of its laws."""
    return plan_generator_audit(AuditOptions.build(worlds=worlds), policies, greedy).names
