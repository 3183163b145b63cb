"""EAGLE's multi-round tree verification, as shipped, behind exactcheck's tree contract.

The decision is EAGLE's own code: the PyPI package ``eagle-llm`` 1.2.1 (SafeAILab/EAGLE, EAGLE-1
with static trees; pure torch, imported as installed, CPU), in its two copies:

* ``module="model"``: ``eagle.model.utils`` (one sequence, ``EaModel.eagenerate``);
* ``module="modelbsne1"``: ``eagle.modelbsne1.utils`` (a batch of sequences; the same walk, looped
  over the batch).

Each step runs EAGLE's ``generate_tree_buffers`` (the tree given as EAGLE's ``tree_choices``: each
node the path of its sibling ranks), ``generate_candidates`` and ``evaluate_posterior``:

* sampling (``temperature > 0``; ``prepare_logits_processor(temperature)``): siblings were drawn
  without replacement from the draft (``cnets.Model.sample``: ``torch.multinomial(...,
  replacement=False)``), sibling j's probability is q(x) / (1 - the earlier siblings' q); the walk
  accepts x when ``random.random() <= p(x) / q_j(x)`` and on a rejection sets p <- norm(max(p -
  q_j, 0)) with q_j the parent's draft row less the earlier siblings (``b_indices``), renormalised;
  EAGLE then draws the next token from ``sample_p`` (``torch.multinomial`` in
  ``update_inference_inputs``). The registered rule is ``without_replacement``.
* greedy (``temperature = 0``: ``logits_processor`` None): the candidate path with the longest
  prefix equal to the argmax of the logits before it; the next token the argmax after it.

Glue written here (not EAGLE's code), each piece what EAGLE's own draft and model hand the verify:

* ``tree_logits = (tokens, probs, op)`` as ``cnets.Model.topK_genrate`` returns it: one row of
  ``TOPK`` slots per node that has children, in EAGLE's node order (by depth, then by path), slot c
  holding child c's token and its probability by ``cnets.Model.sample``'s formula (computed here in
  the rows' dtype, as that function does: ``q / (1 - cumsum of the earlier slots)``, inf and NaN
  to -1, clamped to [0, 1]); ``op`` per depth, the draft rows of that depth's parents. ``TOPK``
  (10 in EAGLE, its draft's top-k) is set to the widest node of the tree handed in when that is
  wider: EAGLE configured with a larger top-k, never a narrower one.
* the target's logits are ``temperature * log p`` (float32), so that EAGLE's own temperature
  processor gives back p: at ``temperature = 1`` the processor list is empty and the logits are
  ``log p``. Read along EAGLE's ``retrieve_indices`` with torch's indexing, as ``tree_decoding``
  does (a padded -1 reads the tree's last node).
* EAGLE draws its coins from Python's global ``random.random()`` (float64 in [0, 1)); during a call
  the module's ``random`` is one whose ``random()`` is a float64 ``torch.rand`` from the call's
  generator (the same law), so that an audit's seed reproduces and forced draws reach the coins.
  The next token is ``torch.multinomial(sample_p, 1, generator=...)``, EAGLE's draw on the call's
  generator.

What the audit finds, read against the source (``docs/engines.md``; ``property_tests/
test_eagle_tree.py``); each finding is gone from the audit of EAGLE's module with the one line of
``FIXES`` it names changed (``EagleTree(fixed=(...))``):

* ``model`` at temperature 1: the ``without_replacement`` rule's law. The coin test is ``r <= px /
  qx`` with ``r = random.random()``, which is 0.0 one time in 2^53: a sibling the target forbids
  (p = 0, from a top-k or top-p processor or a masked logit) is then accepted (``strict_coin``:
  ``r < acp``).
* ``model`` at another temperature: when the walk reaches a leaf (the accepted length the full
  path, or no sibling tried at the last depth), ``evaluate_posterior`` takes ``sample_p = softmax(
  logits[best_candidate, accept_length - 1])`` without the logits processor: the bonus token after a
  fully accepted path is drawn at temperature 1, not at the policy's (``bonus_temperature``).
* ``modelbsne1``: the walk compares ``accept_length != candidates.shape[1]`` where ``candidates``
  is [batch, paths, length]: the number of candidate paths, not the path length (``path_length``).
  Where they differ, a fully accepted path after a rejected sibling at its last depth draws its
  bonus from the parent's residual, and where the walk stops at a depth equal to the number of
  paths its correction is drawn from p, not from the residual. On a tree with as many paths as
  columns it is exact.
* both, the coin fixed: on the p = q edge, the float32 ratio ``px / qx`` rounds just under 1, a coin
  within 1.5e-7 of 1 rejects, the residual ``max(p - q, 0)`` is empty and ``gtp / gtp.sum()`` is
  NaN: ``torch.multinomial`` raises (no fix named: a guard is a design choice).
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import types
from contextlib import contextmanager

import torch

from exactcheck.contracts.tree_verifier import tree_depths

__all__ = ["EagleTree", "EagleGithubTree", "eagle_available", "eagle_choices", "FIXES"]

MODULES = ("model", "modelbsne1")

# fix -> (the modules it applies to, EAGLE 1.2.1's text as shipped, the text with the fix): ``EagleTree(
# fixed=(...))`` runs EAGLE's module with only those texts changed, so that each finding is read
# against the line it names (the fixed copy passes where the shipped one fails)
FIXES = {
    "strict_coin": (("model", "modelbsne1"), "if r <= acp:", "if r < acp:"),
    "bonus_temperature": (("model",), "            sample_p = torch.softmax(gt_logits, dim=0)\n",
                          "            sample_p = torch.softmax(logits_processor(None, gt_logits[None])[0], dim=0)\n"),
    "path_length": (("modelbsne1",), "if adjustflag and accept_length != candidates.shape[1]:",
                    "if adjustflag and accept_length != candidates.shape[2]:"),
}
_FIXED: dict[tuple, types.ModuleType] = {}


def _utils(module: str, fixed: tuple[str, ...]) -> types.ModuleType:
    """EAGLE's ``eagle.<module>.utils``, or a copy of it with the texts of the ``fixed`` fixes changed."""
    shipped = importlib.import_module(f"eagle.{module}.utils")
    if not fixed:
        return shipped
    key = (module,) + fixed
    if key not in _FIXED:
        source = inspect.getsource(shipped)
        for name in fixed:
            modules, text, fix = FIXES[name]
            if module not in modules or source.count(text) != 1:
                raise ValueError(f"fix {name!r} does not apply to eagle.{module}.utils: its text "
                                 f"({text.strip()!r}) is not there once (eagle-llm 1.2.1's modules: {modules})")
            source = source.replace(text, fix)
        copy = types.ModuleType(f"eagle.{module}.utils_fixed_{'_'.join(fixed)}")
        copy.__file__ = shipped.__file__
        sys.modules[copy.__name__] = copy
        exec(compile(source, shipped.__file__, "exec"), copy.__dict__)  # noqa: S102 - EAGLE's own source
        _FIXED[key] = copy
    return _FIXED[key]


def eagle_available() -> str | None:
    """None when EAGLE's two ``utils`` modules import; else why not."""
    try:
        for module in MODULES:
            importlib.import_module(f"eagle.{module}.utils")
    except Exception as error:  # noqa: BLE001 - any import failure means "not installed here"
        return (f"eagle-llm is not importable ({type(error).__name__}: {error}); "
                "pip install --no-deps eagle-llm==1.2.1 (it imports torch and transformers)")
    return None


def eagle_choices(parents: list[int]) -> dict[int, tuple[int, ...]]:
    """Node id -> EAGLE's tree choice for it: the sibling ranks on its path from the root."""
    path: dict[int, tuple[int, ...]] = {0: ()}
    seen: dict[int, int] = {}
    for node in range(1, len(parents)):
        parent = parents[node]
        rank = seen.get(parent, 0)
        seen[parent] = rank + 1
        path[node] = path[parent] + (rank,)
    return path


class _TorchCoins:
    """Stands in for the ``random`` module inside EAGLE's walk: ``random()`` a float64 uniform
    from the call's generator."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def random(self) -> float:
        return float(torch.rand((), dtype=torch.float64, generator=self.generator))


@contextmanager
def _eagle_call(utils, generator, topk: int):
    saved_random, saved_topk = utils.random, utils.TOPK
    utils.random, utils.TOPK = _TorchCoins(generator), max(saved_topk, topk)
    try:
        yield
    finally:
        utils.random, utils.TOPK = saved_random, saved_topk


def _sample_probs(q_rows: torch.Tensor, slot_tokens: torch.Tensor) -> torch.Tensor:
    """``cnets.Model.sample``'s probability of each slot (rows [R, V], slots [R, K]): q(x) over 1
    minus the earlier slots' q; inf and NaN to -1, clamped to [0, 1]."""
    sampled = torch.gather(q_rows, 1, slot_tokens)
    cumulative = torch.cumsum(sampled, dim=1)
    cumulative = torch.cat((torch.zeros(cumulative.shape[0], 1, dtype=cumulative.dtype), cumulative[:, :-1]), dim=-1)
    sampled = sampled / (1 - cumulative)
    sampled[torch.isinf(sampled)] = -1
    sampled[torch.isnan(sampled)] = -1
    return torch.clamp(sampled, min=0.0, max=1.0)


def _target_logits(target_probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """The target's float32 logits as EAGLE's model hands them over: ``temperature * log p``, so
    that its temperature processor gives back p (``log p`` at temperature 0 or 1)."""
    log_p = torch.log(target_probs.detach().cpu().float())
    return log_p if temperature in (0.0, 1.0) else temperature * log_p


def _next_token(sample_p: torch.Tensor, greedy: bool, generator) -> int:
    """``update_inference_inputs``' next token: the argmax when greedy, else ``torch.multinomial``
    on the call's generator."""
    if greedy:
        return int(torch.argmax(sample_p))
    return int(torch.multinomial(sample_p.reshape(-1), 1, generator=generator))


class _Shape:
    """One tree shape in EAGLE's terms: its buffers, and where each of our nodes sits in them."""

    def __init__(self, utils, parents: list[int]):
        choice = eagle_choices(parents)
        node_of = {c: n for n, c in choice.items()}
        self.order = [node_of[()]] + [node_of[tuple(c)] for c in sorted((choice[n] for n in range(1, len(parents))),
                                                                         key=lambda x: (len(x), x))]
        kids: dict[int, list[int]] = {}
        for node in range(1, len(parents)):
            kids.setdefault(parents[node], []).append(node)
        self.blocks = [n for n in self.order if n in kids]  # nodes with children, EAGLE's order
        self.kids = kids
        self.depth = {n: len(choice[n]) for n in choice}
        self.width = max(len(k) for k in kids.values())
        self.choices = [list(choice[n]) for n in range(1, len(parents))]
        self.utils = utils

    def buffers(self):
        return self.utils.generate_tree_buffers(self.choices, device="cpu")


class EagleTree:
    """EAGLE 1.2.1's ``evaluate_posterior`` on every row's tree (``module`` "model" or
    "modelbsne1"); ``temperature`` 0 is EAGLE's greedy path; ``fixed`` (names in ``FIXES``) runs the module
    with those lines changed, to read a finding against the line it names."""

    def __init__(self, module: str = "model", temperature: float = 1.0, fixed: tuple[str, ...] = ()):
        if module not in MODULES:
            raise ValueError(f"module {module!r}: one of {MODULES}")
        if temperature < 0:
            raise ValueError(f"temperature {temperature!r} must be >= 0")
        unknown = set(fixed) - set(FIXES)
        if unknown:
            raise ValueError(f"unknown fixes {sorted(unknown)}: known {sorted(FIXES)}")
        self.module, self.temperature, self.fixed = module, float(temperature), tuple(fixed)
        self.greedy = temperature == 0
        self.sibling_sampling = "top_k" if self.greedy else "without_replacement"
        self.takes_draft_probs = not self.greedy
        self.tree_rule = None if self.greedy else "without_replacement"
        suffix = "greedy" if self.greedy else f"T{self.temperature:g}"
        self.__name__ = f"eagle-{module}-{suffix}" + "".join(f"-fixed-{f}" for f in self.fixed)

    def __repr__(self) -> str:
        return (f"EagleTree({self.module!r}, temperature={self.temperature!r}"
                + (f", fixed={self.fixed!r}" if self.fixed else "") + ")")

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        utils = _utils(self.module, self.fixed)
        b = target_probs.shape[0]
        out = torch.full((b, int(tree_depths(parents).max()) + 1), -1, dtype=torch.int64)
        q = None if draft_probs is None else draft_probs.detach().cpu()
        logits = _target_logits(target_probs, self.temperature)
        processor = None if self.greedy else utils.prepare_logits_processor(temperature=self.temperature)
        groups: dict[tuple, list[int]] = {}
        for row in range(b):  # the batched copy takes rows of one shape at a time
            key = tuple(parents[row].tolist())
            groups.setdefault(key if self.module == "modelbsne1" else (row,) + key, []).append(row)
        for rows in groups.values():
            shape = _Shape(utils, parents[rows[0]].tolist())
            with _eagle_call(utils, generator, shape.width):
                emitted = self._walk(utils, shape, logits[rows], None if q is None else q[rows],
                                     tokens[rows].cpu(), processor, generator)
            for row, seq in zip(rows, emitted):
                out[row, :len(seq)] = torch.tensor(seq, dtype=torch.int64)
        return out.to(tokens.device)

    def _tree_logits(self, utils, shape: _Shape, q, tokens):
        """(tokens [R, B, TOPK], probs [R, B, TOPK], op: per depth [R, parents, V]) for R rows."""
        r, k = tokens.shape[0], utils.TOPK
        slots = torch.zeros(r, len(shape.blocks), k, dtype=torch.int64)
        for i, node in enumerate(shape.blocks):
            kids = shape.kids[node]
            slots[:, i, :len(kids)] = tokens[:, kids]
        if q is None:
            return slots, None, None
        probs = torch.zeros(r, len(shape.blocks), k, dtype=q.dtype)
        for i, node in enumerate(shape.blocks):
            width = len(shape.kids[node])
            probs[:, i, :width] = _sample_probs(q[:, node], slots[:, i, :width])
        op = [q[:, [n for n in shape.blocks if shape.depth[n] == d]] for d in range(max(shape.depth.values()))]
        return slots, probs.float(), op

    def _walk(self, utils, shape: _Shape, logits, q, tokens, processor, generator) -> list[list[int]]:
        buffers = shape.buffers()
        retrieve = buffers["retrieve_indices"]
        slots, probs, op = self._tree_logits(utils, shape, q, tokens)
        node_logits = logits[:, shape.order]  # EAGLE's node order: the root, then by depth and path
        rows = tokens.shape[0]
        if self.module == "model":
            results = []
            for r in range(rows):
                tree_logits = (slots[r], None if probs is None else probs[r], None if op is None else [o[r] for o in op])
                candidates, candidates_prob, tree_candidates = utils.generate_candidates(
                    tree_logits, buffers["tree_indices"], retrieve, torch.zeros(1, 1, dtype=torch.int64), processor)
                best, accepted, sample_p = utils.evaluate_posterior(
                    node_logits[r][retrieve], candidates, processor, candidates_prob,
                    tree_logits[2], buffers["p_indices"], tree_candidates, buffers["b_indices"])
                results.append(self._emitted(candidates[int(best)], int(accepted), sample_p, generator))
            return results
        candidates, candidates_prob, tree_candidates = utils.generate_candidates(
            (slots, probs, op), buffers["tree_indices"], retrieve, torch.zeros(rows, 1, dtype=torch.int64), processor)
        best, accepted, sample_p = utils.evaluate_posterior(
            node_logits[:, retrieve], candidates, processor, candidates_prob, op, buffers["p_indices"],
            tree_candidates, buffers["b_indices"], [False] * rows)
        return [self._emitted(candidates[r, int(best[r])], int(accepted[r]), sample_p[r], generator)
                for r in range(rows)]

    def _emitted(self, path: torch.Tensor, accepted: int, sample_p: torch.Tensor, generator) -> list[int]:
        """The accepted candidate tokens (column 0, the root's, left out), then EAGLE's next token."""
        return path[1:accepted + 1].tolist() + [_next_token(sample_p, self.greedy, generator)]


class EagleGithubTree:
    """EAGLE-2/3's tree walk as on SafeAILab/EAGLE's GitHub head (``eagle/model/utils.py``
    ``evaluate_posterior(logits, candidates, logits_processor)``; not on PyPI), loaded from
    ``utils_path``, a file of a checkout the user fetched (nothing of it ships here).

    The head drafts a dynamic tree of the draft's top-k (``cnets.Model.topK_genrate``) and verifies
    with ``qx = 1.0``: sibling x accepted when ``random.random() <= p(x)``, on a rejection x zeroed
    in p and p renormalised; the registered rule is ``deterministic``. Glue, as ``topK_genrate`` and
    ``EaModel.eagenerate`` build it: ``retrieve_indices`` one row per leaf (the node ids on its path,
    -1 padded to the depth, leaves in node order; sorted by that path with -1 last when sampling),
    ``candidates`` the drafted tokens with -1 appended, read along them, the logits ``tree_logits[0,
    retrieve_indices]`` (a -1 reads the last node), and the next token ``torch.multinomial(sample_p,
    1)`` (greedy: the argmax), as ``update_inference_inputs`` draws it."""

    def __init__(self, utils_path: str, temperature: float = 1.0):
        if temperature < 0:
            raise ValueError(f"temperature {temperature!r} must be >= 0")
        self.utils_path, self.temperature = str(utils_path), float(temperature)
        self.greedy = temperature == 0
        self.sibling_sampling = "top_k"
        self.takes_draft_probs = False
        self.tree_rule = None if self.greedy else "deterministic"
        self.__name__ = "eagle-github-" + ("greedy" if self.greedy else f"T{self.temperature:g}")
        self._utils = None

    def __repr__(self) -> str:
        return f"EagleGithubTree({self.utils_path!r}, temperature={self.temperature!r})"

    def utils(self) -> types.ModuleType:
        if self._utils is None:
            spec = importlib.util.spec_from_file_location("eagle_github_head_utils", self.utils_path)
            if spec is None or spec.loader is None:
                raise ValueError(f"{self.utils_path}: not a Python file")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            if list(inspect.signature(module.evaluate_posterior).parameters) != ["logits", "candidates",
                                                                                  "logits_processor"]:
                raise ValueError(f"{self.utils_path}: evaluate_posterior is not the head's "
                                 "(logits, candidates, logits_processor)")
            self._utils = module
        return self._utils

    def retrieve_indices(self, parents: list[int]) -> torch.Tensor:
        """``topK_genrate``'s ``retrieve_indices`` for a tree given by its parents."""
        depth = tree_depths(torch.tensor([parents]))[0].tolist()
        inner = set(parents[1:])
        rows = []
        for leaf in (n for n in range(len(parents)) if n not in inner):
            path, node = [], leaf
            while node != 0:
                path.append(node)
                node = parents[node]
            rows.append([0] + path[::-1] + [-1] * (max(depth) - depth[leaf]))
        if not self.greedy:
            last = len(parents) + 5  # topK_genrate's maxitem: -1 sorts last
            rows.sort(key=lambda row: [i if i >= 0 else last for i in row])
        return torch.tensor(rows, dtype=torch.int64)

    def __call__(self, target_probs, draft_probs, tokens, parents, generator):
        utils = self.utils()
        b = target_probs.shape[0]
        out = torch.full((b, int(tree_depths(parents).max()) + 1), -1, dtype=torch.int64)
        logits = _target_logits(target_probs, self.temperature)
        processor = None if self.greedy else utils.prepare_logits_processor(temperature=self.temperature)
        for row in range(b):
            retrieve = self.retrieve_indices(parents[row].tolist())
            drafted = torch.cat((tokens[row].cpu(), torch.tensor([-1])))
            with _eagle_call(utils, generator, 0):
                best, accepted, sample_p = utils.evaluate_posterior(logits[row][retrieve], drafted[retrieve], processor)
            seq = drafted[retrieve][int(best), 1:int(accepted) + 1].tolist() + [_next_token(sample_p, self.greedy,
                                                                                             generator)]
            out[row, :len(seq)] = torch.tensor(seq, dtype=torch.int64)
        return out.to(tokens.device)
