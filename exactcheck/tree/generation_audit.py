"""The end-to-end audit of a tree generator: whole generations through cached tree models.

Per tree world (every built-in one: a fixed topology, ``tree.topology``, or EAGLE-2's dynamic tree,
``tree.expansion``, which the generator drafts from the draft's rows each round), ``trials``
generations of ``world.length`` tokens: each starts from empty caches on the
world's prompt (``toy_models.tree_cache_lm.tree_prompt``: it leads to the world's prompt state)
and is called through the contract (``exactcheck.contracts.tree_generator.call_tree_generator``), with the
models recording every forward. Verdicts per world:

- ``sequence``: the law of the generated tokens against ``TreeWorld.sequence_law()`` (float64,
  enumerated from the world, never from the subject), and ``first_token``, its marginal: pooled
  Pearson (``exactcheck.stats.goodness_of_fit``) under Holm over the audit at ``alpha``
  (``exactcheck.core.apply_holm``); outcomes of exact probability 0 (a greedy world's other
  paths) are a deterministic finding. Cells of probability 0 are merged into one, as the step
  tree audit does, so a greedy world's interval is not widened by empty cells;
- ``tree_cache``: the invariants of ``exactcheck.tree.cache_checks`` on every generation
  (deterministic: any breach is a finding, with its round and detail; spends no alpha);
- a crash or a broken contract: one ``WORLD/contract`` verdict in place of the world's checks.

Seeds: the world's generator is seeded with ``derive_seed(seed, world name)``; the prompt comes
from ``prompt_seed``. Not vectorised: one generation at a time (about 3-7 ms each here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from exactcheck.audit_run import AuditRun
from exactcheck.core import run_environment, sample_law_verdict
from exactcheck.errors import SubjectError, UsageError
from exactcheck.executors import one_torch_thread
from exactcheck.options import DEFAULT_ALPHA, AlphaBudget, Check, CheckKind, derive_seed
from exactcheck.reachability import observed_in
from exactcheck.tree.result import TreeLoopAuditResult
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.stats.laws import LawPlan
from exactcheck.tree.cache_checks import TreeBreach, check_tree_calls
from exactcheck.contracts.tree_generator import call_tree_generator
from toy_models.tree_cache_lm import tree_model_pair, tree_prompt
from toy_models.tree_worlds import TreeWorld, tree_worlds

__all__ = ["TreeGenerationSamples", "TreeGenerationAuditResult", "drive_tree_generator", "generation_tree_worlds",
           "tree_generation_verdicts", "run_tree_generation_audit", "tree_loop_checks", "DEFAULT_TRIALS"]

DEFAULT_TRIALS = 2_000


@dataclass(frozen=True)
class TreeGenerationSamples:
    world: TreeWorld
    sequences: np.ndarray  # [n, length] int64
    breaches: tuple[tuple[int, TreeBreach], ...]  # (generation, breach)
    forward_calls: int
    rounds: int
    unjudged: tuple[tuple[int, int, str], ...] = ()  # (generation, round, why): a dynamic round's near-tie

    @property
    def size(self) -> int:
        return self.sequences.shape[0]


# the result of this audit (kind ``tree-loop``, ``exactcheck tree-loop``), by its older name
TreeGenerationAuditResult = TreeLoopAuditResult


def generation_tree_worlds() -> list[TreeWorld]:
    """The built-in tree worlds this audit drives: all of them (fixed, ragged and dynamic trees)."""
    return list(tree_worlds())


def drive_tree_generator(subject, tree: TreeWorld, trials: int, seed: int,
                         prompt_seed: int = 0) -> TreeGenerationSamples:
    """``trials`` generations of ``tree.length`` tokens (on one torch thread); raises
    ``SubjectError`` at the first call that crashes or breaks the contract."""
    with one_torch_thread():
        return _drive(subject, tree, trials, seed, prompt_seed)


def _drive(subject, tree: TreeWorld, trials: int, seed: int, prompt_seed: int) -> TreeGenerationSamples:
    prompt, initial_state = tree_prompt(tree, seed=prompt_seed)
    target, draft = tree_model_pair(tree, initial_state)
    generator = torch.Generator().manual_seed(seed)
    sequences = np.zeros((trials, tree.length), dtype=np.int64)
    breaches: list[tuple[int, TreeBreach]] = []
    unjudged: list[tuple[int, int, str]] = []
    calls = rounds = 0
    for trial in range(trials):
        target.reset()
        draft.reset()
        log = target.record()
        draft.record(log)
        out = call_tree_generator(subject, target, draft, list(prompt), tree.length, tree, generator)
        sequences[trial] = out
        calls += len(log)
        rounds += sum(c.role == "target" for c in log)
        skipped: list[tuple[int, str]] = []
        found = check_tree_calls(log, prompt, out, tree, (target.cached_tokens, target.cached_positions), skipped)
        breaches += [(trial, b) for b in found]
        unjudged += [(trial, rnd, why) for rnd, why in skipped]
    return TreeGenerationSamples(tree, sequences, tuple(breaches), calls, rounds, tuple(unjudged))


def _codes(sequences: np.ndarray, vocab: int) -> np.ndarray:
    codes = np.zeros(sequences.shape[0], dtype=np.int64)
    for j in range(sequences.shape[1]):
        codes = codes * vocab + sequences[:, j]
    return codes


def _law(law: str, condition: str, expected: np.ndarray, observed: np.ndarray, label) -> tuple[LawPlan, np.ndarray]:
    """The plan and counts with every cell of probability 0 merged into one last cell."""
    support = np.flatnonzero(expected > 0)
    if support.size < expected.size:
        position = np.full(expected.size, support.size, dtype=np.int64)
        position[support] = np.arange(support.size)
        observed = position[observed]
        expected = np.concatenate([expected[support], [0.0]])
        inner = label
        label = lambda i: inner(int(support[i])) if i < support.size else "any outcome of probability 0"  # noqa: E731
    counts = np.bincount(observed, minlength=expected.size).astype(np.int64)
    return LawPlan(law, condition, expected, label), counts


def _cache_verdict(samples: TreeGenerationSamples, base: dict) -> Verdict:
    name = samples.world.name
    unjudged = ""
    if samples.unjudged:
        generation, rnd, why = samples.unjudged[0]
        unjudged = (f"; {len(samples.unjudged):,} rounds' trees not judged (a near-tie, not a finding; first in "
                    f"generation {generation}, round {rnd}: {why})")
    common = dict(base, check=f"{name}/tree_cache", law="tree_cache", samples=samples.size,
                  condition=f"{samples.forward_calls:,} forward calls over {samples.rounds:,} tree verifies" + unjudged,
                  kind=CheckKind.CACHE_INVARIANT)
    if samples.breaches:
        kinds = sorted({b.invariant for _, b in samples.breaches})
        generations = len({i for i, _ in samples.breaches})
        first_i, first = samples.breaches[0]
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"{len(samples.breaches):,} breach{'es' * (len(samples.breaches) != 1)} ({', '.join(kinds)}) in "
            f"{generations:,} of {samples.size:,} "
            f"generations; first, in generation {first_i}: {first.describe()}"), evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(generations, samples.size, "generations with a breach:")), **common)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        "after every verify the target cache held exactly the committed prefix at positions 0..m-1; every tree "
        "node saw the committed entries, its ancestors and itself at its depth's position"), **common)


def tree_generation_verdicts(samples: TreeGenerationSamples, share: float, alpha: float, base: dict) -> list[Verdict]:
    """One world's verdicts (laws before Holm, and the cache invariants)."""
    w = samples.world
    vocab, length = w.vocab_size, w.length
    law = w.sequence_law()
    seq = samples.sequences
    plans = [_law("sequence", f"whole generations of {length} tokens through cached tree models", law,
                  _codes(seq, vocab), lambda i: str([int(x) for x in np.unravel_index(i, (vocab,) * length)])),
             _law("first_token", "first generated token", law.reshape(vocab, -1).sum(1), seq[:, 0],
                  lambda i: f"token {i}")]
    verdicts = [sample_law_verdict(plan, counts, share, alpha, base, kind=CheckKind.GENERATOR_LAW, unit="generations")
                for plan, counts in plans]
    return verdicts + [_cache_verdict(samples, base)]


# a world's checks, in the order the audit reports them
LOOP_CHECKS = (("sequence", CheckKind.GENERATOR_LAW), ("first_token", CheckKind.GENERATOR_LAW),
               ("tree_cache", CheckKind.CACHE_INVARIANT))


def tree_loop_checks(world_names) -> tuple[Check, ...]:
    return tuple(Check(f"{w}/{law}", kind, w, law) for w in world_names for law, kind in LOOP_CHECKS)


def run_tree_generation_audit(generator, *, worlds=None, trials: int | dict[str, int] = DEFAULT_TRIALS, seed: int = 0,
                              alpha: float = DEFAULT_ALPHA, prompt_seed: int = 0, name: str | None = None,
                              reproduce: Callable[[str, int], str] | None = None, level: str | None = None,
                              require: tuple[str, ...] | None = None,
                              progress: bool = False, jobs: int = 1) -> TreeGenerationAuditResult:
    """Audit a tree generator (``exactcheck.contracts.tree_generator``) end to end on ``worlds`` (names or
    ``TreeWorld``s; default ``generation_tree_worlds()``), ``trials`` generations per world (one
    number, or per world name). ``name``: the subject's name in the result; ``reproduce(world,
    trials)``: each world's reproduce line (default: this call); ``level``, ``require``: as the
    result records them (``exactcheck tree-loop``'s entry, ``exactcheck.tree.loop_entry``).
    Ctrl-C ends it with the generations so far, marked incomplete (``exactcheck.audit_run``).
    ``jobs`` > 1: the worlds are driven in that many worker processes (each with its seed: the
    verdicts are the serial run's; the generator must pickle)."""
    if not callable(generator):
        raise UsageError(f"generator ({generator!r}) is not callable")
    if not 0 < alpha < 1:
        raise UsageError(f"alpha ({alpha}) must be in (0, 1)")
    chosen = _worlds(worlds)
    counts = {w.name: int(trials[w.name] if isinstance(trials, dict) else trials) for w in chosen}
    if any(n < 1 for n in counts.values()):
        raise UsageError(f"trials ({counts}) must be >= 1 per world")
    name = name or getattr(generator, "name", None) or getattr(generator, "__name__", type(generator).__name__)

    def line(world: str) -> str:
        n = counts.get(world, 0)
        return (reproduce(world, n) if reproduce is not None else
                f"run_tree_generation_audit({name!r}, worlds=[{world!r}], trials={n}, seed={seed}, "
                f"prompt_seed={prompt_seed})")

    budget = AlphaBudget(alpha, 2 * len(chosen), stop_early=False)
    run = AuditRun(tree_loop_checks(counts), budget, seed, line, progress=progress)
    run.planned = sum(counts.values())
    bar = run.bar(len(chosen), unit="world", desc="exactcheck: tree-loop worlds")
    with run.interruptible():
        draws = run.executor(jobs).submit(_drive_world, [(generator, w, counts[w.name], derive_seed(seed, w.name),
                                                          prompt_seed) for w in chosen])
        for w, draw in zip(chosen, draws):
            world_seed = derive_seed(seed, w.name)
            base = dict(world=w.name, seed=world_seed, reproduce=line(w.name))
            try:
                samples = draw()
                if isinstance(samples, SubjectError):
                    raise samples
            except SubjectError as exc:
                run.crashed(exc, world=w.name, seed=world_seed, samples=counts[w.name], condition="every generation")
                continue
            run.drawn += samples.size
            run.extend(tree_generation_verdicts(samples, budget.first_share, alpha, base))
            bar.step(w.name)
    extra = {} if require is None else {"require": tuple(require)}
    return run.finish(TreeGenerationAuditResult, subject=name, level=level, seed=seed, alpha=alpha, device="cpu",
                      environment=run_environment(), **extra)


def _drive_world(generator, world: TreeWorld, trials: int, seed: int, prompt_seed: int):
    """One world's draws (in a worker process with ``--jobs``): the samples, or the subject's error."""
    try:
        return drive_tree_generator(generator, world, trials, seed, prompt_seed)
    except SubjectError as exc:
        return exc


def _worlds(worlds) -> list[TreeWorld]:
    if worlds is None:
        return generation_tree_worlds()
    known = {w.name: w for w in tree_worlds()}
    out = []
    for w in worlds:
        if isinstance(w, str):
            if w not in known:
                raise UsageError(f"unknown tree world {w!r}; known: {sorted(known)}")
            w = known[w]
        out.append(w)
    return out
