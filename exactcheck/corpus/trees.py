"""Exact tree verifiers written differently from exactcheck's references
(``exactcheck.contracts.tree_reference``), so that a tree check that fails one of them is shown to fail exact
code: every coin convention the multi-round rule allows, and the walk written node by node.

* ``multi_round_float32_coins``: coins drawn in float32 and compared strictly, ``coin * q < r``;
* ``multi_round_mirrored_coins``: ``u = 1 - rand`` in (0, 1], accepted when ``u * q <= r``
  (non-strict is exact here: u is never 0);
* ``multi_round_mirrored_float32_coins``: the same on float32 coins, ``u = 1 - rand`` in
  [2^-24, 1];
* ``multi_round_float32_ratio``: accepted when ``coin < r/q`` with the ratio rounded to float32 (a
  threshold off by 2^-24 of itself: within the tie margin of ``tree_rule_decisions``);
* ``multi_round_log_space``: accepted when ``log(coin) < log r(x) - log q(x)`` (log 0 = -inf);
* ``multi_round_scalar_walk``: one row at a time, plain Python over the nodes, corrections by
  ``torch.multinomial`` on the residual.

Each keeps every tree law and every forced-value property (``property_tests/tree/test_tree.py``,
``property_tests/tree/test_tree_forced.py``).
"""
from __future__ import annotations

import torch

from exactcheck.contracts.tree_verifier import children_table, tree_depths
from exactcheck.contracts.tree_reference import multi_round_deciding, walk_tree

__all__ = ["TREE_CORPUS"]


def _float32(rx, qx, generator):
    coin = torch.rand(rx.shape[0], dtype=torch.float32, generator=generator, device=rx.device).double()
    return coin * qx < rx


def _mirrored(rx, qx, generator):
    u = 1.0 - torch.rand(rx.shape[0], dtype=torch.float64, generator=generator, device=rx.device)
    return u * qx <= rx


def _mirrored_float32(rx, qx, generator):
    u = 1.0 - torch.rand(rx.shape[0], dtype=torch.float32, generator=generator, device=rx.device).double()
    return u * qx <= rx


def _float32_ratio(rx, qx, generator):
    coin = torch.rand(rx.shape[0], dtype=torch.float64, generator=generator, device=rx.device)
    return coin < (rx / qx).float().double()


def _log_space(rx, qx, generator):
    coin = torch.rand(rx.shape[0], dtype=torch.float64, generator=generator, device=rx.device)
    return torch.log(coin) < torch.log(rx) - torch.log(qx)


def _walker(decide, name):
    def verifier(target_probs, draft_probs, tokens, parents, generator):
        return walk_tree(target_probs, draft_probs, tokens, parents, generator, multi_round_deciding(decide))
    verifier.__name__ = name
    verifier.sibling_sampling = "iid"
    verifier.tree_rule = "multi_round"
    return verifier


def multi_round_scalar_walk(target_probs, draft_probs, tokens, parents, generator):
    """The multi-round rule one row and one node at a time."""
    b, _, _ = target_probs.shape
    table = children_table(parents)
    depth = int(tree_depths(parents).max())
    out = torch.full((b, depth + 1), -1, dtype=torch.int64, device=tokens.device)
    for row in range(b):
        node, level = 0, 0
        while True:
            p, q = target_probs[row, node].double(), draft_probs[row, node].double()
            r = p.clone()
            accepted = None
            for kid in table[row, node].tolist():
                if kid < 0:
                    break
                x = int(tokens[row, kid])
                coin = float(torch.rand((), dtype=torch.float64, generator=generator, device=tokens.device))
                if coin * float(q[x]) < float(r[x]):
                    accepted = kid
                    break
                left = (r - q).clamp(min=0)
                r = left / left.sum() if left.sum() > 0 else r
            if accepted is None:
                out[row, level] = int(torch.multinomial(r.float(), 1, generator=generator))
                break
            out[row, level] = tokens[row, accepted]
            node, level = accepted, level + 1
    return out


multi_round_scalar_walk.sibling_sampling = "iid"
multi_round_scalar_walk.tree_rule = "multi_round"

TREE_CORPUS = {
    "multi_round_float32_coins": _walker(_float32, "multi_round_float32_coins"),
    "multi_round_mirrored_coins": _walker(_mirrored, "multi_round_mirrored_coins"),
    "multi_round_mirrored_float32_coins": _walker(_mirrored_float32, "multi_round_mirrored_float32_coins"),
    "multi_round_float32_ratio": _walker(_float32_ratio, "multi_round_float32_ratio"),
    "multi_round_log_space": _walker(_log_space, "multi_round_log_space"),
    "multi_round_scalar_walk": multi_round_scalar_walk,
}
