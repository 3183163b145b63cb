"""The plans of the end-to-end audits (``exactcheck.options.AuditPlan``): a generator through the
toy model worlds (``plan_generator_audit``), greedy identity on a real model pair
(``plan_greedy_audit``) and a generator under a real grammar mask (``plan_grammar_audit``).
The generation laws are fixed-budget tests: Holm gets all of alpha over the plan's statistical
checks.
"""
from __future__ import annotations

from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA, AlphaBudget, AuditOptions, AuditPlan, Check, CheckKind
from exactcheck.e2e.forced_draws import FORCED_CHECKS
from exactcheck.contracts.generator import Capabilities
from exactcheck.contracts.policy import SAMPLING, DecodingPolicy, greedy_variant
from exactcheck.generation.verdicts import policy_suffix
from toy_models.hf_toy_lm import ModelWorld
from toy_models.suite import all_model_worlds

__all__ = [ "plan_generator_audit", "plan_greedy_audit", "plan_grammar_audit",
           "planned_generator_checks", "GRAMMAR_WORLD", "TEXT_ONLY_MISSING"]

GRAMMAR_WORLD = "smollm2-json"
# why a text-law-only generator's laws over target token sequences are not judged
TEXT_ONLY_MISSING = ("law over target token sequences (it declares text_law_only: the law of its decoded text, "
                     "WORLD/text, judges it)")


def world_policies(world: ModelWorld, policies) -> tuple[DecodingPolicy, ...]:
    """The policies ``world`` is generated under: its own, or the audit's (with penalties, bound to
    the world's prompt, which their history reads)."""
    return (world.policy,) if world.policy is not None else tuple(p.for_prompt(world.prompt) for p in policies)


def plan_generator_audit(options: AuditOptions, policies=None, greedy: bool = True,
                         capabilities: Capabilities | None = None, different_tokenizers: bool = False) -> AuditPlan:
    """Per model world and policy, the law of whole outputs, its first-token marginal, the stop
    position (with stop tokens) and the world's own marginals, and with ``reports_draft_q`` whether
    the drafts follow their q; validity on grammar worlds; cache rollback once per world; greedy
    identity; the forced-draw properties (``exactcheck.e2e.forced_draws``). With the generator's
    declared ``capabilities``, the checks of a world or policy it cannot take are planned as not
    applicable (``AuditPlan.not_applicable``) and spend none of alpha. ``different_tokenizers``
    (the generator drafts in another vocabulary): the tokenizer worlds, each with its
    ``draft_reuse`` check (``exactcheck.e2e.draft_reuse``)."""
    policies = tuple(policies) if policies else (SAMPLING,)
    worlds = all_model_worlds(different_tokenizers)
    if options.worlds:
        unknown = set(options.worlds) - {w.name for w in worlds}
        if unknown:
            raise UsageError(f"unknown model world(s) {sorted(unknown)}; known: {[w.name for w in worlds]}")
        worlds = [w for w in worlds if w.name in options.worlds]
    n = options.generations_per_world
    checks, samples, skipped = [], [], []

    def add(check: Check, missing: str | None) -> None:
        checks.append(check)
        if missing:
            skipped.append((check.name, f"not applicable: the generator declares no {missing}"))

    for world in worlds:
        world_missing = None
        for i, policy in enumerate(world_policies(world, policies)):
            suffix = policy_suffix(policy, world)
            missing = capabilities.missing_for(policy) if capabilities is not None else None
            if world.policy is not None and capabilities is not None:  # what its greedy and forced checks run under
                world_missing = world_missing or capabilities.missing_for(greedy_variant(world.policy))
            token_laws = ["sequence", "first_token"] + (["stop_position"] if policy.stop_tokens else [])
            marginals = [name for name, _, _ in world.marginals]
            text_only = capabilities is not None and capabilities.text_law_only and "text" in marginals
            for law in token_laws + marginals:
                add(Check(f"{world.name}/{law}{suffix}", CheckKind.GENERATOR_LAW, world.name, law + suffix),
                    missing or (TEXT_ONLY_MISSING if text_only and law in token_laws else None))
            if capabilities is not None and capabilities.reports_draft_q:
                add(Check(f"{world.name}/draft_follows_q{suffix}", CheckKind.GENERATOR_LAW, world.name,
                          "draft_follows_q" + suffix), missing)
            if world.validate is not None:
                add(Check(f"{world.name}/valid_outputs", CheckKind.VALIDITY, world.name, "valid_outputs"), missing)
            if i == 0:
                add(Check(f"{world.name}/cache_rollback", CheckKind.CACHE_INVARIANT, world.name, "cache_rollback"),
                    missing)
            if not missing:
                samples.append((f"{world.name}{suffix}", n))
        if greedy:
            add(Check(f"{world.name}/greedy_identity", CheckKind.GREEDY_IDENTITY, world.name, "greedy_identity"),
                world_missing)
        if different_tokenizers:
            add(Check(f"{world.name}/draft_reuse", CheckKind.PROPERTY, world.name, "draft_reuse"), world_missing)
        for name in FORCED_CHECKS:
            add(Check(f"{world.name}/{name}", CheckKind.PROPERTY, world.name, name), world_missing)
    skipped_names = {name for name, _ in skipped}
    m = sum(c.kind.statistical and c.name not in skipped_names for c in checks)
    return AuditPlan(options, tuple(checks), AlphaBudget(options.alpha, m, stop_early=False), tuple(samples),
                     worlds=tuple(worlds), not_applicable=tuple(skipped))


def planned_generator_checks(worlds: list[str] | None = None, policies=(SAMPLING,), greedy: bool = True,
                             capabilities: Capabilities | None = None, different_tokenizers: bool = False) -> list[str]:
    """The names of the checks an end-to-end audit with these options reports, in order. A world
    where the generator crashes or breaks its contract is reported by one ``WORLD/contract``
    verdict per policy in place of its laws."""
    return plan_generator_audit(AuditOptions.build(worlds=worlds), policies, greedy, capabilities,
                                different_tokenizers).names


def plan_greedy_audit(model: str) -> AuditPlan:
    """``exactcheck greedy``: greedy identity and the final target cache on a real model pair
    (deterministic checks only: no alpha is spent)."""
    checks = (Check(f"{model}/greedy_identity", CheckKind.GREEDY_IDENTITY, model, "greedy_identity"),
              Check(f"{model}/final_cache", CheckKind.CACHE_INVARIANT, model, "final_cache"))
    return AuditPlan(AuditOptions.build(), checks, AlphaBudget(DEFAULT_ALPHA, 0, stop_early=False))


def plan_grammar_audit(alpha: float = DEFAULT_ALPHA) -> AuditPlan:
    """``exactcheck grammar``: masked greedy identity, validity of every output, and two
    chain-rule tests of the sampled outputs under Holm at ``alpha``. A generator that fails some
    sampled generations also gets a ``WORLD/contract`` verdict after these."""
    w = GRAMMAR_WORLD
    checks = (Check(f"{w}/greedy_identity", CheckKind.GREEDY_IDENTITY, w, "greedy_identity"),
              Check(f"{w}/valid_outputs", CheckKind.VALIDITY, w, "valid_outputs"),
              Check(f"{w}/pit_target_order", CheckKind.CHAIN_RULE, w, "pit_target_order"),
              Check(f"{w}/surprisal", CheckKind.CHAIN_RULE, w, "surprisal"))
    return AuditPlan(AuditOptions.build(alpha=alpha), checks, AlphaBudget(alpha, 2, stop_early=False))
