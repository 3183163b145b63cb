"""exactcheck: audit speculative-decoding implementations for exactness, with stated error rates.

Pipeline: world (``toy_models``) -> ``drive`` -> samples -> ``laws`` -> ``statistics`` ->
``Verdict`` -> ``report``. ``run_audit`` runs it all for one step-level verifier;
``exactcheck.generator_audit.run_generator_audit`` for an end-to-end generator (needs transformers,
imported on use).
"""
__version__ = "0.1.0"

from exactcheck.audit import DEFAULT_ALPHA, AuditResult, run_audit  # noqa: E402
from exactcheck.contract import PADDING, Verifier, from_logits, validate_output  # noqa: E402
from exactcheck.errors import (  # noqa: E402
    ContractViolation, ExactcheckError, SubjectCrashed, SubjectError, UsageError, Violation,
)
from exactcheck.generator import GREEDY, SAMPLING, DecodingPolicy, Generation, Generator  # noqa: E402
from exactcheck.mutants import MUTANTS  # noqa: E402
from exactcheck.reference import ReferenceVerifier, reference_verifier  # noqa: E402
from exactcheck.suite import Level  # noqa: E402
from exactcheck.verdict import Outcome, Verdict  # noqa: E402

__all__ = [
    "AuditResult", "ContractViolation", "DEFAULT_ALPHA", "DecodingPolicy", "ExactcheckError", "GREEDY",
    "Generation", "Generator", "Level", "MUTANTS", "SAMPLING",
    "Outcome", "PADDING", "ReferenceVerifier", "SubjectCrashed", "SubjectError", "UsageError",
    "Verdict", "Verifier", "Violation", "from_logits", "reference_verifier", "run_audit",
    "validate_output", "run_generator_audit", "__version__",
]


def __getattr__(name: str):
    if name == "run_generator_audit":  # imports transformers, so only on use
        from exactcheck.generator_audit import run_generator_audit
        return run_generator_audit
    raise AttributeError(f"module 'exactcheck' has no attribute {name!r}")
