"""``draft_reuse``: a two-vocabulary generator keeps working when its draft object is used again.

A generator that drafts in another vocabulary may set up a translation between the vocabularies
once and cache it, or change the draft model in place (transformers' universal speculative
decoding prunes the assistant's LM head and wraps its input embedding, and caches the translator
per tokenizer pair: ``AssistantVocabTranslatorCache``). Users do both things this check does, in
one process:

1. a sampled call, then greedy calls **with the same draft object** (greedy identity against the
   target's own greedy decode);
2. greedy calls, then sampled calls, **with a second draft model sharing the tokenizers** (a fresh
   copy of the same weights: what reloading an assistant gives).

Deterministic (no alpha): a crash, a broken contract or a greedy divergence is a finding, with
the scenario and the subject's message; every run of the scenario counts toward its reachability.
A greedy-only generator (``Capabilities.greedy_only``) gets the greedy halves alone.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.generator import SAMPLING, Capabilities, call_generator
from exactcheck.generation.greedy_identity import greedy_identity
from exactcheck.contracts.policy import greedy_variant
from exactcheck.errors import SubjectCrashed, SubjectError
from exactcheck.options import CheckKind, derive_seed
from exactcheck.reachability import observed_in
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["draft_reuse_verdict", "REUSE_PROMPTS", "REUSE_SAMPLED_CALLS"]

REUSE_PROMPTS = 3
REUSE_SAMPLED_CALLS = 4


def draft_reuse_verdict(generator, world: ModelWorld, seed: int, base: dict, device,
                        capabilities: Capabilities | None = None) -> Verdict:
    samples = capabilities is None or not capabilities.greedy_only
    sampled = world.policy if world.policy is not None else SAMPLING
    greedy = greedy_variant(world.policy)
    target, draft = (m.to(device) for m in world.models())
    keywords = world.generator_keywords()
    prompts = [torch.tensor(prompt_for_state(world.world, len(world.prompt), derive_seed(seed, f"reuse/{i}"))[0],
                            device=target.device) for i in range(REUSE_PROMPTS)]
    runs, failures, divergences, crashed = 0, [], [], False

    def sample_calls(model, scenario: str) -> None:
        nonlocal runs, crashed
        for j in range(REUSE_SAMPLED_CALLS):
            runs += 1
            try:
                call_generator(generator, target, model, prompts[j % len(prompts)][None], sampled, world.new_tokens,
                               derive_seed(seed, f"reuse/sampled/{scenario}/{j}"), world.vocab_size, keywords=keywords)
            except SubjectError as exc:
                crashed = crashed or isinstance(exc, SubjectCrashed)
                failures.append((scenario, f"sampled call {j}: {exc}"))

    def greedy_calls(model, scenario: str) -> None:
        nonlocal runs, crashed
        result = greedy_identity(generator, target, model, prompts, (None,), world.new_tokens, seed, world.vocab_size,
                                 policy=greedy, keywords=keywords)
        runs += result.runs
        crashed = crashed or (result.first_failure_crashed and not failures)
        failures.extend((scenario, f) for f in result.failures)
        divergences.extend(f"{scenario}: {d.describe()}" for d in result.defects)

    if samples:
        sample_calls(draft, "sampled with a fresh draft")
        greedy_calls(draft, "greedy with the same draft after a sampled call")
    second = world.models()[1].to(device)
    greedy_calls(second, "greedy with a second draft sharing the tokenizers")
    if samples:
        sample_calls(second, "sampled with a second draft sharing the tokenizers")
    condition = (f"{REUSE_PROMPTS} prompts: " + ("sampled then greedy calls with one draft; " if samples else "")
                 + "greedy " + ("then sampled " if samples else "") + "calls with a second draft sharing the tokenizers")
    common = dict(base, check=f"{world.name}/draft_reuse", law="draft_reuse", condition=condition, samples=runs,
                  kind=CheckKind.PROPERTY)
    if failures:
        scenarios: dict[str, int] = {}
        for scenario, _ in failures:
            scenarios[scenario] = scenarios.get(scenario, 0) + 1
        where = "; ".join(f"{scenario}: {count}" for scenario, count in scenarios.items())
        return Verdict(outcome=Outcome.CRASHED if crashed else Outcome.CONTRACT_VIOLATION,
                       summary=(f"{len(failures)} of {runs} runs failed ({where}); first: {failures[0][0]}, "
                                f"{failures[0][1]}"),
                       evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(
                           len(failures), runs, "runs that failed:")), **common)
    if divergences:
        return Verdict(outcome=Outcome.DEFECT,
                       summary=(f"{len(divergences)} greedy runs diverge from the target's greedy decode when the draft "
                                f"is used again; " + "; ".join(divergences[:3])),
                       evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(
                           len(divergences), runs, "greedy runs that diverge:")), **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        f"all {runs} runs succeeded and every greedy run matched the target's greedy decode with the draft used "
        "again"), **common)
