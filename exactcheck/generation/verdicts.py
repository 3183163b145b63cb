"""The verdicts of an end-to-end audit, one function per kind of check: the generation laws of a
run (``generation_law_verdicts``), validity on a grammar world, cache rollback, and greedy
identity. The runner (``exactcheck.e2e.runner``) decides when each is made;
``exactcheck.core.apply_holm`` decides the statistical ones.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from exactcheck.core import sample_law_verdict
from exactcheck.generation.drive import GeneratorSamples
from exactcheck.contracts.generator import draft_length_support
from exactcheck.generation.greedy_identity import greedy_identity
from exactcheck.contracts.policy import SAMPLING, DecodingPolicy, greedy_variant
from exactcheck.options import CheckKind, derive_seed
from exactcheck.reachability import observed_in
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, Verdict
from exactcheck.stats.laws import LawPlan
from exactcheck.generation.laws import policy_sequence_law
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["policy_suffix", "generation_law_verdicts", "validity_verdict", "rollback_verdict", "greedy_verdict", "draft_q_verdict",
           "name_causes", "DRAFT_Q_CAUSE", "GREEDY_PROMPTS",
           "GREEDY_DRAFT_LENGTHS", "GREEDY_NEW_TOKENS"]

# greedy identity: prompts x draft lengths, new tokens per run
GREEDY_PROMPTS = 6
GREEDY_DRAFT_LENGTHS = tuple(range(1, 9))
GREEDY_NEW_TOKENS = 8


def policy_suffix(policy: DecodingPolicy, world: ModelWorld | None = None) -> str:
    """Check-name suffix of a policy: none for plain sampling or the world's own policy."""
    if policy == SAMPLING or (world is not None and policy is world.policy):
        return ""
    return "_" + policy.label()


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
    greedily = _decoded_greedily(run, law)
    verdicts = []
    for name, condition, expected, index_, label in laws:
        counts = np.bincount(index_, minlength=expected.size).astype(np.int64)
        plan = LawPlan(name + suffix, condition, expected, label)
        verdicts.append(sample_law_verdict(plan, counts, share, alpha, dict(base, world=run.world.name),
                                           CheckKind.GENERATOR_LAW, "generations", greedily, lossy))
    return verdicts


def _decoded_greedily(run: GeneratorSamples, law: dict) -> str | None:
    """Under a sampled policy whose law is not a point mass: "decoded greedily: ..." when every
    output is the policy's greedy path (each token the argmax of the policy's scores), else None.
    Only words: the test decides the verdict."""
    policy = run.policy
    if policy.greedy or run.size < 2 or len(set(run.outputs)) != 1:
        return None
    greedy_law = policy_sequence_law(run.world.world, greedy_variant(policy),
                                     run.world.new_tokens)
    path = max(greedy_law, key=greedy_law.get)
    probability = law.get(path, 0.0)
    if run.outputs[0] != path or probability >= 1.0:
        return None
    return (f"decoded greedily: all {run.size:,} generations are the greedy path {list(path)} (its probability "
            f"under {policy.describe()} is {probability:.4f}): the sampling settings were not applied")


DRAFT_Q_CAUSE = ("draft tokens do not follow the reported q: the drafter samples from another law than the q it "
                 "reports and verifies with (q from logits before a transform, or an argmax or top-k draft "
                 "reported with its full softmax: transformers #32867, #47932), so the verification is lossy")


def draft_q_verdict(run: GeneratorSamples, base: dict, suffix: str) -> Verdict:
    """Whether the generator's reported drafts follow the q it reported for them: a
    Kolmogorov-Smirnov test of their randomised PITs against U(0, 1) (statistical, through Holm),
    or a deterministic finding when a draft has probability 0 under its own q."""
    from scipy import stats
    name = run.world.name
    common = dict(base, check=f"{name}/draft_follows_q{suffix}", law="draft_follows_q" + suffix,
                  kind=CheckKind.GENERATOR_LAW)
    d = run.drafts
    if d is None or d.count == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=0, condition="the drafts of every generation",
                       summary=("not judged: the generator declares reports_draft_q but returned no drafts "
                                "(Generation.drafts)"), evidence=LawEvidence(Evidence.NONE), **common)
    condition = f"{d.count:,} drafts of {d.generations:,} generations, {run.policy.describe()}"
    share = f"{d.argmax / d.count:.1%} were their q's most likely token (exact {d.argmax_expected / d.count:.1%})"
    if d.impossible:
        return Verdict(outcome=Outcome.EXACT, samples=d.count, condition=condition, summary=(
            f"{DRAFT_Q_CAUSE}: {d.impossible:,} drafts have probability 0 under their own q; {share}"),
            evidence=LawEvidence(Evidence.DETERMINISTIC, pvalue=0.0, reachability=observed_in(
                d.impossible, d.count, "drafts of probability 0 under their own q:")), **common)
    u = np.asarray(d.pits)
    ks = stats.kstest(u, "uniform")
    return Verdict(outcome=Outcome.EXACT, samples=d.count, condition=condition, summary=(
        f"PIT of each draft in its q (descending order): mean {u.mean():.4f} (exact 0.5), KS D {ks.statistic:.4f}, "
        f"p = {ks.pvalue:.3g}; {share}"), evidence=LawEvidence(
        Evidence.FIXED_BUDGET, statistic=float(ks.statistic), statistic_name="Kolmogorov-Smirnov D",
        pvalue=float(ks.pvalue)), **common)


def validity_verdict(run: GeneratorSamples, base: dict) -> Verdict:
    """Every output of a grammar world must be valid (deterministic: spends none of alpha)."""
    invalid = [o for o in run.outputs if not run.world.validate(o)]
    common = dict(base, check=f"{run.world.name}/valid_outputs", law="valid_outputs", samples=run.size,
                  condition=run.world.validity,
                  kind=CheckKind.VALIDITY)
    if invalid:
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{len(invalid):,} of {run.size:,} outputs are invalid; first: {list(invalid[0])}"),
            evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(len(invalid), run.size, "invalid outputs:")),
            **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0),
                   summary=f"{run.size:,} of {run.size:,} outputs valid", **common)


def rollback_verdict(run: GeneratorSamples, base: dict, capabilities=None) -> Verdict:
    name = run.world.name
    common = dict(base, check=f"{name}/cache_rollback", law="cache_rollback", samples=run.size,
                  condition=f"{run.forward_calls:,} forward calls, {run.final_caches_checked:,} final caches",
                  kind=CheckKind.CACHE_INVARIANT)
    if run.breaches:
        kinds = sorted({b.invariant for _, b in run.breaches})
        generations = len({i for i, _ in run.breaches})
        first_i, first = run.breaches[0]
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{len(run.breaches):,} breach{'es' * (len(run.breaches) != 1)} ({', '.join(kinds)}) in {generations:,} "
            f"of {run.size:,} "
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
    declared = None if capabilities is None else capabilities.cache
    if not run.keeps_cache:
        if declared:
            return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
                f"not judged: the generator declares a cache, but each of its {run.forward_calls:,} forward calls "
                "started from an empty one and it handed none back"), **common)
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not applicable: the generator {'declares no cache and keeps none' if declared is False else 'keeps no cache'} "
            f"(each of its {run.forward_calls:,} forward calls recomputed its prefix from an empty cache); the laws "
            "decide"), **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        "every forward call saw the committed prefix with contiguous positions"
        + (", and every final cache matched a fresh recompute" if run.final_caches_checked else "")), **common)


def greedy_verdict(generator, world: ModelWorld, seed: int, base: dict, lossy: str | None,
                    device: torch.device) -> Verdict:
    target, draft = (m.to(device) for m in world.models())
    prompts = [torch.tensor(prompt_for_state(world.world, len(world.prompt), derive_seed(seed, f"prompt/{i}"))[0])
               for i in range(GREEDY_PROMPTS)]
    support = draft_length_support(generator)
    lengths = GREEDY_DRAFT_LENGTHS if support else (None,)
    policy = greedy_variant(world.policy)
    new_tokens = GREEDY_NEW_TOKENS if world.policy is None else world.new_tokens
    result = greedy_identity(generator, target, draft, prompts, lengths, new_tokens, seed, world.vocab_size,
                             policy=policy, keywords=world.generator_keywords())
    swept = {"field": "draft lengths 1..8 (its draft_length field)",
             "keyword": "draft lengths 1..8 (passed as draft_length=)",
             None: "its own draft length (it takes no draft_length keyword or field)"}[support]
    condition = f"{len(prompts)} prompts x {swept}, {new_tokens} new tokens, {policy.describe()}"
    return result.verdict(f"{world.name}/greedy_identity", condition, lossy, **base)


def name_causes(verdicts: list[Verdict]) -> list[Verdict]:
    """After Holm: a world whose ``draft_follows_q`` failed gets that cause named in its failed
    law verdicts (the TV on the output laws is its effect), and the failed check itself leads with
    the cause."""
    failed_q = {v.world for v in verdicts if v.law.startswith("draft_follows_q") and v.outcome.failed}
    out = []
    for v in verdicts:
        if v.world in failed_q and v.outcome.failed:
            if v.law.startswith("draft_follows_q"):
                if not v.summary.startswith(DRAFT_Q_CAUSE):
                    v = dataclasses.replace(v, summary=f"{DRAFT_Q_CAUSE}; {v.summary}")
            elif v.kind is CheckKind.GENERATOR_LAW:
                v = dataclasses.replace(v, summary=f"{v.summary}; likely cause: draft tokens do not follow the "
                                                   f"reported q (see {v.world}/draft_follows_q)")
        out.append(v)
    return out
