"""The end-to-end subject: a speculative generator and its contract.

A ``Generator`` is called as ``generator(target, draft, input_ids, policy, max_new_tokens, seed)``
where ``target`` and ``draft`` are model objects (transformers causal LMs here), ``input_ids`` is
a ``[1, P]`` prompt, ``policy`` the ``DecodingPolicy`` it must sample from, and ``seed`` the one
seed its randomness may come from. It returns the generated ids: ``[1, P + n]`` (prompt
included, as ``generate`` returns them), ``[n]`` (new tokens only), or a ``Generation`` when it
can also hand back its final caches. ``call_generator`` validates the answer and returns the
``n`` new tokens; anything else becomes a ``ContractViolation`` or ``SubjectCrashed`` with a
message that says what was wrong.

A generator that also has ``generate_batch`` takes the batched contract (``BatchedGenerator``):
one call for many prompts and seeds; the audit then drives it in batches.

A generator may carry two attributes: ``draft_length`` (a dataclass field, so checks can
``dataclasses.replace`` it to sweep draft lengths) and ``lossy`` (True for a mode that targets
another law on purpose, such as transformers' ``assistant_ensemble_weight``; the audit then
reports its measured TV as the price of the mode instead of calling it exact).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from exactcheck.errors import ContractViolation, SubjectCrashed, Violation
from exactcheck.e2e.policy import GREEDY, SAMPLING, DecodingPolicy

__all__ = ["DecodingPolicy", "GREEDY", "SAMPLING", "Generator", "BatchedGenerator", "Generation", "call_generator",
           "call_generator_batch", "validated", "is_batched", "with_draft_length", "is_lossy", "generator_name"]


@dataclass
class Generation:
    """What a generator may return instead of bare ids: the ids and its final caches (the caches
    are compared with a fresh recompute on the final sequence)."""

    sequences: torch.Tensor
    target_cache: Any = None
    draft_cache: Any = None


class Generator(Protocol):
    def __call__(self, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy,
                 max_new_tokens: int, seed: int) -> torch.Tensor | Generation: ...


class BatchedGenerator(Protocol):
    """The batched contract (what a serving engine does): one call generates for many prompts,
    request ``i`` from ``prompts[i]`` ([P_i] ids; prompts may differ in length) with its own
    ``seeds[i]``; the answer is one output per prompt, each in any form the batch-1 contract
    allows. The law of request ``i`` must depend on its prompt and seed alone, not on the other
    requests of the batch. A batched generator is also called batch-1 (``__call__``) where an
    audit needs one generation at a time; ``max_batch`` (optional) caps the requests per call."""

    def generate_batch(self, target, draft, prompts: list[torch.Tensor], policy: DecodingPolicy,
                       max_new_tokens: int, seeds: list[int]) -> list[torch.Tensor | Generation]: ...


def generator_name(generator) -> str:
    return getattr(generator, "name", None) or getattr(generator, "__name__", None) or type(generator).__name__


def is_lossy(generator) -> bool:
    return bool(getattr(generator, "lossy", False))


def with_draft_length(generator, draft_length: int):
    """``generator`` drafting ``draft_length`` tokens per step, when it has that setting."""
    if dataclasses.is_dataclass(generator) and any(f.name == "draft_length" for f in dataclasses.fields(generator)):
        return dataclasses.replace(generator, draft_length=draft_length)
    raise TypeError(f"{generator_name(generator)} has no draft_length field to sweep")


def call_generator(generator: Generator, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy,
                   max_new_tokens: int, seed: int, vocab_size: int,
                   stop_tokens: tuple[int, ...] | None = None) -> tuple[torch.Tensor, Generation]:
    """Run the generator once and validate what it returns: (new tokens [n] int64, Generation).
    Stop tokens (default: the policy's) end the output: it must stop right after the first."""
    try:
        out = generator(target, draft, input_ids, policy, max_new_tokens, seed)
    except Exception as exc:  # the subject's own failure becomes a verdict
        raise SubjectCrashed(exc) from exc
    return validated(out, input_ids[0], policy, max_new_tokens, vocab_size, stop_tokens)


def is_batched(generator) -> bool:
    """Whether ``generator`` takes the batched contract (a ``generate_batch`` method)."""
    return callable(getattr(generator, "generate_batch", None))


def call_generator_batch(generator: "BatchedGenerator", target, draft, prompts: list[torch.Tensor],
                         policy: DecodingPolicy, max_new_tokens: int, seeds: list[int], vocab_size: int,
                         stop_tokens: tuple[int, ...] | None = None) -> list[tuple[torch.Tensor, Generation]]:
    """One ``generate_batch`` call for ``prompts`` (each [P_i]) with one seed each; every answer
    validated as ``call_generator`` validates one. A wrong count of answers is a contract
    violation; so is any one invalid answer (the whole call fails, as one request would)."""
    try:
        outs = generator.generate_batch(target, draft, prompts, policy, max_new_tokens, seeds)
    except Exception as exc:
        raise SubjectCrashed(exc) from exc
    if not isinstance(outs, (list, tuple)) or len(outs) != len(prompts):
        got = f"{len(outs)} answers" if isinstance(outs, (list, tuple)) else type(outs).__name__
        raise ContractViolation(Violation.WRONG_SHAPE, f"generate_batch: {got} for {len(prompts)} prompts")
    return [validated(out, prompt, policy, max_new_tokens, vocab_size, stop_tokens)
            for out, prompt in zip(outs, prompts)]


def validated(out, prompt: torch.Tensor, policy: DecodingPolicy, max_new_tokens: int, vocab_size: int,
              stop_tokens: tuple[int, ...] | None = None) -> tuple[torch.Tensor, Generation]:
    """(new tokens [n] int64, Generation) of one answer to the prompt ``prompt`` [P], or a
    ``ContractViolation`` saying what is wrong with it."""
    stop_tokens = policy.stop_tokens if stop_tokens is None else stop_tokens
    generation = out if isinstance(out, Generation) else Generation(out)
    ids = generation.sequences
    if not isinstance(ids, torch.Tensor):
        raise ContractViolation(Violation.NOT_A_TENSOR, f"got {type(ids).__name__}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ContractViolation(Violation.WRONG_DTYPE, f"got {ids.dtype}")
    ids = ids.detach().to("cpu", torch.int64)
    prompt = prompt.detach().to("cpu", torch.int64).reshape(-1)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ContractViolation(Violation.WRONG_SHAPE, f"got {tuple(ids.shape)} for one prompt")
        if ids.shape[1] < prompt.numel() or not torch.equal(ids[0, :prompt.numel()], prompt):
            raise ContractViolation(Violation.PROMPT_CHANGED,
                                    f"prompt {prompt.tolist()}, output starts {ids[0, :prompt.numel()].tolist()}")
        new = ids[0, prompt.numel():]
    elif ids.dim() == 1:
        new = ids
    else:
        raise ContractViolation(Violation.WRONG_SHAPE, f"got {tuple(ids.shape)}")
    bad = (new < 0) | (new >= vocab_size)
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ContractViolation(Violation.OUT_OF_VOCABULARY, f"new token {i} is {int(new[i])}, V = {vocab_size}")
    stops = [i for i, x in enumerate(new.tolist()) if x in stop_tokens]
    expected = stops[0] + 1 if stops else max_new_tokens
    if new.numel() != expected:
        raise ContractViolation(Violation.WRONG_LENGTH, (
            f"{new.numel()} new tokens; expected {expected} "
            + (f"(up to and including the first stop token, {new[stops[0]]} at {stops[0]}: nothing may "
               "follow it)" if stops else f"(max_new_tokens={max_new_tokens})")))
    return new, generation
