"""The generators by name: the built-in ones (``exactcheck.options.BUILTIN_GENERATORS``: the
reference loops, transformers' paths), the loop mutants (``loop-mutant:NAME``), else
``MODULE:CALLABLE`` (``exactcheck.loading``)."""
from __future__ import annotations

from exactcheck.errors import UsageError
from exactcheck.loading import load_subject

__all__ = ["load_generator", "builtin_generators", "loop_mutants"]


def load_generator(name: str):
    """A built-in generator by name, a loop mutant (``loop-mutant:NAME``) or MODULE:CALLABLE."""
    builtin = builtin_generators()
    if name in builtin:
        generator = builtin[name]
        if getattr(generator, "ensemble_weight", None) is not None:
            from exactcheck.contracts.transformers_compat import require_ensemble_weight
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
    structured-output ones (found on the grammar worlds), the penalties' (found under a policy with
    penalties: ``--policy repetition_penalty=...``), then the two-vocabulary loops' (TLI and SLEM,
    SLRS)."""
    from exactcheck.e2e.grammar_mutants import GRAMMAR_MUTANTS
    from exactcheck.e2e.loop import LOOP_MUTANTS
    from exactcheck.e2e.penalty_mutants import PENALTY_MUTANTS
    from exactcheck.e2e.string_rejection import SLRS_MUTANTS
    from exactcheck.e2e.two_vocab_loop import TWO_VOCAB_MUTANTS
    return (*LOOP_MUTANTS, *GRAMMAR_MUTANTS, *PENALTY_MUTANTS.values(), *TWO_VOCAB_MUTANTS, *SLRS_MUTANTS)


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
