"""Subjects by name: ``MODULE:CALLABLE`` (the current directory importable, a class instantiated
with no arguments), the built-in generators (``exactcheck.options.BUILTIN_GENERATORS``) and the
loop mutants (``loop-mutant:NAME``). Below the registry (``exactcheck.audit_kinds``, which offers them
to the front ends): a kind's own loader (the tree verifiers by name) may use them."""
from __future__ import annotations

import importlib
import os
import sys

from exactcheck.errors import UsageError

__all__ = ["load_subject", "load_generator", "builtin_generators", "loop_mutants"]


def load_subject(path: str):
    """Import ``MODULE:CALLABLE`` (the current directory is importable). A class is
    instantiated with no arguments."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        raise UsageError(f"unknown subject {path!r}: not a built-in name (see `exactcheck list`) nor "
                         f"MODULE:CALLABLE")
    if not module_name or not attr:
        raise UsageError(f"subject ({path!r}) must look like MODULE:CALLABLE (or a built-in name: see `exactcheck list`)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # SystemExit at import time included: a usage error, not the end
        raise UsageError(f"cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, type):
        obj = obj()
    if not callable(obj):
        raise UsageError(f"{path} is not callable")
    return obj


def load_generator(name: str):
    """A built-in generator by name, a loop mutant (``loop-mutant:NAME``) or MODULE:CALLABLE."""
    builtin = builtin_generators()
    if name in builtin:
        generator = builtin[name]
        if getattr(generator, "ensemble_weight", None) is not None:
            from exactcheck.adapters.transformers_compat import require_ensemble_weight
            try:
                require_ensemble_weight()
            except ImportError as e:
                raise UsageError(f"{name}: {e}") from None
        return generator
    if name.startswith("loop-mutant:"):
        wanted = name.split(":", 1)[1]
        for m in loop_mutants():
            if m.name == f"mutant: {wanted}":
                return m
        raise UsageError(f"unknown loop mutant {wanted!r}; known: "
                         f"{[m.name.split(': ')[1] for m in loop_mutants()]}")
    return load_subject(name)


def loop_mutants() -> tuple:
    """Every end-to-end loop mutant (``loop-mutant:NAME``): the one-vocabulary loop's, the
    penalties' (found under a policy with penalties: ``--policy repetition_penalty=...``), then the
    two-vocabulary loops' (TLI and SLEM, SLRS)."""
    from exactcheck.e2e.loop import LOOP_MUTANTS
    from exactcheck.e2e.penalty_mutants import PENALTY_MUTANTS
    from exactcheck.e2e.string_rejection import SLRS_MUTANTS
    from exactcheck.e2e.two_vocab_loop import TWO_VOCAB_MUTANTS
    return (*LOOP_MUTANTS, *PENALTY_MUTANTS.values(), *TWO_VOCAB_MUTANTS, *SLRS_MUTANTS)


def builtin_generators() -> dict:
    """Name -> generator, for ``BUILTIN_GENERATORS`` (imports transformers)."""
    from exactcheck.adapters.hf_generate import AssistedDifferentTokenizers, AssistedGeneration, PromptLookup
    from exactcheck.e2e.batched_loop import BatchedReferenceLoop
    from exactcheck.e2e.loop import ReferenceSpeculativeLoop
    from exactcheck.e2e.string_rejection import StringLevelRejectionSampling
    from exactcheck.e2e.two_vocab_loop import StringLevelExactMatch, TokenLevelIntersection
    return {"reference-loop": ReferenceSpeculativeLoop(), "batched-reference-loop": BatchedReferenceLoop(),
            "transformers-assisted": AssistedGeneration(),
            "transformers-prompt-lookup": PromptLookup(),
            "transformers-ensemble-0.9": AssistedGeneration(ensemble_weight=0.9),
            "reference-tli": TokenLevelIntersection(), "reference-slem": StringLevelExactMatch(),
            "reference-slrs": StringLevelRejectionSampling(),
            "transformers-assisted-universal": AssistedDifferentTokenizers(),
            "transformers-assisted-different-tokenizers": AssistedDifferentTokenizers(greedy_only=True)}
