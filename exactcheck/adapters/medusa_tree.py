"""Medusa's tree verification, as shipped, behind exactcheck's tree contract.

The decision is Medusa's own function: ``medusa.model.utils.evaluate_posterior`` from the PyPI
package ``medusa-llm`` 0.1 (FasterDecoding/Medusa; pure torch, imported as installed, CPU). It takes
``logits`` [C, L+1, V] and ``candidates`` [C, L+1] (one row per root-to-leaf path, column 0 the
root's token) and returns the best candidate and its accepted length:

* ``temperature == 0``: a candidate's token is accepted while it equals the argmax of the logits
  before it; the candidate with the longest accepted prefix wins (``argmax``: the first on a tie);
* otherwise (typical acceptance): accepted while its probability under ``softmax(logits /
  temperature)`` exceeds ``min(posterior_threshold, posterior_alpha * exp(-H))``; the longest
  accepted prefix wins, ties broken by the larger sum of log-probabilities.

Medusa's next token (the root of the next step's tree) is the argmax of the target's logits at the
last accepted position (``generate_candidates``): so the emitted tuple is the accepted path and
then that argmax. Registered rules: ``typical_medusa`` (``exactcheck.tree.rules``) at temperature
1, and greedy decoding at temperature 0 (exact on greedy targets).

Glue written here (not Medusa's code): the candidates are the tree's root-to-leaf paths in
breadth-first node order, as ``generate_medusa_buffers`` orders its ``retrieve_indices`` for a
product tree (medusa-llm 0.1 builds only those: ``torch.cartesian_prod`` of per-head top-k). For a
ragged tree the GitHub head of Medusa (``medusa/model/utils.py``, ``generate_medusa_buffers`` with
``medusa_choices``) pads shorter paths with index -1: the padded positions read token 0 (the extra
element appended to ``tree_candidates``) and the logits of the tree's last node. ``padding =
"medusa"`` reproduces that reading (``MedusaTree("typical", padding="medusa")``: a shorter path can
"accept" a phantom token 0, which is then emitted); the default ``padding = "mask"`` keeps padded
positions unacceptable (a candidate token -1 never matches), which is what a correct port does.

The logits handed to Medusa are ``log(p)`` (float32), so ``softmax(logits / 1)`` is p again.
"""
from __future__ import annotations

import torch

from exactcheck.contracts.tree_verifier import children_table, tree_depths

__all__ = ["MedusaTree", "medusa_available", "leaf_paths"]


def medusa_available() -> str | None:
    """None when ``medusa.model.utils.evaluate_posterior`` imports; else why not."""
    try:
        from medusa.model.utils import evaluate_posterior  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means "not installed here"
        return f"medusa-llm is not importable ({type(error).__name__}: {error}); pip install --no-deps medusa-llm"
    return None


def leaf_paths(parents: list[int]) -> list[list[int]]:
    """Every root-to-leaf path as node ids (root excluded), leaves in node order."""
    children = {i for i in parents if i >= 0}
    out = []
    for leaf in range(1, len(parents)):
        if leaf in children:
            continue
        path, node = [], leaf
        while node > 0:
            path.append(node)
            node = parents[node]
        out.append(path[::-1])
    return out


class MedusaTree:
    """``evaluate_posterior`` on every row's tree; ``mode`` "typical" (temperature 1, Medusa's
    default thresholds 0.09 and 0.3) or "greedy" (temperature 0)."""

    sibling_sampling = "top_k"
    takes_draft_probs = False

    def __init__(self, mode: str = "typical", padding: str = "mask", posterior_threshold: float = 0.09,
                 posterior_alpha: float = 0.3):
        if mode not in ("typical", "greedy") or padding not in ("mask", "medusa"):
            raise ValueError(f"mode {mode!r} / padding {padding!r}")
        self.mode, self.padding = mode, padding
        self.posterior_threshold, self.posterior_alpha = posterior_threshold, posterior_alpha
        self.greedy = mode == "greedy"
        self.tree_rule = "typical_medusa" if mode == "typical" else None
        self.__name__ = f"medusa-{mode}" + ("-padded" if padding == "medusa" else "")

    def __repr__(self) -> str:
        return f"MedusaTree({self.mode!r}, padding={self.padding!r})"

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        from medusa.model.utils import evaluate_posterior
        b, m, vocab = target_probs.shape
        depth = int(tree_depths(parents).max())
        out = torch.full((b, depth + 1), -1, dtype=torch.int64)
        logp = torch.log(target_probs.float().cpu())
        for row in range(b):
            par = parents[row].tolist()
            paths = leaf_paths(par)
            longest = max(len(p) for p in paths)
            index = torch.full((len(paths), longest + 1), -1, dtype=torch.int64)
            for c, path in enumerate(paths):
                index[c, :len(path) + 1] = torch.tensor([0] + path)
            node_tokens = tokens[row].cpu().clone()
            node_tokens[0] = 0  # the root's own token: never read as a candidate
            if self.padding == "medusa":  # GitHub Medusa: index -1 reads token 0 and the last node's logits
                candidates = torch.cat([node_tokens, torch.zeros(1, dtype=torch.int64)])[index]
                logits = logp[row][index]
            else:  # a padded position can never be accepted
                logits = logp[row][index.clamp(min=0)].clone()
                padded_next = index[:, 1:] < 0  # position j + 1 padded: row j must not accept it
                if self.greedy:  # compared with argmax: -1 matches nothing
                    candidates = torch.where(index >= 0, node_tokens[index.clamp(min=0)], -1)
                else:  # gathered: token 0 there, given probability 0 by its row
                    candidates = torch.where(index >= 0, node_tokens[index.clamp(min=0)], 0)
                    logits[:, :-1, 0] = logits[:, :-1, 0].masked_fill(padded_next, -torch.inf)
            best, accepted = evaluate_posterior(logits, candidates, 0 if self.greedy else 1.0,
                                                self.posterior_threshold, self.posterior_alpha)
            best, accepted = int(best), int(accepted)
            emitted = candidates[best, 1:accepted + 1].tolist()
            last = index[best, accepted]
            last_row = logp[row][last]  # index -1 (padding="medusa"): the last node's row, as Medusa reads it
            out[row, :accepted] = torch.tensor(emitted, dtype=torch.int64)
            out[row, accepted] = int(last_row.argmax())
        return out.to(tokens.device)
