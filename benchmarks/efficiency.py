"""How close to the limit: trials to a verdict per mutant, exactcheck next to the oracle and the peers.

For every mutant of the corpus whose output law has a closed form (``exactcheck.step.mutant_laws``)
this computes, on every step world, the exact law of one step's whole output (the emitted drafts
and the token after them) under the mutant and under the rule the mutant declares, and keeps the
world where the oracle below needs the fewest trials. Trials are then drawn from the mutant's
exact law (checked against the mutant's own samples by ``property_tests/step/test_mutant_laws.py``), the
same stream for every test of a seed, and each test is scored by its trials to detection at
alpha = 1e-3:

- **exactcheck**: the world's laws as the audit runs them at ``--level`` (its planned budget, its
  batch schedule, its e-processes and threshold 2m/alpha, the fixed-budget Pearson tests at the
  first Holm share at the end): the trials drawn on that world when it first shows the defect;
- **oracle**: Wald's SPRT between the declared rule's exact output law and the mutant's
  (alpha = 1e-3, beta = 0.1): among all tests with those error rates it has the smallest expected
  number of trials under either law (Wald & Wolfowitz 1948); its trials are its sample number,
  whatever it decided (the "found" column counts the runs that decided "mutant");
- **fixed chi-square**: Pearson on the whole output law, cells pooled to expected counts >= 5, n
  planned to detect the mutant's true TV with power 0.9 (``exactcheck.stats.planning``): the
  best a fixed-n test can be told in advance;
- **peers** (``benchmarks/peers.py``) at their own sample sizes and thresholds.

A sequential test's median and p90 are those of its stopping trial over the seeds (a run that never
detects counts as infinite); a fixed-n test's are its n when at least 50% (90%) of the seeds detect
at n, else "miss". The ratio divides by the oracle's median (p90 by p90).

    python benchmarks/efficiency.py --seeds 50 --level standard --json reports/efficiency-standard.json
    git show c82141c:exactcheck/stats/sequential.py > /tmp/sequential_c82141c.py
    python benchmarks/efficiency.py --seeds 50 --sequential-from /tmp/sequential_c82141c.py --label c82141c \
        --json reports/efficiency-standard-c82141c.json
    python benchmarks/efficiency.py --compare reports/efficiency-standard-c82141c.json reports/efficiency-standard.json
"""
from __future__ import annotations

import argparse
import functools
import html
import json
import math
import runpy
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from exactcheck.options import AuditOptions, derive_seed
from exactcheck.report.html import html_page
from exactcheck.rules import rule_spec, step_laws
from exactcheck.stats.goodness_of_fit import goodness_of_fit
from exactcheck.step.laws import compare
from exactcheck.stats.planning import trials_to_detect
from exactcheck.stats.sequential import EProcess, batch_schedule
from exactcheck.step.drive import StepSamples
from exactcheck.step.mutant_laws import NO_LAW, cell_offsets, mutant_emission, mutant_output_law, output_law
from exactcheck.step.mutants import MUTANTS, SMALL_BIAS_MUTANTS
from exactcheck.step.plan import plan_step_audit
from exactcheck.step.verdicts import WorldRun, law_alternatives
from toy_models.step_worlds import step_worlds

from peers import (OWN_TRIALS, deepspec_fails, pytest_stochastic_fails, smell_test_fails, trtllm_kl_fails,
                   vllm_l2_fails, vllm_v2_chi2_fails)

ALPHA, BETA = 1e-3, 0.1
ORACLE_CAP = 20_000_000  # the oracle's trials at most (a mutant past it is reported as such)
PEERS = tuple(OWN_TRIALS)


@dataclass
class Case:
    """One mutant on one world: the exact law of a step's output under the declared rule and
    under the mutant, over every output sequence (``exactcheck.step.mutant_laws.output_law``)."""

    mutant: str
    rule: str
    world: object
    exact: np.ndarray
    law: np.ndarray
    outputs: np.ndarray = field(repr=False, default=None)  # [cells, k+1]: each cell's output row

    def __post_init__(self):
        self.cdf = np.cumsum(self.law)
        positive = self.law > 0
        with np.errstate(divide="ignore"):
            self.llr = np.where(positive, np.log(np.where(positive, self.law, 1.0))
                                - np.log(np.where(self.exact > 0, self.exact, 1.0)), 0.0)
        self.llr[positive & (self.exact <= 0)] = math.inf

    @property
    def tv(self) -> float:
        return 0.5 * float(np.abs(self.law - self.exact).sum())

    @property
    def impossible(self) -> float:
        """The mutant's mass on outputs the rule never emits."""
        return float(self.law[self.exact <= 0].sum())

    @property
    def kl(self) -> float:
        """KL(mutant || rule) over the outputs the rule can emit (the rest is ``impossible``)."""
        both = (self.law > 0) & (self.exact > 0)
        return float((self.law[both] * np.log(self.law[both] / self.exact[both])).sum())

    @property
    def oracle_scale(self) -> float:
        """Wald's approximate expected trials under the mutant (log(1/alpha) over the KL, or one
        over the impossible mass if that comes first): how the world is chosen."""
        by_kl = math.log((1 - BETA) / ALPHA) / self.kl if self.kl > 0 else math.inf
        return min(by_kl, 1 / self.impossible if self.impossible > 0 else math.inf)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` output cells from the mutant's law (never a cell of probability 0)."""
        return np.minimum(np.searchsorted(self.cdf, rng.random(n) * self.cdf[-1], side="right"), self.law.size - 1)

    def rows(self, cells: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(self.outputs[cells])


def output_rows(k: int, vocab: int) -> np.ndarray:
    """Each cell of ``output_law`` as its output row (tokens, then -1 padding) [cells, k+1]."""
    offsets = cell_offsets(k, vocab)
    rows = np.full((offsets[-1], k + 1), -1, dtype=np.int64)
    for j in range(k + 1):
        codes = np.arange(vocab ** (j + 1))
        rows[offsets[j]:offsets[j + 1], :j + 1] = np.stack(np.unravel_index(codes, (vocab,) * (j + 1)), 1)
    return rows


def cases(names: list[str] | None) -> tuple[list[Case], dict[str, str]]:
    """The easiest world for the oracle of every mutant with a law, and why the others have none."""
    corpus = dict(MUTANTS, **SMALL_BIAS_MUTANTS)
    chosen, skipped = [], {}
    # rows handed in float32: a world rounded to float16 / bfloat16 hands rows whose sums are off
    # by up to 1e-3, so every verifier reading them (the exact reference too) is about 1e-4 in TV
    # from the world's renormalised law, a gap the oracle would take for the mutant's
    worlds = [w for w in step_worlds() if w.input_dtype == torch.float32]
    for name, mutant in corpus.items():
        if names and name not in names:
            continue
        emission = mutant_emission(mutant.verifier)
        if emission is None:
            skipped[name] = NO_LAW[type(mutant.verifier)]
            continue
        spec = rule_spec(mutant.rule)
        best = None
        for world in worlds:
            exact = output_law(spec.emission, world.target_law(), world.draft_law())
            case = Case(name, mutant.rule, world, exact, mutant_output_law(emission, world))
            if best is None or case.oracle_scale < best.oracle_scale:
                best = case
        if not math.isfinite(best.oracle_scale):
            skipped[name] = "its output law equals the rule's on every world"
            continue
        best.outputs = output_rows(best.world.draft_length, best.world.vocab_size)
        chosen.append(best)
    return chosen, skipped


@functools.lru_cache(maxsize=None)
def audit_plan(level: str, rule: str):
    return plan_step_audit(AuditOptions.build(level=level, acceptance_rule=rule, properties=False))


# ---- the tests ---------------------------------------------------------------------------------

def sampled_world_run(world, plans, n: int, budget, sample) -> WorldRun:
    """One world's laws through the audit's looks (its batch schedule, its e-processes, its threshold
    ``budget.log_e_threshold``) on samples from ``sample(size)`` (a ``StepSamples`` or
    ``SequenceSamples``): the run, stopped at the first look that shows a defect (``run.drawn``
    then says where) or at the budget."""
    run = WorldRun(world, 0, n, list(plans), batch_schedule(n), [np.zeros(p.expected.size, dtype=np.int64) for p in plans],
                   [[EProcess(expected, n * p.condition_probability, p.groupings) for _, expected in law_alternatives(p)]
                    for p in plans])
    for size in run.batches:
        samples = sample(size)
        run.drawn += size
        crossed = False
        for i, law in enumerate(run.plans):
            run.counts[i] += compare(law, samples).counts
            crossed |= run.look(i) >= budget.log_e_threshold
        if crossed:
            break
    return run


def fixed_pvalues(run: WorldRun, share: float) -> list[float]:
    """The fixed-budget Pearson p-value of each law of a run (the best-fitting alternative's)."""
    return [max(goodness_of_fit(run.counts[i], expected, share).pvalue for _, expected in law_alternatives(law))
            for i, law in enumerate(run.plans)]


def exactcheck_trials(case: Case, level: str, rng: np.random.Generator) -> int | None:
    """Trials on the case's world until the audit's checks of that world show the defect (None:
    not at the world's budget)."""
    plan = audit_plan(level, case.rule)
    name = case.world.name
    n, budget = plan.world_samples(name), plan.budget

    def sample(size: int) -> StepSamples:
        rows = case.rows(case.draw(rng, size))
        return StepSamples(case.world, rows, rows[:, :-1], 0, 1)

    run = sampled_world_run(case.world, plan.world_laws(name), n, budget, sample)
    if run.drawn < n:
        return run.drawn
    # no e-process crossed: the fixed-budget Pearson tests, Holm's first step over the family
    return n if min(fixed_pvalues(run, budget.first_share)) <= budget.first_share else None


def oracle_trials(case: Case, rng: np.random.Generator, audit_threshold: float) -> tuple[int | None, bool, int | None, int | None]:
    """The likelihood-ratio walk of the case's stream against the rule's law: (Wald's SPRT at
    alpha, beta: trials to its decision, whether it decided "mutant"; the power-one test, which
    only stops when the ratio reaches 1/alpha; the same at the audit's bar ``audit_threshold``
    (log 2m/alpha): trials to each, None past ``ORACLE_CAP``)."""
    upper, lower, one = math.log((1 - BETA) / ALPHA), math.log(BETA / (1 - ALPHA)), math.log(1 / ALPHA)
    total, drawn, chunk = 0.0, 0, 64
    wald: tuple[int | None, bool] = (None, False)
    firsts: dict[float, int] = {}
    while drawn < ORACLE_CAP:
        path = total + np.cumsum(case.llr[case.draw(rng, chunk)])
        if wald[0] is None:
            hit = np.flatnonzero((path >= upper) | (path <= lower))
            if hit.size:
                wald = (drawn + int(hit[0]) + 1, bool(path[hit[0]] >= upper))
        for bar in (one, audit_threshold):
            crossed = np.flatnonzero(path >= bar)
            if bar not in firsts and crossed.size:
                firsts[bar] = drawn + int(crossed[0]) + 1
        if len(firsts) == 2:
            break
        total, drawn, chunk = float(path[-1]), drawn + chunk, min(2 * chunk, 1 << 20)
    return (*wald, firsts.get(one), firsts.get(audit_threshold))


def fixed_trials(case: Case) -> int | None:
    """n at which a pooled Pearson test of the whole output law detects the mutant's true TV with
    power 0.9 at alpha (None: more than ``ORACLE_CAP``)."""
    return trials_to_detect(case.exact, case.tv, ALPHA, ORACLE_CAP)


def fixed_detects(case: Case, n: int, cells: np.ndarray) -> bool:
    return goodness_of_fit(np.bincount(cells[:n], minlength=case.exact.size), case.exact, ALPHA).pvalue <= ALPHA


def position_laws(case: Case) -> np.ndarray:
    laws = step_laws(rule_spec(case.rule), case.world.target_law(), case.world.draft_law(), enumerated=True).emitted
    mass = laws.sum(1, keepdims=True)
    return np.where(mass > 0, laws / np.where(mass > 0, mass, 1.0), 0.0)


def peer_fails(peer: str, case: Case, cells: np.ndarray, rng: np.random.Generator) -> bool:
    n = OWN_TRIALS[peer]
    first = case.outputs[cells[:n], 0]
    p0 = case.world.target_law()[0]
    if peer == "vllm-l2":
        return vllm_l2_fails(first, p0, n, rng)
    if peer == "trtllm-kl":
        return trtllm_kl_fails(first, p0, n, rng)
    if peer == "vllm-v2-chi2":
        return vllm_v2_chi2_fails(first, p0, n)
    if peer == "smell-test":
        return smell_test_fails(cells, case.exact, n)
    if peer == "deepspec-chi2":
        return deepspec_fails(case.outputs[cells[:n]], position_laws(case), n)
    if peer == "pytest-stochastic":
        return pytest_stochastic_fails(first, p0, n)
    raise ValueError(peer)


# ---- scoring -------------------------------------------------------------------------------------

def quantiles(stops: list[int | None]) -> tuple[float, float]:
    """(median, p90) of stopping trials, a run that never stopped counting as infinite."""
    values = np.array([math.inf if s is None else s for s in stops], dtype=np.float64)
    return float(np.quantile(values, 0.5, method="higher")), float(np.quantile(values, 0.9, method="higher"))


def fixed_quantiles(n: int | None, detected: list[bool]) -> tuple[float, float]:
    rate = float(np.mean(detected)) if detected else 0.0
    if n is None:
        return math.inf, math.inf
    return (n if rate >= 0.5 else math.inf), (n if rate >= 0.9 else math.inf)


def measure(case: Case, seeds: int, level: str, root: int) -> dict:
    ours, oracle, found, power_one, at_bar = [], [], 0, [], []
    bar = audit_plan(level, case.rule).budget.log_e_threshold
    fixed_n = fixed_trials(case)
    fixed, peers = [], {peer: [] for peer in PEERS}
    lossy = not rule_spec(case.rule).exact
    for s in range(seeds):
        seed = derive_seed(root, f"efficiency/{case.mutant}/{s}")
        ours.append(exactcheck_trials(case, level, np.random.default_rng(seed)))
        stop, decided, one, audit_bar = oracle_trials(case, np.random.default_rng(seed + 1), bar)
        oracle.append(stop)
        found += decided
        power_one.append(one)
        at_bar.append(audit_bar)
        rng = np.random.default_rng(seed + 2)
        cells = case.draw(rng, max([*OWN_TRIALS.values(), fixed_n or 0]) if (fixed_n or 0) <= 2_000_000
                          else max(OWN_TRIALS.values()))
        if fixed_n is not None and fixed_n <= cells.size:
            fixed.append(fixed_detects(case, fixed_n, cells))
        for peer in PEERS if not lossy else ():
            peers[peer].append(peer_fails(peer, case, cells, rng))
    row = {
        "mutant": case.mutant, "rule": case.rule, "world": case.world.name, "tv": case.tv,
        "impossible_mass": case.impossible, "kl": case.kl, "seeds": seeds,
        "exactcheck": dict(zip(("median", "p90"), quantiles(ours)), detected=sum(s is not None for s in ours)),
        "oracle": dict(zip(("median", "p90"), quantiles(oracle)), decided_mutant=found),
        "power_one": dict(zip(("median", "p90"), quantiles(power_one))),
        # the known-alternative likelihood ratio at the audit's own bar: what Bonferroni over the
        # audit's checks costs before any learning
        "lr_at_audit_bar": dict(zip(("median", "p90"), quantiles(at_bar)), log_bar=bar),
        "fixed_chi2": dict(zip(("median", "p90"), fixed_quantiles(fixed_n if fixed else None, fixed)),
                           n=fixed_n, power=float(np.mean(fixed)) if fixed else None),
        "peers": {peer: dict(zip(("median", "p90"), fixed_quantiles(OWN_TRIALS[peer], hits)),
                             n=OWN_TRIALS[peer], power=float(np.mean(hits)))
                  for peer, hits in peers.items() if hits},
    }
    row["ratio"] = _ratio(row["exactcheck"]["median"], row["oracle"]["median"])
    row["ratio_p90"] = _ratio(row["exactcheck"]["p90"], row["oracle"]["p90"])
    row["ratio_power_one"] = _ratio(row["exactcheck"]["median"], row["power_one"]["median"])
    return row


def _ratio(a: float, b: float) -> float:
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.inf


def _n(x: float) -> str:
    return "miss" if not math.isfinite(x) else f"{int(x):,}"


def _r(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:.1f}"


def markdown(rows: list[dict], skipped: dict[str, str], header: str) -> str:
    peers = [p for p in PEERS]
    lines = [header, "",
             "| mutant | world | TV | exactcheck med / p90 | oracle SPRT med / p90 (power) | ratio med (p90) | "
             "power-one LR med / p90 (ratio) | LR at 2m/α med | fixed χ² n (power) | "
             + " | ".join(f"{p} (n={OWN_TRIALS[p]:,})" for p in peers) + " |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(peers)]
    for r in rows:
        e, o, f = r["exactcheck"], r["oracle"], r["fixed_chi2"]
        fixed = "–" if f["n"] is None else f"{f['n']:,} ({f['power']:.2f})" if f["power"] is not None else f"{f['n']:,}"
        cells = []
        for p in peers:
            got = r["peers"].get(p)
            cells.append("n/a (lossy rule)" if got is None else
                         (f"{got['power']:.2f}" + (f" · {got['n'] / o['median']:.0f}×" if got["power"] >= 0.9
                                                   and math.isfinite(o["median"]) else "")))
        one = r["power_one"]
        lines.append(f"| {r['mutant']} | {r['world']} | {r['tv']:.4f} | {_n(e['median'])} / {_n(e['p90'])} | "
                     f"{_n(o['median'])} / {_n(o['p90'])} ({o['decided_mutant'] / r['seeds']:.2f}) | "
                     f"{_r(r['ratio'])} ({_r(r['ratio_p90'])}) | {_n(one['median'])} / {_n(one['p90'])} "
                     f"({_r(r['ratio_power_one'])}) | {_n(r['lr_at_audit_bar']['median'])} | {fixed} | "
                     + " | ".join(cells) + " |")
    finite = [r for r in rows if math.isfinite(r["ratio"])]
    beyond = [r["mutant"] for r in rows if not math.isfinite(r["oracle"]["median"])]
    if finite:
        ratios = [r["ratio"] for r in finite]
        lines += ["", f"Median ratio exactcheck / oracle over the {len(finite)} mutants both detect: "
                  f"**{np.median(ratios):.2f}** (p90 ratio {np.median([r['ratio_p90'] for r in finite]):.2f}); "
                  f"largest {max(ratios):.1f} ({', '.join(r['mutant'] for r in finite if r['ratio'] == max(ratios))}); "
                  "above 10: " + (", ".join(f"{r['mutant']} ({r['ratio']:.1f})" for r in finite if r["ratio"] > 10)
                                  or "none") + "."]
    missed = [r["mutant"] for r in rows if math.isfinite(r["oracle"]["median"]) and not math.isfinite(r["ratio"])]
    if missed:
        lines += ["", "Seen by the oracle but not by exactcheck at the world's budget: " + ", ".join(missed) + "."]
    if beyond:
        lines += ["", f"Beyond {ORACLE_CAP:,} trials for the oracle itself (no sample size in reach sees them; the "
                  "property search does): " + ", ".join(beyond) + "."]
    lines += ["", "Oracle SPRT: Wald's test at alpha 1e-3, beta 0.1, its trials to a decision either way (power: the "
              "share that decided 'mutant'). Power-one LR: the same likelihood ratio run until it reaches 1/alpha "
              "(an anytime test like exactcheck's, knowing the mutant); LR at 2m/α: the same at the audit's bar, log(2m/alpha) "
              "over its m statistical checks (what Bonferroni costs before anything is learned). Peers: the share of seeds each detects at "
              "its own n; × its n over the oracle's median where that share is at least 0.9.", "",
              "Mutants without a computable output law:", ""]
    lines += [f"- **{name}**: {why}" for name, why in skipped.items()]
    return "\n".join(lines) + "\n"


def svg_plot(rows: list[dict], width: int = 1000) -> str:
    """Trials to detection (median, log scale) per mutant: oracle, exactcheck, fixed chi-square."""
    series = [("oracle", "#57606a", lambda r: r["oracle"]["median"]),
              ("exactcheck", "#1a7f37", lambda r: r["exactcheck"]["median"]),
              ("fixed χ²", "#9a6700", lambda r: r["fixed_chi2"]["median"])]
    top = 10 ** 7
    row_h, left, plot_w = 18, 230, width - 260
    height = 40 + row_h * len(rows)

    def x(v: float) -> float:
        v = min(max(v, 1), top)
        return left + plot_w * math.log10(v) / math.log10(top)

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg" font-size="11">']
    for d in range(8):
        parts.append(f'<line x1="{x(10 ** d):.1f}" y1="20" x2="{x(10 ** d):.1f}" y2="{height - 10}" stroke="#d0d7de"/>'
                     f'<text x="{x(10 ** d):.1f}" y="14" text-anchor="middle">1e{d}</text>')
    for i, r in enumerate(rows):
        y = 28 + i * row_h
        parts.append(f'<text x="{left - 6}" y="{y + 4}" text-anchor="end">{html.escape(r["mutant"])}</text>')
        for j, (_, colour, get) in enumerate(series):
            v = get(r)
            if math.isfinite(v):
                parts.append(f'<circle cx="{x(v):.1f}" cy="{y + (j - 1) * 4}" r="3.5" fill="{colour}"/>')
            else:
                parts.append(f'<text x="{x(top) + 4:.1f}" y="{y + (j - 1) * 4 + 3}" fill="{colour}">miss</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><span class="swatch" style="background:{c}"></span>{html.escape(n)}</span>'
                     for n, c, _ in series)
    return f'<div class="legend">{legend}</div>' + "".join(parts)


def html_report(rows: list[dict], skipped: dict[str, str], header: str) -> str:
    table = markdown(rows, skipped, header)
    body = ["<h1>Trials to a verdict: exactcheck next to the oracle SPRT and the peers</h1>",
            f"<p>{html.escape(header)}</p>", "<h2>Median trials to detection (log scale)</h2>", svg_plot(rows),
            "<h2>Table</h2>", "<pre>" + html.escape(table) + "</pre>"]
    return html_page("exactcheck efficiency", body)


def peer_false_alarms(seeds: int, root: int) -> dict[str, dict[str, float]]:
    """Each peer at its own n on trials drawn from the exact token-wise law of every float32 step
    world: the share of seeds it reports a problem on (a false alarm), per world."""
    worlds = [w for w in step_worlds() if w.input_dtype == torch.float32]
    out: dict[str, dict[str, float]] = {}
    for world in worlds:
        exact = output_law(rule_spec("token-wise").emission, world.target_law(), world.draft_law())
        case = Case("reference", "token-wise", world, exact, exact)
        case.outputs = output_rows(world.draft_length, world.vocab_size)
        hits = {peer: 0 for peer in PEERS}
        for s in range(seeds):
            rng = np.random.default_rng(derive_seed(root, f"peer-false-alarms/{world.name}/{s}"))
            cells = case.draw(rng, max(OWN_TRIALS.values()))
            for peer in PEERS:
                hits[peer] += peer_fails(peer, case, cells, rng)
        out[world.name] = {peer: h / seeds for peer, h in hits.items()}
        print(f"{world.name:<24} " + "  ".join(f"{p} {v:.3f}" for p, v in out[world.name].items()), flush=True)
    return out


def load_rows(path: str) -> tuple[list[dict], dict]:
    """The rows of a JSON this script wrote (null back to infinity where a test never detected)."""
    with open(path) as f:
        data = json.load(f)

    def back(x, key=""):
        if isinstance(x, dict):
            return {k: back(v, k) for k, v in x.items()}
        return math.inf if x is None and key in ("median", "p90", "ratio", "ratio_p90", "ratio_power_one") else x

    return [back(r) for r in data["rows"]], data


def compare_table(before: list[dict], after: list[dict], labels: tuple[str, str]) -> str:
    """Trials to detection (exactcheck's median) and the ratio to the oracle, before and after."""
    earlier = {r["mutant"]: r for r in before}
    lines = [f"| mutant | world | oracle median | exactcheck {labels[0]} | ratio {labels[0]} | "
             f"exactcheck {labels[1]} | ratio {labels[1]} |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in after:
        b = earlier.get(r["mutant"])
        if b is None:
            continue
        lines.append(f"| {r['mutant']} | {r['world']} | {_n(r['oracle']['median'])} | {_n(b['exactcheck']['median'])} | "
                     f"{_r(b['ratio'])} | {_n(r['exactcheck']['median'])} | {_r(r['ratio'])} |")
    for label, rows in zip(labels, (before, after)):
        finite = [r["ratio"] for r in rows if math.isfinite(r["ratio"])]
        lines.append(f"\n{label}: median ratio {np.median(finite):.2f} over {len(finite)} mutants, largest "
                     f"{max(finite):.1f}, above 10: {sum(x > 10 for x in finite)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--level", default="standard")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="only these mutants")
    parser.add_argument("--json", help="write the rows here (and .md, .html beside it)")
    parser.add_argument("--sequential-from", metavar="FILE",
                        help="take EProcess and batch_schedule from this copy of exactcheck/stats/sequential.py "
                             "(an earlier release's, for a before/after table)")
    parser.add_argument("--label", default="", help="what this run measures (named in --compare tables)")
    parser.add_argument("--peer-false-alarms", type=int, metavar="SEEDS",
                        help="measure each peer's false-alarm rate on the exact laws instead, and stop")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="print the before/after table of two JSONs this script wrote, and stop")
    args = parser.parse_args(argv)
    if args.compare:
        (before, b), (after, a) = (load_rows(path) for path in args.compare)
        print(compare_table(before, after, (b.get("label") or "before", a.get("label") or "after")), end="")
        return 0
    if args.peer_false_alarms:
        rates = peer_false_alarms(args.peer_false_alarms, args.seed)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"schema": "exactcheck.peer_false_alarms/1", "seeds": args.peer_false_alarms,
                           "own_trials": OWN_TRIALS, "rates": rates}, f, indent=1)
        return 0
    if args.sequential_from:
        global EProcess, batch_schedule
        loaded = runpy.run_path(args.sequential_from)
        EProcess, batch_schedule = loaded["EProcess"], loaded["batch_schedule"]
    start = time.perf_counter()
    chosen, skipped = cases(args.only)
    print(f"{len(chosen)} mutants with an exact output law ({time.perf_counter() - start:.0f} s to compute them)",
          flush=True)
    rows = []
    for case in chosen:
        clock = time.perf_counter()
        rows.append(measure(case, args.seeds, args.level, args.seed))
        r = rows[-1]
        print(f"{case.mutant:<34} {case.world.name:<22} TV {case.tv:.4f}  exactcheck {_n(r['exactcheck']['median'])}"
              f" / {_n(r['exactcheck']['p90'])}  oracle {_n(r['oracle']['median'])} / {_n(r['oracle']['p90'])}"
              f"  ratio {_r(r['ratio'])}  ({time.perf_counter() - clock:.0f} s)", flush=True)
    header = (f"Level {args.level}, alpha {ALPHA:g}, {args.seeds} seeds a mutant, root seed {args.seed}"
              + (f", e-processes and looks from {args.sequential_from}" if args.sequential_from else "")
              + f"; {time.perf_counter() - start:.0f} s.")
    text = markdown(rows, skipped, header)
    print("\n" + text)
    if args.json:
        stem = args.json.removesuffix(".json")
        with open(stem + ".json", "w") as f:
            json.dump(_finite({"schema": "exactcheck.efficiency/1", "level": args.level, "alpha": ALPHA, "beta": BETA,
                               "seeds": args.seeds, "label": args.label, "rows": rows, "no_law": skipped}), f, indent=1)
        with open(stem + ".md", "w") as f:
            f.write(text)
        with open(stem + ".html", "w") as f:
            f.write(html_report(rows, skipped, header))
    return 0


def _finite(x):
    """JSON has no infinity: a test that never detected is null."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


if __name__ == "__main__":
    sys.exit(main())
