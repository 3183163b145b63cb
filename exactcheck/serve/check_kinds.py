"""The check kinds only the served-system audit has (``exactcheck.options.CheckKind`` holds the
shared ones): declared here, in the kind that owns them."""
from __future__ import annotations

from exactcheck.options import CheckKind

__all__ = ["LOGPROB_FIDELITY", "SPECULATION", "DECLARED_SETTINGS", "SEED_REPRODUCIBILITY", "ANSWER_END"]

# a server's reported probabilities against the reference's
LOGPROB_FIDELITY = CheckKind.declare("LOGPROB_FIDELITY", "logprob fidelity")
# a server's own speculation counters: drafting units compared (stats.rates); met only on the requests it names
SPECULATION = CheckKind.declare(
    "SPECULATION", "speculation ran", statistical=True,
    met="on the requests the check names (speculation switched off for them): met on every such request")
DECLARED_SETTINGS = CheckKind.declare("DECLARED_SETTINGS", "declared settings")  # the speculation settings a server exposes
SEED_REPRODUCIBILITY = CheckKind.declare("SEED_REPRODUCIBILITY", "seed reproducibility")  # the same seeded request twice
# what each served answer says of its end (finish reason, usage) against its tokens
ANSWER_END = CheckKind.declare("ANSWER_END", "answer end")
