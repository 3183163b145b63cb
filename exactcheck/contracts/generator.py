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

**Draft length.** A generator takes the draft length from the audit in one of two ways: a
``draft_length`` keyword parameter of its ``__call__`` (``generator(..., seed, draft_length=k)``),
or a ``draft_length`` dataclass field (the built-in adapters: the audit ``dataclasses.replace``s
it; transformers' adapters map it to ``num_assistant_tokens``). ``draft_length_support`` says which;
a generator with neither runs at its own setting, and the report says so.

**Capabilities.** ``capabilities`` (optional): a ``Capabilities``, or a collection of its field
names meaning "exactly these", saying what the generator supports (grammar masks, stop tokens,
sampling transforms, batching, a cache, reporting its draft q). A world or check it declares it
cannot take is reported "not applicable: the generator declares no ...", not run; undeclared means
"everything", as before.

**Reported draft q.** A ``Generation`` may carry ``drafts``: one ``DraftRecord`` per drafted
token, the token and the row q it was (said to be) drawn from; the audit then checks that the
tokens follow the rows (``draft_follows_q``), which names a drafter whose q is not the law it sampled
from.

**Two vocabularies.** A generator that declares ``different_tokenizers = True`` drafts with a
model whose vocabulary is not the target's. It is audited on the tokenizer worlds
(``toy_models.tokenizer_worlds``) and every call gets two more keyword arguments,
``target_tokenizer`` and ``draft_tokenizer`` (transformers ``PreTrainedTokenizerFast`` objects);
prompts and outputs are target ids, and the law judged is the target's law of target token
sequences (non-canonical spellings included: plain target sampling produces them), and beside it
the law of the text they spell (``text``); a string-level algorithm that claims only the latter
declares ``Capabilities(text_law_only=True)``.

``lossy`` (True for a mode that targets another law on purpose, such as transformers'
``assistant_ensemble_weight``): the audit then reports its measured TV as the price of the mode
instead of calling it exact.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from exactcheck.errors import ContractViolation, UsageError, Violation
from exactcheck.contracts.policy import GREEDY, SAMPLING, DecodingPolicy
from exactcheck.subject_call import SnapshotInputs, call_subject

__all__ = ["DecodingPolicy", "GREEDY", "SAMPLING", "Generator", "BatchedGenerator", "Generation", "DraftRecord",
           "Capabilities", "capabilities_of", "call_generator", "call_generator_batch", "validated", "is_batched",
           "with_draft_length", "draft_length_support", "is_lossy", "takes_different_tokenizers", "generator_name"]


@dataclass(frozen=True)
class DraftRecord:
    """One drafted token and the law ``q`` ([V], any float dtype) the drafter reports it was drawn
    from: the row the generator verified it with."""

    token: int
    q: torch.Tensor


@dataclass
class Generation:
    """What a generator may return instead of bare ids: the ids, its final caches (compared with a
    fresh recompute on the final sequence) and, optionally, every drafted token with the q it was
    verified with (``drafts``, in drafting order)."""

    sequences: torch.Tensor
    target_cache: Any = None
    draft_cache: Any = None
    drafts: tuple[DraftRecord, ...] | list | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a generator declares it supports. ``grammar_masks``: a policy's per-prefix mask of
    allowed tokens (``DecodingPolicy.mask``); ``stop_tokens``: ending at a stop token;
    ``sampling_transforms``: top-k, top-p, min-p, logit bias and banned tokens; ``batching``: the
    batched contract (``generate_batch``; False drives a batched generator one request at a time);
    ``cache``: it keeps a KV cache (False: cache rollback is not applicable without looking; None:
    not said, the probe decides); ``reports_draft_q``: its ``Generation.drafts`` carries the q of
    every drafted token; ``greedy_only``: it decodes greedily only (its sampled laws are not
    applicable); ``text_law_only``: it claims only the law of its decoded text, as a string-level
    algorithm may (on a world with a ``text`` law, the laws over target token sequences are then
    not applicable and the text law judges it)."""

    grammar_masks: bool = True
    stop_tokens: bool = True
    sampling_transforms: bool = True
    batching: bool = True
    cache: bool | None = None
    reports_draft_q: bool = False
    greedy_only: bool = False
    text_law_only: bool = False
    # the penalty conventions it applies (``DecodingPolicy.penalty_convention``; None: any)
    penalty_conventions: tuple[str, ...] | None = None

    @classmethod
    def of(cls, declared) -> "Capabilities":
        """A ``Capabilities`` from what a generator declares: one, or field names ("exactly these")."""
        if isinstance(declared, Capabilities):
            return declared
        if isinstance(declared, str) or not hasattr(declared, "__iter__"):
            raise TypeError(f"capabilities must be a Capabilities or a collection of its field names, "
                            f"got {declared!r}")
        names = set(declared)
        known = {f.name for f in dataclasses.fields(cls) if f.type in ("bool", "bool | None")}
        if names - known:
            raise TypeError(f"unknown capabilities {sorted(names - known)}; known: {sorted(known)}")
        return cls(**{name: name in names for name in known})

    def missing_for(self, policy: DecodingPolicy) -> str | None:
        """What this generator lacks to take ``policy`` ("grammar masks", ...), or None."""
        if not policy.greedy and self.greedy_only:
            return "sampling (it declares greedy decoding only)"
        if policy.mask is not None and not self.grammar_masks:
            return "grammar masks"
        if policy.stop_tokens and not self.stop_tokens:
            return "stop tokens"
        if policy.transformed and not self.sampling_transforms:
            return "sampling transforms (top-k, top-p, min-p, logit bias, bans, penalties)"
        if policy.penalized and self.penalty_conventions is not None \
                and policy.penalty_convention not in self.penalty_conventions:
            return (f"{policy.penalty_convention}'s penalty convention (it applies "
                    f"{' or '.join(self.penalty_conventions)}'s)")
        return None


def capabilities_of(generator) -> Capabilities | None:
    """The generator's declared ``Capabilities``, or None when it declares none."""
    declared = getattr(generator, "capabilities", None)
    if declared is None:
        return None
    try:
        return Capabilities.of(declared)
    except TypeError as exc:  # the user's declaration: one line, exit 2
        raise UsageError(f"{generator_name(generator)}: {exc}") from None


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


def takes_different_tokenizers(generator) -> bool:
    """Whether ``generator`` drafts in another vocabulary (``different_tokenizers = True``)."""
    return bool(getattr(generator, "different_tokenizers", False))


def is_lossy(generator) -> bool:
    return bool(getattr(generator, "lossy", False))


def draft_length_support(generator) -> str | None:
    """How ``generator`` takes a draft length: "field" (a ``draft_length`` dataclass field),
    "keyword" (a ``draft_length`` parameter of its call), or None (it runs at its own setting)."""
    if dataclasses.is_dataclass(generator) and any(f.name == "draft_length" for f in dataclasses.fields(generator)):
        return "field"
    try:
        parameters = inspect.signature(generator).parameters
    except (TypeError, ValueError):
        return None
    takes = parameters.get("draft_length")
    if takes is not None and takes.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        return "keyword"
    return None


def with_draft_length(generator, draft_length: int):
    """``generator`` drafting ``draft_length`` tokens per step: its field replaced, or a call that
    passes ``draft_length=`` (``draft_length_support``)."""
    support = draft_length_support(generator)
    if support == "field":
        return dataclasses.replace(generator, draft_length=draft_length)
    if support == "keyword":
        return _WithDraftLength(generator, draft_length)
    raise TypeError(f"{generator_name(generator)} takes no draft length (no draft_length field or keyword)")


@dataclass(frozen=True)
class _WithDraftLength:
    """A generator called with ``draft_length=`` fixed; batched calls pass it too."""

    generator: Any
    draft_length: int

    @property
    def name(self) -> str:
        return generator_name(self.generator)

    def __getattr__(self, item):  # capabilities, lossy, max_batch ... are the generator's
        if item in ("generator", "draft_length"):
            raise AttributeError(item)
        value = getattr(self.generator, item)
        if item == "generate_batch":
            return functools.partial(value, draft_length=self.draft_length)
        return value

    def __call__(self, *args, **keywords):
        return self.generator(*args, draft_length=self.draft_length, **keywords)


def call_generator(generator: Generator, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy,
                   max_new_tokens: int, seed: int, vocab_size: int,
                   stop_tokens: tuple[int, ...] | None = None,
                   keywords: dict | None = None) -> tuple[torch.Tensor, Generation]:
    """Run the generator once and validate what it returns: (new tokens [n] int64, Generation).
    Stop tokens (default: the policy's) end the output: it must stop right after the first.
    ``keywords``: the world's extra arguments (``ModelWorld.generator_keywords``: a tokenizer
    world's two tokenizers)."""
    guard = SnapshotInputs(("input_ids", input_ids))
    out = call_subject(generator, target, draft, *guard.copies, policy, max_new_tokens, seed, **(keywords or {}))
    guard.check()
    return validated(out, input_ids[0], policy, max_new_tokens, vocab_size, stop_tokens)


def is_batched(generator) -> bool:
    """Whether ``generator`` takes the batched contract (a ``generate_batch`` method), unless its
    capabilities say ``batching=False``."""
    capabilities = capabilities_of(generator)
    return callable(getattr(generator, "generate_batch", None)) and (capabilities is None or capabilities.batching)


def call_generator_batch(generator: "BatchedGenerator", target, draft, prompts: list[torch.Tensor],
                         policy: DecodingPolicy, max_new_tokens: int, seeds: list[int], vocab_size: int,
                         stop_tokens: tuple[int, ...] | None = None,
                         keywords: dict | None = None) -> list[tuple[torch.Tensor, Generation]]:
    """One ``generate_batch`` call for ``prompts`` (each [P_i]) with one seed each; every answer
    validated as ``call_generator`` validates one. A wrong count of answers is a contract
    violation; so is any one invalid answer (the whole call fails, as one request would)."""
    guard = SnapshotInputs(*((f"prompts[{i}]", p) for i, p in enumerate(prompts)))
    outs = call_subject(generator.generate_batch, target, draft, list(guard.copies), policy, max_new_tokens,
                        list(seeds), **(keywords or {}))
    guard.check()
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
