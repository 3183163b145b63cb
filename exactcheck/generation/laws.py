"""The exact law of a generation under a decoding policy, from a context world's target (float64,
by enumeration): what the end-to-end, recurrent and forced-draw verdicts compare generations with."""
from __future__ import annotations

import numpy as np

__all__ = ["policy_sequence_law"]


def policy_sequence_law(world, policy, length: int) -> dict[tuple[int, ...], float]:
    """The exact float64 law of a generation of at most ``length`` tokens from ``world``'s
    target under a decoding policy (``exactcheck.contracts.policy``): every outcome, as the tuple of its
    tokens (shorter when it ends with a stop token), with its probability. Each row is the
    policy's transform of the target's float64 row at the prefix's state, with the prefix
    passed to the policy's mask."""
    rows = world.target.law()
    out: dict[tuple[int, ...], float] = {}

    def walk(state: int, prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length or (prefix and prefix[-1] in policy.stop_tokens):
            out[prefix] = out.get(prefix, 0.0) + prob
            return
        row = policy.transform(rows[state][None], [prefix])[0]
        for token in np.flatnonzero(row > 0):
            walk(int(world.next_state(state, int(token))), prefix + (int(token),), prob * float(row[token]))

    walk(world.prompt_state, (), 1.0)
    return out
