"""Step-level verifiers by name: the built-in ones ``exactcheck list`` prints (the reference, the
selftest's mutants, the small-bias and convention x precision mutants), else ``MODULE:CALLABLE``
(``exactcheck.loading.load_subject``)."""
from __future__ import annotations

__all__ = ["builtin_verifiers", "load_verifier"]


def builtin_verifiers() -> dict:
    """Name -> verifier: ``reference``, then every mutant by the name ``exactcheck list`` prints it
    (``trust_draft``, ``acceptance_x0.98``) and by its importable spelling (``acceptance_x0_98``)."""
    from exactcheck.step.mutants import CONVENTION_PRECISION_MUTANTS, MUTANTS, SMALL_BIAS_MUTANTS, importable_name
    from exactcheck.contracts.reference_verifier import reference_verifier
    out = {"reference": reference_verifier}
    for m in (*MUTANTS.values(), *SMALL_BIAS_MUTANTS.values(), *CONVENTION_PRECISION_MUTANTS.values()):
        out[m.name] = m.verifier
        out.setdefault(importable_name(m.name), m.verifier)
    return out


def load_verifier(name: str):
    """A built-in verifier by name, or MODULE:CALLABLE."""
    builtin = builtin_verifiers()
    if name in builtin:
        return builtin[name]
    from exactcheck.loading import load_subject
    return load_subject(name)
