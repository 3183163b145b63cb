"""exactcheck: audit speculative-decoding implementations for exactness, with stated error rates.

The pipeline, one subpackage a stage: worlds (``toy_models``) -> ``step.drive`` / ``e2e.drive``
-> samples -> ``stats`` (exact laws, goodness of fit, e-processes, planning) -> ``report.verdict``
-> ``report`` (JSON, Markdown, HTML). ``exactcheck.options`` holds what every layer reads (options,
levels, the alpha split, check kinds); ``exactcheck.step.plan`` / ``exactcheck.e2e.plan`` decide
what an audit runs; ``run_audit`` executes a step-level verifier audit, ``run_generator_audit`` an
end-to-end one (needs transformers); ``audit_subject`` either, by ``AuditKind``.

The names below are imported on first use, so ``import exactcheck`` (and the pytest plugin, and
``exactcheck --help``) costs no torch import.
"""
from __future__ import annotations

import importlib

from exactcheck.version import __version__  # noqa: E402  (a leaf)

_PUBLIC = {
    "run_audit": "exactcheck.step.runner", "AuditResult": "exactcheck.report.result",
    "DEFAULT_ALPHA": "exactcheck.options", "Level": "exactcheck.options", "AuditOptions": "exactcheck.options",
    "AuditPlan": "exactcheck.options", "CheckKind": "exactcheck.options", "AuditKind": "exactcheck.options", "SubjectKind": "exactcheck.options",
    "plan_step_audit": "exactcheck.step.plan", "plan_generator_audit": "exactcheck.e2e.plan",
    "audit_subject": "exactcheck.audit_kinds", "plan_subject": "exactcheck.audit_kinds",
    "PADDING": "exactcheck.contracts.verifier", "Verifier": "exactcheck.contracts.verifier",
    "from_logits": "exactcheck.contracts.verifier", "validate_output": "exactcheck.contracts.verifier",
    "ContractViolation": "exactcheck.errors", "ExactcheckError": "exactcheck.errors",
    "SubjectCrashed": "exactcheck.errors", "SubjectError": "exactcheck.errors",
    "UsageError": "exactcheck.errors", "Violation": "exactcheck.errors",
    "GREEDY": "exactcheck.contracts.generator", "SAMPLING": "exactcheck.contracts.generator",
    "DecodingPolicy": "exactcheck.contracts.generator", "Generation": "exactcheck.contracts.generator",
    "Generator": "exactcheck.contracts.generator",
    "MUTANTS": "exactcheck.step.mutants",
    "ReferenceVerifier": "exactcheck.contracts.reference_verifier", "reference_verifier": "exactcheck.contracts.reference_verifier",
    "Outcome": "exactcheck.report.verdict", "Category": "exactcheck.report.verdict",
    "Verdict": "exactcheck.report.verdict",
    "run_generator_audit": "exactcheck.e2e.runner",
}

__all__ = sorted(_PUBLIC) + ["__version__"]


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'exactcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
