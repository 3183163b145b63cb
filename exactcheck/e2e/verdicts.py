"""The verdicts of an end-to-end audit, one function per kind of check: the generation laws of a
run (``generation_law_verdicts``), validity on a grammar world, cache rollback, and greedy
identity. The runner (``exactcheck.e2e.runner``) decides when each is made;
``exactcheck.core.apply_holm`` decides the statistical ones.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from exactcheck.core import STATISTIC_NAME, deviating_cells, plot_cells
from exactcheck.e2e.drive import GeneratorSamples
from exactcheck.e2e.generator import GREEDY
from exactcheck.e2e.greedy_identity import greedy_identity
from exactcheck.e2e.plan import policy_suffix
from exactcheck.options import CheckKind, derive_seed
from exactcheck.reachability import observed_in
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, TotalVariation, Verdict
from exactcheck.stats.goodness_of_fit import goodness_of_fit, tv_certificate
from exactcheck.stats.laws import LawComparison, LawPlan, policy_sequence_law
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["generation_law_verdicts", "validity_verdict", "rollback_verdict", "greedy_verdict", "GREEDY_PROMPTS",
           "GREEDY_DRAFT_LENGTHS", "GREEDY_NEW_TOKENS"]

# greedy identity: prompts x draft lengths, new tokens per run
GREEDY_PROMPTS = 6
GREEDY_DRAFT_LENGTHS = tuple(range(1, 9))
GREEDY_NEW_TOKENS = 8


def generation_law_verdicts(run: GeneratorSamples, share: float, alpha: float, base: dict, lossy: str | None) -> list[Verdict]:
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
        comparison = LawComparison(plan, counts)
        verdicts.append(Verdict(
            outcome=Outcome.EXACT, summary=summary, check=f"{run.world.name}/{plan.law}", law=plan.law,
            condition=condition, samples=gof.samples, kind=CheckKind.GENERATOR_LAW, **base, evidence=LawEvidence(
                Evidence.DETERMINISTIC if gof.impossible else Evidence.FIXED_BUDGET,
                statistic=None if gof.impossible else gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
                pvalue=gof.pvalue, tv=TotalVariation(gof.tv_estimate, gof.tv_interval, gof.detectable_tv),
                certificate=tv_certificate(counts, expected, alpha),
                cells=deviating_cells(comparison, gof.samples), law_cells=plot_cells(comparison, gof.samples),
                reachability=observed_in(gof.impossible, gof.samples, "generations on outcomes of exact probability 0:")
                if gof.impossible else None)))
    return verdicts


def validity_verdict(run: GeneratorSamples, base: dict) -> Verdict:
    """Every output of a grammar world must be valid (deterministic: spends none of alpha)."""
    invalid = [o for o in run.outputs if not run.world.validate(o)]
    common = dict(base, check=f"{run.world.name}/valid_outputs", law="valid_outputs", samples=run.size,
                  condition="every output parses as JSON of the schema and ends with the stop token",
                  kind=CheckKind.VALIDITY)
    if invalid:
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{len(invalid):,} of {run.size:,} outputs are invalid; first: {list(invalid[0])}"),
            evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(len(invalid), run.size, "invalid outputs:")),
            **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0),
                   summary=f"{run.size:,} of {run.size:,} outputs valid", **common)


def rollback_verdict(run: GeneratorSamples, base: dict) -> Verdict:
    name = run.world.name
    common = dict(base, check=f"{name}/cache_rollback", law="cache_rollback", samples=run.size,
                  condition=f"{run.forward_calls:,} forward calls, {run.final_caches_checked:,} final caches",
                  kind=CheckKind.CACHE_INVARIANT)
    if run.breaches:
        kinds = sorted({b.invariant for _, b in run.breaches})
        generations = len({i for i, _ in run.breaches})
        first_i, first = run.breaches[0]
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{len(run.breaches):,} breaches ({', '.join(kinds)}) in {generations:,} of {run.size:,} "
            f"generations; first, in generation {first_i}: {first.describe()}"), evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(generations, run.size, "generations with a breach:")), **common)
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
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        "every forward call saw the committed prefix with contiguous positions"
        + (", and every final cache matched a fresh recompute" if run.final_caches_checked else "")), **common)


def greedy_verdict(generator, world: ModelWorld, seed: int, base: dict, lossy: str | None,
                    device: torch.device) -> Verdict:
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
