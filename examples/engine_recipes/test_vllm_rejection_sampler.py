"""Drop into a vLLM checkout's tests (with exactcheck installed) to audit the rejection sampler
vLLM ships, on the GPU when there is one. A failure prints each finding with its evidence,
reachability and a reproduce line."""
from exactcheck.step.engines import audit_rejection_sampler


def test_rejection_sampler_is_exact():
    result = audit_rejection_sampler(level="quick")
    assert result.passed, "\n\n".join(v.describe() for v in result.failed)


def test_rejection_sampler_temperature_path_is_exact():
    result = audit_rejection_sampler(level="quick", temperature=0.7)
    assert result.passed, "\n\n".join(v.describe() for v in result.failed)
