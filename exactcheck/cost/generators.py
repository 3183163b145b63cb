"""The speed half of a lossless claim: what a speculative generator costs against the target alone.

``measure_cost`` runs a speculative generator and the target-only baseline (``TargetGenerate``:
the same target model and decoding policy, no draft) on the same prompts, per draft length,
interleaved in a random order after one warm-up run of each, and records per request: wall time
(the generate call, from call to return, with CUDA synchronised; prefill is the time to the end of
the target's first forward call), target and draft forward calls (forward hooks on the two
models), new tokens, and peak memory (the CUDA allocator's peak per request on a GPU; on a CPU the
process's peak resident set, which only grows, so it is reported once per mode, not per request).

``summarise`` turns the records into the report's figures, each with its uncertainty:

- ``speedup``: the paired ratio of baseline to speculative time, sum over requests of baseline
  time / sum of speculative time, with a percentile bootstrap interval over requests;
- ``fraction_slower``: the share of requests whose speculative run took longer than its paired
  baseline, with a Clopper-Pearson interval;
- ``accepted_per_round_mean``: accepted drafts per verification round, pooled: (new tokens -
  rounds) / rounds summed over requests, a round being one target forward call (each round calls
  the target once; the first also reads the prompt), with a bootstrap interval;
- target and draft forward calls per new token.

On a toy world with the plain sampling policy, ``expected_accepted_per_round`` gives the exact
expectation of that pooled ratio for a loop that drafts k tokens from the world's draft law
every round, verifies them by Leviathan's rule and stops at max_new_tokens:
(L - E[R]) / E[R], E[R] the expected rounds, computed in float64 by dynamic programming over
(state, tokens so far) from the world's rows.
"""
from __future__ import annotations

import math
import platform
import random
import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from exactcheck.contracts.generator import call_generator, generator_name, is_lossy, with_draft_length

__all__ = ["RequestCost", "CostSummary", "measure_cost", "summarise", "expected_accepted_per_round",
           "CONFIDENCE", "BOOTSTRAP"]

CONFIDENCE = 0.95
BOOTSTRAP = 2000


@dataclass(frozen=True)
class RequestCost:
    """One timed request."""

    mode: str  # "baseline" or "speculative"
    prompt: int  # index of the prompt
    draft_length: int | None  # the speculative run's draft length (its baseline carries the same)
    seed: int
    wall_s: float
    prefill_s: float
    target_calls: int
    draft_calls: int
    new_tokens: int
    peak_memory_bytes: int | None  # CUDA allocator peak of this request; None on a CPU

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s

    @property
    def accepted(self) -> int:
        """Drafts accepted over the request: new tokens minus verification rounds."""
        return self.new_tokens - self.target_calls


class _Calls:
    """Forward-call counters (and the end of the target's first call) on the two models."""

    def __init__(self, target, draft, device):
        self.device = device
        self.target = self.draft = 0
        self.first_target_end: float | None = None
        self.handles = [target.register_forward_hook(self._on_target)]
        if draft is not None and draft is not target:
            self.handles.append(draft.register_forward_hook(self._on_draft))

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _on_target(self, *_):
        self.target += 1
        if self.first_target_end is None:
            self._sync()
            self.first_target_end = time.perf_counter()

    def _on_draft(self, *_):
        self.draft += 1

    def reset(self):
        self.target = self.draft = 0
        self.first_target_end = None

    def close(self):
        for handle in self.handles:
            handle.remove()


def _timed(generator, target, draft, prompt, policy, new_tokens, seed, vocab, calls: _Calls, mode, index, k):
    device = calls.device
    calls.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    new, _ = call_generator(generator, target, draft, prompt[None].to(device), policy, new_tokens, seed, vocab)
    calls._sync()
    wall = time.perf_counter() - start
    prefill = (calls.first_target_end - start) if calls.first_target_end is not None else 0.0
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return RequestCost(mode, index, k, seed, wall, prefill, calls.target, calls.draft, int(new.numel()), peak)


def measure_cost(generator, target, draft, prompts: list[torch.Tensor], policy, new_tokens: int,
                 draft_lengths=(1, 2, 4, 8), seed: int = 0, progress=None) -> tuple[list[RequestCost], dict]:
    """Every (prompt, draft length) pair run speculatively and by the baseline, in a random order
    (seeded), after one warm-up of each; (records, process peak memory per mode on a CPU)."""
    from exactcheck.adapters.hf_generate import TargetGenerate
    baseline = TargetGenerate()
    device = target.device
    vocab = target.config.vocab_size
    lengths = tuple(draft_lengths) if hasattr(generator, "draft_length") else (None,)
    jobs = [(mode, i, k) for i in range(len(prompts)) for k in lengths for mode in ("baseline", "speculative")]
    random.Random(seed).shuffle(jobs)
    calls = _Calls(target, draft, device)
    records, peaks = [], {}
    try:
        for mode in ("baseline", "speculative"):  # warm-up, not recorded
            subject = baseline if mode == "baseline" else (generator if lengths[0] is None
                                                             else with_draft_length(generator, lengths[0]))
            _timed(subject, target, draft, prompts[0], policy, new_tokens, seed, vocab, calls, mode, 0, lengths[0])
        for done, (mode, i, k) in enumerate(jobs):
            subject = baseline if mode == "baseline" else (generator if k is None else with_draft_length(generator, k))
            request_seed = seed * 1_000_003 + i  # the same seed for a request's two runs
            records.append(_timed(subject, target, draft, prompts[i], policy, new_tokens, request_seed, vocab,
                                  calls, mode, i, k))
            if device.type != "cuda":
                peaks[mode] = max(peaks.get(mode, 0), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
            if progress is not None:
                progress(done + 1, len(jobs))
    finally:
        calls.close()
    return records, peaks


# ---- statistics --------------------------------------------------------------------------------

def _interval(samples: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    return float(np.quantile(samples, tail)), float(np.quantile(samples, 1 - tail))


def _clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    from scipy.stats import beta
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(beta.ppf(tail, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - tail, k + 1, n - k))
    return low, high


@dataclass(frozen=True)
class CostSummary:
    """The figures of one group of paired requests (all draft lengths, or one)."""

    requests: int
    speedup: dict
    fraction_slower: dict
    accepted_per_round_mean: dict
    target_calls_per_token: dict
    draft_calls_per_token: dict
    peak_memory_bytes: dict
    wall_s: dict
    prefill_s: dict
    ratios: list = field(default_factory=list)  # per request: baseline time / speculative time

    def to_dict(self) -> dict:
        return asdict(self)


def _pairs(records: list[RequestCost]) -> list[tuple[RequestCost, RequestCost]]:
    by_key = {}
    for r in records:
        by_key.setdefault((r.prompt, r.draft_length), {})[r.mode] = r
    return [(v["baseline"], v["speculative"]) for _, v in sorted(by_key.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0]))
            if "baseline" in v and "speculative" in v]


def summarise(records: list[RequestCost], cpu_peaks: dict | None = None, seed: int = 0,
              confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP) -> CostSummary:
    """The report's figures for ``records`` (see the module docstring)."""
    pairs = _pairs(records)
    n = len(pairs)
    base = np.array([b.wall_s for b, _ in pairs])
    spec = np.array([s.wall_s for _, s in pairs])
    rounds = np.array([s.target_calls for _, s in pairs], dtype=float)
    accepted = np.array([s.accepted for _, s in pairs], dtype=float)
    tokens = np.array([s.new_tokens for _, s in pairs], dtype=float)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n))
    boot_speedup = base[idx].sum(1) / spec[idx].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_accepted = accepted[idx].sum(1) / rounds[idx].sum(1)
    slower = int((spec > base).sum())
    low, high = _clopper_pearson(slower, n, confidence)
    speedup = {"estimate": float(base.sum() / spec.sum()), "low": _interval(boot_speedup, confidence)[0],
               "high": _interval(boot_speedup, confidence)[1], "confidence": confidence,
               "method": f"sum of baseline times / sum of speculative times over {n} paired requests; "
                         f"percentile bootstrap over requests ({resamples} resamples)"}
    acc_low, acc_high = _interval(boot_accepted[np.isfinite(boot_accepted)], confidence)
    gpu_peaks = [r.peak_memory_bytes for r in records if r.peak_memory_bytes is not None]
    if gpu_peaks:
        memory = {mode: max(r.peak_memory_bytes for r in records if r.mode == mode)
                  for mode in ("baseline", "speculative")}
        memory["scope"] = "CUDA allocator peak (max over the mode's requests)"
    else:
        memory = {"baseline": (cpu_peaks or {}).get("baseline"), "speculative": (cpu_peaks or {}).get("speculative"),
                  "scope": "process peak resident set (CPU: it only grows, so the later mode includes the earlier)"}
    return CostSummary(
        requests=n, speedup=speedup,
        fraction_slower={"estimate": slower / n if n else math.nan, "low": low, "high": high, "slower": slower,
                         "requests": n, "confidence": confidence, "method": "Clopper-Pearson"},
        accepted_per_round_mean={"estimate": float(accepted.sum() / rounds.sum()), "low": acc_low, "high": acc_high,
                                 "confidence": confidence,
                                 "method": "(new tokens - rounds) / rounds, pooled over requests; a round is one "
                                           "target forward call; percentile bootstrap"},
        target_calls_per_token={"baseline": float(sum(b.target_calls for b, _ in pairs) / max(1, sum(b.new_tokens for b, _ in pairs))),
                                "speculative": float(rounds.sum() / max(1, tokens.sum()))},
        draft_calls_per_token={"speculative": float(sum(s.draft_calls for _, s in pairs) / max(1, tokens.sum()))},
        peak_memory_bytes=memory,
        wall_s={"baseline_mean": float(base.mean()), "speculative_mean": float(spec.mean())},
        prefill_s={"baseline_mean": float(np.mean([b.prefill_s for b, _ in pairs])),
                   "speculative_mean": float(np.mean([s.prefill_s for _, s in pairs]))},
        ratios=[float(x) for x in base / spec])


# ---- the exact expectation on a toy world ------------------------------------------------------

def expected_accepted_per_round(world, draft_length: int, new_tokens: int) -> float:
    """E[accepted drafts] / E[rounds] for ``new_tokens`` tokens of ``world`` (a ``ModelWorld``
    under the plain sampling policy) by a loop that drafts ``draft_length`` tokens from the draft
    law each round, verifies by Leviathan's rule and stops at ``new_tokens``: (L - E[R]) / E[R]."""
    context = world.world
    p, q = context.target.law(), context.draft.law()
    vocab, k, length = context.vocab_size, draft_length, new_tokens
    outcomes: dict[int, list[tuple[float, int, int]]] = {}

    def round_outcomes(state: int) -> list[tuple[float, int, int]]:
        """(probability, tokens emitted, state after them) of one round from ``state``."""
        if state in outcomes:
            return outcomes[state]
        found: dict[tuple[int, int], float] = {}

        def walk(s: int, depth: int, reach: float):
            # reach: P(drafts so far drawn and accepted); at depth k every draft was accepted
            if depth == k:
                for y in range(vocab):
                    if p[s, y] > 0:
                        key = (k + 1, int(context.next_state(s, y)))
                        found[key] = found.get(key, 0.0) + reach * p[s, y]
                return
            residual = np.clip(p[s] - q[s], 0, None)
            mass = residual.sum()
            residual = residual / mass if mass > 0 else p[s]
            for x in range(vocab):
                if q[s, x] <= 0:
                    continue
                accept = min(1.0, p[s, x] / q[s, x])
                if accept > 0:
                    walk(int(context.next_state(s, x)), depth + 1, reach * q[s, x] * accept)
                if accept < 1:
                    for y in range(vocab):
                        if residual[y] > 0:
                            key = (depth + 1, int(context.next_state(s, y)))
                            found[key] = found.get(key, 0.0) + reach * q[s, x] * (1 - accept) * residual[y]

        walk(state, 0, 1.0)
        outcomes[state] = [(prob, emitted, after) for (emitted, after), prob in found.items()]
        return outcomes[state]

    memo: dict[tuple[int, int], float] = {}

    def rounds(state: int, done: int) -> float:
        if done >= length:
            return 0.0
        if (state, done) not in memo:
            memo[(state, done)] = 1.0 + sum(prob * rounds(after, done + emitted)
                                            for prob, emitted, after in round_outcomes(state)
                                            if done + emitted < length)
        return memo[(state, done)]

    expected_rounds = rounds(int(context.prompt_state), 0)
    return (length - expected_rounds) / expected_rounds


def environment(target) -> dict:
    """What the times were measured on (the report's denominators)."""
    device = target.device
    hardware = (torch.cuda.get_device_name(device) if device.type == "cuda"
                else f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    return {"device": str(device), "hardware": hardware, "precision": str(next(target.parameters()).dtype
                                                                            if any(True for _ in target.parameters())
                                                                            else "float32"),
            "torch": torch.__version__, "python": platform.python_version()}


def describe_generator(generator) -> dict:
    return {"name": generator_name(generator), "lossy": is_lossy(generator)}


def run_cost(generator, *, model: str | None = None, world: str | None = None, draft_lengths=(1, 2, 4, 8),
             prompts: int = 8, new_tokens: int | None = None, policy=None, device="cpu", seed: int = 0,
             exactness=None, progress: bool = True, reproduce: str = "") -> dict:
    """Measure ``generator``'s cost on a real model pair (``model``: tiny-llama, tiny-gpt2,
    smollm2) or a toy model world (``world``); the report's JSON
    (``exactcheck.report.cost_report.COST_SCHEMA``). ``exactness``: the audit of the generator's
    exactness on the same models, put in the same report (a function the registry hands over:
    ``exactcheck.e2e.entry.cost_exactness``; None or False, no audit).

    Three steps: plan (the models and prompts, ``_cost_models``), drive (the timed requests,
    ``_CostRun.measure``), finish (the report's JSON, ``_CostRun.report``, with the exactness audit)."""
    from exactcheck.contracts.policy import SAMPLING
    from exactcheck.errors import UsageError
    if (model is None) == (world is None):
        raise UsageError("give exactly one of --model and --world")
    device = torch.device(device)
    models = _cost_models(model, world, prompts, new_tokens, seed, device)
    cost = _CostRun(generator, models, model or f"toy world {world}", policy or SAMPLING, draft_lengths,
                    tuple(draft_lengths) if hasattr(generator, "draft_length") else (None,), seed, progress, reproduce)
    records, peaks = cost.measure()
    data = cost.report(records, peaks)
    if callable(exactness):
        data["exactness"] = exactness(generator, model, models.toy, models.target, models.draft,
                                      models.all_prompts if model else None, prompts, models.new_tokens,
                                      draft_lengths, seed, device, progress)
    return data


@dataclass(frozen=True)
class _CostModels:
    """What a cost run measures on: the target and its draft (on the device, in eval mode), a model
    pair's prompts (None for a toy world), the prompts chosen, the new tokens per request, and the
    toy world (None for a model pair)."""

    target: object
    draft: object
    all_prompts: list | None
    chosen: list
    new_tokens: int
    toy: object = None


def _cost_models(model: str | None, world: str | None, prompts: int, new_tokens: int | None, seed: int,
                 device: torch.device) -> _CostModels:
    """A real model pair (``model``) with its first ``prompts`` prompts, or a toy world (``world``)
    with its first prompt ``prompts`` times."""
    from exactcheck.errors import UsageError
    if model is not None:
        from toy_models.model_pairs import model_pair
        try:
            target, draft, all_prompts = model_pair(model, seed)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        if prompts > len(all_prompts):
            raise UsageError(f"{model} has {len(all_prompts)} prompts; asked for {prompts}")
        return _CostModels(target.to(device).eval(), draft.to(device).eval(), all_prompts, all_prompts[:prompts],
                           new_tokens or 32)
    from toy_models.suite import all_model_worlds
    known = {w.name: w for w in all_model_worlds() if w.policy is None}
    if world not in known:
        raise UsageError(f"unknown world {world!r}; known: {sorted(known)}")
    toy = known[world]
    target, draft = toy.models()
    return _CostModels(target.to(device).eval(), draft.to(device).eval(), None, [toy.prompt_ids()[0]] * prompts,
                       new_tokens or toy.new_tokens, toy)


@dataclass(frozen=True)
class _CostRun:
    """One cost measurement: the generator, its models, what the report calls them (``label``), the
    policy, the draft lengths asked for and those measured (``lengths``: (None,) for a generator
    without ``draft_length``), the seed, and the reproduce line."""

    generator: object
    models: _CostModels
    label: str
    policy: object
    draft_lengths: object
    lengths: tuple
    seed: int
    progress: bool
    reproduce: str

    def measure(self) -> tuple[list[RequestCost], dict]:
        """The timed requests (``measure_cost``), under the run core's bar and clock: a measurement,
        not a test (no checks, no Holm)."""
        from exactcheck.audit_run import AuditRun
        models = self.models
        run = AuditRun((), None, self.seed, lambda _world: self.reproduce, progress=self.progress)
        bar = run.bar(len(models.chosen) * len(self.lengths) * 2, unit="request", desc="exactcheck: cost")
        done = [0]

        def step(finished, _total):
            bar.step("timed requests", finished - done[0])
            done[0] = finished

        records, peaks = measure_cost(self.generator, models.target, models.draft, models.chosen, self.policy,
                                      models.new_tokens, self.draft_lengths, self.seed, step)
        run.close_bars()
        return records, peaks

    def by_length(self, records: list[RequestCost], peaks: dict) -> list[dict]:
        """The summary of each draft length's requests (with the exact expected accepted drafts per
        round on a toy world under plain sampling)."""
        from exactcheck.contracts.policy import SAMPLING
        toy, rows = self.models.toy, []
        for k in self.lengths:
            part = summarise([r for r in records if r.draft_length == k], peaks, self.seed)
            row = {"draft_length": k, **part.to_dict()}
            row.pop("ratios")
            if toy is not None and k is not None and self.policy == SAMPLING:
                row["expected_accepted_per_round"] = expected_accepted_per_round(toy, k, self.models.new_tokens)
            rows.append(row)
        return rows

    def report(self, records: list[RequestCost], peaks: dict) -> dict:
        """The report's JSON (``COST_SCHEMA``): the records, the cost overall and per draft length,
        and what the times are per (the denominators)."""
        from exactcheck.report.cost_report import COST_SCHEMA
        from exactcheck.version import __version__
        models, new_tokens = self.models, self.models.new_tokens
        overall = summarise(records, peaks, self.seed)
        by_length = self.by_length(records, peaks)
        cost = overall.to_dict()
        cost["by_draft_length"] = by_length
        data = {
            "schema": COST_SCHEMA, "generator": describe_generator(self.generator),
            "model": self.label, "seed": self.seed,
            "records": [{**asdict(r), "decode_s": r.decode_s} for r in records],
            "cost": cost,
            "denominators": {
                "time": ("wall time of one generate call, from call to return (CUDA synchronised); prefill is the "
                         "time to the end of the target's first forward call (for a speculative run it includes the "
                         "first drafts); model loading and one warm-up "
                         "run per mode excluded; the baseline is the target alone (transformers generate, no draft) "
                         "under the same policy and seed, each pair run in a random order"),
                **environment(models.target), "prompt_lengths": sorted({int(p.numel()) for p in models.chosen}),
                "draft_lengths": [k for k in self.lengths if k is not None],
                "new_tokens": new_tokens, "policy": self.policy.label(), "exactcheck": __version__},
            "reproduce": self.reproduce,
        }
        if models.toy is not None:
            data["expected_note"] = ("Expected accepted drafts per round: exact, for a loop that drafts k tokens from "
                                     "the world's draft law every round, verifies by Leviathan's rule and stops at "
                                     f"{new_tokens} tokens ((L - E[R]) / E[R] by dynamic programming over the world's "
                                     "rows).")
        return data
