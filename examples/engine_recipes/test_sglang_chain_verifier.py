"""Drop into an SGLang checkout's tests (with exactcheck and sgl-kernel installed, on a GPU) to
audit sgl-kernel's target-only verification on a chain of drafts."""
from exactcheck.step.engines import audit_chain_verifier


def test_chain_verification_is_exact():
    result = audit_chain_verifier(level="quick")
    assert result.passed, "\n\n".join(v.describe() for v in result.failed)
