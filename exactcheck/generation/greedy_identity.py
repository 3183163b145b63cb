"""Greedy identity: speculative greedy output must equal the target's own greedy decode.

The expected output is computed by exactcheck, not by the subject: a plain incremental greedy
decode of the target with a fresh cache that is only appended to (no draft, no rollback, so no
rollback bug can hide in it). The subject runs with the ``GREEDY`` policy at each draft length of a sweep.

At the first position where the two differ, the divergence is classified. Both sequences share
the prefix before it, so the target's logits there are recomputed once in float32 (the top-2
margin: how close the decision was) and once with a float64 copy of the model:

- ``numerical tie``: in float64 the subject's token is within ``tie_tolerance`` logits of the
  expected one (or is itself the float64 argmax): batch shape, cache layout or kernel choice can
  flip such a decision, and it says nothing about the speculative algorithm (vLLM #7627,
  TRT-LLM #8285, transformers #39421);
- ``defect``: the expected token leads by more than the tolerance in float64, so the subject
  emitted a token that the target's greedy policy does not choose.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from exactcheck.errors import SubjectCrashed, SubjectError
from exactcheck.contracts.generator import (GREEDY, call_generator, call_generator_batch, generator_name, is_batched,
                                      with_draft_length)
from exactcheck.reachability import observed_in
from exactcheck.options import CheckKind
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict

__all__ = ["Divergence", "GreedyIdentityResult", "target_greedy", "greedy_identity", "classify_divergence",
           "TIE_TOLERANCE"]

# float64 logit gap under which two tokens count as tied: a float32 forward of a small model
# moves logits by ~1e-5 relative; 1e-3 absolute leaves a wide margin over that.
TIE_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Divergence:
    prompt: int  # index of the prompt
    draft_length: int | None
    position: int  # index among the new tokens
    expected: int  # the target's greedy token
    got: int  # the subject's token
    margin32: float  # float32 logit of the top token minus the second (at the shared prefix)
    gap64: float  # float64 logit of `expected` minus that of `got`
    classification: str  # "numerical tie" or "defect"

    def describe(self) -> str:
        return (f"prompt {self.prompt}, draft length {self.draft_length}: new token {self.position} is "
                f"{self.got}, target's greedy token {self.expected} (float32 top-2 margin "
                f"{self.margin32:.3g}, float64 gap {self.gap64:.3g}): {self.classification}")


@dataclass(frozen=True)
class GreedyIdentityResult:
    runs: int
    identical: int
    divergences: tuple[Divergence, ...]
    failures: tuple[str, ...]  # contract violations or crashes, described
    tokens: int  # new tokens compared
    first_failure_crashed: bool = False  # the first failure was a crash (else a contract violation)

    @property
    def defects(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if d.classification == "defect")

    @property
    def ties(self) -> tuple[Divergence, ...]:
        return tuple(d for d in self.divergences if d.classification == "numerical tie")

    def verdict(self, check: str, condition: str, lossy: str | None = None, **base) -> Verdict:
        """The deterministic verdict of this sweep (spends none of alpha): a failed run (crash or
        contract violation) first, then divergences classified as defects; numerical ties are
        reported in a passing verdict."""
        common = dict(base, check=check, law="greedy_identity", condition=condition, samples=self.runs,
                      kind=CheckKind.GREEDY_IDENTITY)
        if self.failures:
            return Verdict(outcome=Outcome.CRASHED if self.first_failure_crashed else Outcome.CONTRACT_VIOLATION,
                           summary=(f"{len(self.failures)} run{'s' * (len(self.failures) != 1)} failed; first: "
                                    f"{self.failures[0]}"),
                           evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(
                               len(self.failures), self.runs, "greedy runs that failed:")), **common)
        if self.defects:
            return Verdict(outcome=Outcome.DEFECT, summary=(
                (f"lossy by design ({lossy}): " if lossy else "")
                + f"{len(self.defects)} of {self.runs} runs diverge from the target's greedy decode; "
                + "; ".join(d.describe() for d in self.defects[:3])),
                evidence=FindingEvidence(pvalue=0.0, reachability=observed_in(
                    len(self.defects), self.runs, "greedy runs that diverge:")), **common)
        ties = ("; numerical ties: " + "; ".join(d.describe() for d in self.ties)) if self.ties else ""
        return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
            f"{self.identical} of {self.runs} runs identical to the target's greedy decode "
            f"({self.tokens:,} tokens){ties}"), **common)


def _logits(model, prefix: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=prefix[None].to(model.device), use_cache=False)
    return out.logits[0, -1]


def target_greedy(target, prompt: torch.Tensor, max_new_tokens: int, policy=GREEDY) -> list[int]:
    """The target's greedy continuation of ``prompt`` ([P] ids) under ``policy`` (temperature 0,
    its bias, bans, mask and stop tokens): a plain incremental decode with a fresh cache that is
    only ever appended to (no rollback, so no rollback bug can reach it)."""
    from exactcheck.contracts.transformers_compat import forward, new_cache
    cache, out = new_cache(), []
    feed = prompt[None].to(target.device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = forward(target, feed, cache, use_cache=True).logits[0, -1]
            token = int(policy.probabilities(logits[None], [tuple(out)]).argmax())
            out.append(token)
            if token in policy.stop_tokens:
                break
            feed = torch.tensor([[token]], device=target.device)
    return out


def classify_divergence(target, target64, prompt_length: int, prefix, expected: int, got: int, policy,
                        tie_tolerance: float = TIE_TOLERANCE) -> tuple[float, float, str]:
    """(float32 top-2 margin, float64 gap, classification) at ``prefix`` under ``policy``'s
    greedy scores (bias, bans and mask applied)."""
    generated = [tuple(prefix[prompt_length:].tolist())]
    s32 = policy.scores(_logits(target, prefix)[None], generated)[0]
    top = s32.topk(2).values
    margin32 = float(top[0] - top[1])
    s64 = policy.scores(_logits(target64, prefix).double()[None], generated)[0]
    gap64 = float(s64[expected] - s64[got])
    if s64[got] == -float("inf"):  # the policy forbids the subject's token: never a tie
        return margin32, gap64, "defect"
    tie = gap64 <= tie_tolerance or int(s64.argmax()) == got
    return margin32, gap64, "numerical tie" if tie else "defect"


def greedy_identity(generator, target, draft, prompts: list[torch.Tensor], draft_lengths, max_new_tokens: int,
                    seed: int = 0, vocab_size: int | None = None, tie_tolerance: float = TIE_TOLERANCE,
                    progress=None, pairs=None, on_generation=None, policy=GREEDY,
                    keywords: dict | None = None) -> GreedyIdentityResult:
    """Run ``generator`` greedily on each prompt at each draft length (or on the given
    ``pairs`` of (prompt index, draft length)) and compare with ``target_greedy``. A draft
    length of ``None`` runs the generator at its own setting. ``on_generation(prompt index,
    draft length, new tokens, Generation)`` sees every successful run (for cache checks).
    ``keywords``: the world's extra arguments to every call (a tokenizer world's tokenizers)."""
    vocab_size = vocab_size or target.config.vocab_size
    prompts = [p.to(target.device) for p in prompts]  # the generator gets ids on the model's device
    pairs = pairs or [(i, k) for i in range(len(prompts)) for k in draft_lengths]
    expected = {}
    target64 = None
    runs = identical = tokens = 0
    divergences, failures = [], []
    crashed = False
    batched = _batched_answers(generator, target, draft, prompts, pairs, policy, max_new_tokens, seed, vocab_size,
                               keywords)
    for index, (i, k) in enumerate(pairs):
        prompt = prompts[i]
        if i not in expected:
            expected[i] = target_greedy(target, prompt, max_new_tokens, policy)
        subject = generator if k is None else with_draft_length(generator, k)
        runs += 1
        try:
            if batched is not None:
                answer = batched[index]
                if isinstance(answer, SubjectError):
                    raise answer
                got, generation = answer
            else:
                got, generation = call_generator(subject, target, draft, prompt[None], policy, max_new_tokens,
                                                 seed, vocab_size, keywords=keywords)
        except SubjectError as exc:
            crashed = crashed if failures else isinstance(exc, SubjectCrashed)
            failures.append(f"prompt {i}, draft length {k}: {exc}")
            continue
        if on_generation is not None:
            on_generation(i, k, got, generation)
        got = got.tolist()
        tokens += len(got)
        if got == expected[i]:
            identical += 1
        else:
            j = next(t for t in range(min(len(got), len(expected[i]))) if got[t] != expected[i][t])
            if target64 is None:
                target64 = copy.deepcopy(target).double()
            prefix = torch.cat([prompt, torch.tensor(expected[i][:j], dtype=prompt.dtype, device=prompt.device)])
            margin, gap, kind = classify_divergence(target, target64, prompt.numel(), prefix, expected[i][j], got[j],
                                                    policy, tie_tolerance)
            divergences.append(Divergence(i, k, j, expected[i][j], got[j], margin, gap, kind))
        if progress is not None:
            progress(index + 1, len(pairs), generator_name(generator))
    return GreedyIdentityResult(runs, identical, tuple(divergences), tuple(failures), tokens, crashed)


def _batched_answers(generator, target, draft, prompts, pairs, policy, max_new_tokens: int, seed: int,
                     vocab_size: int, keywords: dict | None = None) -> list | None:
    """For a batched generator: every pair's answer, one ``generate_batch`` call per draft
    length over its prompts (a failed call fails each of its pairs); None for a batch-1 one."""
    if not is_batched(generator):
        return None
    answers: list = [None] * len(pairs)
    for k in dict.fromkeys(k for _, k in pairs):
        chosen = [j for j, (_, length) in enumerate(pairs) if length == k]
        subject = generator if k is None else with_draft_length(generator, k)
        try:
            got = call_generator_batch(subject, target, draft, [prompts[pairs[j][0]] for j in chosen], policy,
                                       max_new_tokens, [seed] * len(chosen), vocab_size, keywords=keywords)
        except SubjectError as exc:
            got = [exc] * len(chosen)
        for j, answer in zip(chosen, got):
            answers[j] = answer
    return answers
