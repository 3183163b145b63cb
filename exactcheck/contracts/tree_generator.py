"""The tree-generator contract: a whole speculative tree loop over two cached models.

    generate(target, draft, prompt_ids: list[int], max_new_tokens: int, tree: TreeWorld,
             generator: torch.Generator) -> list[int]

``target`` and ``draft`` are cached tree models (``TreeModel``; the toy one is
``toy_models.tree_cache_lm.TreeCacheLM``), each handed over with an **empty** cache. The
generator drafts trees of ``tree``'s shape (``tree.topology``: ``tree.branching`` or the ragged
``tree.choices``, siblings drawn as ``tree.siblings`` says; or, for a dynamic world, EAGLE-2's
tree from the draft's own rows, ``tree.expansion``), verifies them with the target and returns exactly ``max_new_tokens``
new token ids in [0, V) (the prompt not included). ``generator`` is its only source of
randomness. A generator may carry ``name`` (how reports name it).

A ``TreeModel`` offers what a tree engine uses of a transformer with a KV cache:

* ``forward(input_ids [1, n], position_ids [1, n], tree_mask [n, cache_length + n] bool)
  -> logits [1, n, V]``: the inputs attend to the entries the mask allows (True = may attend;
  columns: the cache's entries, then the inputs) and join the cache;
* ``cache_length``; ``keep(indices)``: keep those cache entries in that order (compaction after
  an accept); ``crop(length)``.

The cache conventions of the reference loop (``exactcheck.tree.cached_loop``) are the ones the
invariants (``exactcheck.tree.cache_checks``) check: between rounds a model's cache holds the
committed sequence but its last token, at positions 0, 1, ...; the target scores a whole tree in
one forward whose inputs are the committed tokens it lacks, then the N candidates in
breadth-first order (``tree.topology``, or the round's dynamic tree: parents before children).

``call_tree_generator`` calls a subject and validates its answer: a list, tuple or 1-D tensor of
exactly ``max_new_tokens`` integer ids in [0, V); anything else is a ``ContractViolation``.
"""
from __future__ import annotations

from typing import Protocol

import torch

from exactcheck.errors import ContractViolation, Violation
from exactcheck.subject_call import call_subject

__all__ = ["TreeGenerator", "TreeModel", "call_tree_generator", "validate_generation"]


class TreeWorld(Protocol):
    """What a tree generator reads of the world it is handed (``toy_models.tree_worlds.TreeWorld`` is
    one): the tree's shape and how its siblings are drawn."""

    topology: object
    siblings: str
    vocab_size: int


class TreeModel(Protocol):
    cache_length: int

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor: ...

    def keep(self, indices) -> None: ...

    def crop(self, length: int) -> None: ...


class TreeGenerator(Protocol):
    def __call__(self, target: TreeModel, draft: TreeModel, prompt_ids: list[int], max_new_tokens: int,
                 tree: TreeWorld, generator: torch.Generator) -> list[int]: ...


def call_tree_generator(subject, target, draft, prompt_ids: list[int], max_new_tokens: int, tree: TreeWorld,
                        generator: torch.Generator) -> list[int]:
    """The subject's new tokens, validated (``ContractViolation`` otherwise; a crash is
    ``SubjectCrashed``)."""
    out = call_subject(subject, target, draft, list(prompt_ids), max_new_tokens, tree, generator)
    return validate_generation(out, max_new_tokens, tree.vocab_size)


def validate_generation(out, max_new_tokens: int, vocab: int) -> list[int]:
    """``out`` as a list of ints, or a ``ContractViolation`` naming what is wrong."""
    if isinstance(out, torch.Tensor):
        if out.dim() != 1:
            raise ContractViolation(Violation.WRONG_SHAPE, f"got a tensor of shape {tuple(out.shape)}; a tree "
                                                           f"generator returns the {max_new_tokens} new ids, 1-D")
        if out.dtype.is_floating_point or out.dtype.is_complex or out.dtype == torch.bool:
            raise ContractViolation(Violation.WRONG_DTYPE, f"got {out.dtype}; token ids are integers")
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise ContractViolation(Violation.NOT_A_TENSOR, f"got {type(out).__name__}; a tree generator returns a "
                                                        f"list of {max_new_tokens} int token ids")
    bad = [x for x in out if isinstance(x, bool) or not isinstance(x, int)]
    if bad:
        raise ContractViolation(Violation.WRONG_DTYPE, f"got {type(bad[0]).__name__} {bad[0]!r} among the ids; "
                                                       f"token ids are ints")
    if len(out) != max_new_tokens:
        raise ContractViolation(Violation.WRONG_LENGTH, f"got {len(out)} new tokens, asked for {max_new_tokens}")
    outside = [(i, x) for i, x in enumerate(out) if not 0 <= x < vocab]
    if outside:
        i, x = outside[0]
        raise ContractViolation(Violation.OUT_OF_VOCABULARY, f"new token {i} is {x}, V = {vocab}")
    return [int(x) for x in out]
