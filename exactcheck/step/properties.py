"""Deterministic properties of a verifier, searched with hypothesis under forced random numbers.

Each property is checked first on a fixed corpus of small edge cases (one per row kind and draft
relation; case by case under the two boundary uniforms, then under the three ratio values), then
on cases hypothesis generates, with the subject's random numbers forced to one
boundary value (``exactcheck.forcing.randomness``: the value is one the draw can return in its dtype). A
counterexample is shrunk by hypothesis to a minimal case and kept as a reproducer that
``exactcheck replay`` re-runs. No sampling luck is involved.

Properties:
* ``contract`` — the output keeps the step contract (shape, int64, ids in [0, V) or -1 padding,
  drafts emitted as given) and the subject does not crash, on every case and forced value;
* ``no_forbidden_token`` — no emitted token has target probability 0 at its position;
* ``acceptance`` (a conformance check) — with every uniform forced to c, the number of accepted
  drafts is what the subject's rule decides (``exactcheck.rules``: token-wise accepts the leading
  positions with u < p/q; block the last j with u < h_j; ...) with u = c, or with u = 1 - c (the
  same comparison on the mirrored uniform, as ``u = 1 - torch.rand()`` code does); strict or not
  is a tie, and ties are not judged (thresholds within a margin of u that follows the precision of
  the rows handed in). A case fails only if *no* convention explains every judged row; a subject
  that declares no rule fails only if no registered exact rule does;
* ``row_independence`` — under forced values, row b's output is the same alone as in its batch;
* ``seeded_rows`` — for subjects that take ``row_generators`` (one ``torch.Generator`` or None per
  row): identical rows give identical outputs under forced values whether seeded or not, with
  uninitialised memory poisoned;
* ``same_seed`` — unforced, the same generator seed gives the same output, whatever the state of
  torch's global generator (a **reproducibility** finding: it says nothing of the law).

Trust rules. A property that needs every draw forced (acceptance, row_independence, seeded_rows)
is *not judged* on a case where a draw escaped the forcing (``DrawLog.complete``), never failed.
A ``contract`` or ``no_forbidden_token`` failure is re-run forcing fewer draws (the others drawn
from the generator as usual) until no smaller set of forced draws breaks it; its
``reachability`` is the probability of that set (``exactcheck.reachability``), and a failure whose
trigger is rarer than the floor is kept as unreachable boundary behaviour, while the search goes on
for a reachable one.
"""
from __future__ import annotations

import inspect
import random
import time
from collections import Counter
from functools import partial
from dataclasses import dataclass, replace

import numpy as np
import torch
from hypothesis import HealthCheck, find, settings
from hypothesis import errors as _hypothesis_errors
from hypothesis.errors import Flaky, NoSuchExample

# hypothesis >= 6.100 raises FlakyFailure (an exception group); older releases raise Flaky
FlakyFailure = getattr(_hypothesis_errors, "FlakyFailure", Flaky)

from exactcheck.errors import ContractViolation, SubjectCrashed
from exactcheck.rules import EXACT_RULES, RuleSpec, declared_rule, rule_spec
from exactcheck.contracts.verifier import PADDING, Verifier, call_verifier
from exactcheck.forcing.boundaries import (CONVENTION_GRID, RATIO_STEP, TIE_MARGIN, UNIFORM_FLOOR, fewest_forced,
                                          wrong_interval)
from exactcheck.forcing.randomness import DrawLog, controlled_randomness, value_probability, watched_randomness
from exactcheck.reachability import ORDINARY, Reachability, forced_draws, structural, wrong_uniforms
from exactcheck.step.strategies import VerifyCase, edge_corpus, verify_cases

__all__ = ["PropertyFailure", "PropertyResult", "FORCED_VALUES", "ALL_FORCED_VALUES", "forced_values", "PROPERTIES", "check_property",
           "search", "search_property", "search_corpus", "reproducer", "replay_reproducer", "REPRODUCER_SCHEMA",
           "UNFORCED", "tie_margin", "with_wrong_uniforms", "wrong_interval", "RULE_PROPERTIES", "FROM_SUBJECT", "fewest_forced"]

REPRODUCER_SCHEMA = "exactcheck.reproducer/2"
FROM_SUBJECT = object()  # a property's rule: the one the subject declares (``acceptance_rule``)
FORCED_VALUES = ("zero", "one_minus_ulp", "ratio", "ratio_minus", "ratio_plus")
# the same thresholds probed for a subject that compares the mirrored uniform 1 - u (as
# ``u = 1 - torch.rand()`` code does): the drawn value is 1 - ratio_minus / 1 - ratio_plus, so
# the u it compares sits 2^-14 either side of the threshold. Acceptance only: the other properties
# judge outputs alone, and the mirrored subject's boundary behaviour is met under 0 and 1 - ulp.
MIRRORED_VALUES = ("mirrored_ratio_minus", "mirrored_ratio_plus")
RATIO_VALUES = ("ratio", "ratio_minus", "ratio_plus", *MIRRORED_VALUES)
ALL_FORCED_VALUES = (*FORCED_VALUES, *MIRRORED_VALUES)
PROPERTIES = ("contract", "no_forbidden_token", "acceptance", "row_independence", "seeded_rows",
              "same_seed")
UNFORCED = ("same_seed",)
RULE_PROPERTIES = ("acceptance",)  # judged by the subject's rule: conformance checks
NEED_COMPLETE = ("acceptance", "row_independence", "seeded_rows")  # judged only if every draw was forced
SHRUNK = ("contract", "no_forbidden_token")  # judged on outputs alone: the forced set can shrink
VACUOUS = "not judged"
REPEATS = 4  # identical forced calls a NEED_COMPLETE finding must reproduce before it is judged
UNSEEN_SOURCE = ("its output changed between identical forced calls (a random source exactcheck "
                 "does not see: fresh OS entropy, a generator the subject keeps)")
UNREACHABLE_ENOUGH = 3  # after this many unreachable counterexamples under one value, move on
# the edge corpus is searched before any generated case, case by case under each value of a group,
# the boundary uniforms first: a boundary behaviour of any edge class is met within twice the
# corpus's cases, whatever time a budgeted search (``--max-seconds``) leaves for the rest
CORPUS_ORDER = (("zero", "one_minus_ulp"), ("ratio", "ratio_minus", "ratio_plus"))


def forced_values(name: str) -> tuple[str, ...]:
    """The forced values a property is searched under: the mirrored ratio values for acceptance."""
    return ALL_FORCED_VALUES if name in RULE_PROPERTIES else FORCED_VALUES


def corpus_order(name: str) -> tuple[tuple[str, ...], ...]:
    """The edge corpus's groups of values for a property (``CORPUS_ORDER``, the mirrored ratio
    values with the ratio group for acceptance)."""
    if name in RULE_PROPERTIES:
        return CORPUS_ORDER[0], CORPUS_ORDER[1] + MIRRORED_VALUES
    return CORPUS_ORDER


@dataclass(frozen=True)
class PropertyFailure:
    property: str
    value: str | None
    case: VerifyCase
    message: str
    row: int | None = None
    output: list | None = None
    reachability: Reachability | None = None
    forced: tuple[int, ...] | None = None  # the minimal forced element indices (None: all)
    frames: tuple[str, ...] = ()  # a crash: the subject's own frames
    crashed: bool = False  # the subject raised (else its output broke the contract or the property)


@dataclass(frozen=True)
class PropertyResult:
    """Outcome of searching one property under one forced value."""

    property: str
    value: str | None
    examples: int
    failure: PropertyFailure | None
    note: str = ""  # e.g. what could not be controlled, or why the property did not apply
    unreachable: PropertyFailure | None = None  # a failure whose trigger is below the floor
    # a failure that did not recur when the same case was run again (hypothesis: flaky)
    unrepeatable: PropertyFailure | None = None
    forced: bool = True  # whether any of the subject's draws took a forced value
    out_of_time: bool = False  # the search stopped at its deadline


def _oracles(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, rule: RuleSpec | None, normalise: bool):
    """(rule, its ``Oracle``) for the subject's rule, or every registered exact rule if it declares
    none, on the rows as handed in or normalised (float64)."""
    p64, q64 = p.double(), q.double()
    if normalise:
        p64, q64 = p64 / p64.sum(-1, keepdim=True), q64 / q64.sum(-1, keepdim=True)
    arrays = p64.cpu().numpy(), q64.cpu().numpy(), tokens.cpu().numpy()
    specs = [rule] if rule is not None else [rule_spec(name) for name in EXACT_RULES]
    return [(spec, oracle) for spec in specs if (oracle := spec.oracle(*arrays)) is not None]


def tie_margin(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Relative margin [B, k] around p/q within which a decision is a numerical tie, following
    the precision of the rows handed in: a subject may compute p/q in that precision, or from
    logits rounded to it (error about |log p| + |log q| units of rounding). At least 2^-18."""
    eps = torch.finfo(p.dtype).eps / 2 if p.dtype.is_floating_point else 2.0 ** -24
    pi = p[:, :-1].double().gather(2, tokens[..., None])[..., 0]
    qi = q.double().gather(2, tokens[..., None])[..., 0]
    logs = pi.clamp(min=1e-300).log().abs() + qi.clamp(min=1e-300).log().abs()
    return (8 * eps * (2 + logs)).clamp(min=TIE_MARGIN)


def ratio_position(oracle, row: int = 0) -> int:
    """The drafted position whose threshold the ratio values probe on ``row``: the deepest one
    whose threshold is inside (0, 1) and whose decision the rule reads when every uniform sits
    2^-14 either side of it (for token-wise, every earlier threshold lies above it); position 0
    when none does. Cases whose later thresholds are the lower probe the later positions, the
    others position 0: over a search, every drafted position's threshold is probed."""
    thresholds = oracle.thresholds[row:row + 1]
    for j in range(thresholds.shape[1] - 1, -1, -1):
        r = float(thresholds[0, j])
        if not 0 < r < 1:
            continue
        if all(bool(oracle.relevant(oracle.decide(c < thresholds))[0, j])
               for c in (r * (1 - RATIO_STEP), r * (1 + RATIO_STEP))):
            return j
    return 0


def forced_uniform(value: str, case_tensors, rule: RuleSpec | None = None) -> str | float:
    """What a forced value stands for on this case: ``ratio`` is exactly a decision threshold of
    the rule on row 0 (p/q of a draft for token-wise rejection sampling, the subject's rule or
    token-wise if it declares none; normalised rows, float64), at the position ``ratio_position``
    picks; ``ratio_minus`` / ``ratio_plus`` sit 2^-14 below/above (the gap between a float32
    ratio and a float16 or bfloat16 one); ``mirrored_ratio_minus`` / ``_plus`` are 1 minus those,
    for a subject that compares 1 - u. The named boundaries stay names, resolved in each draw's
    dtype."""
    if value in RATIO_VALUES:
        p, q, tokens = case_tensors
        _, oracle = _oracles(p[:1], q[:1], tokens[:1], rule or rule_spec("token-wise"), normalise=True)[0]
        r = min(float(oracle.thresholds[0, ratio_position(oracle)]), 1.0)
        side = value.replace("mirrored_", "")
        c = {"ratio": r, "ratio_minus": r * (1 - RATIO_STEP), "ratio_plus": r * (1 + RATIO_STEP)}[side]
        c = min(max(c, 0.0), 1.0)
        return 1.0 - c if value.startswith("mirrored_") else c
    return value


def _record(draws: Counter | None, log: DrawLog) -> None:
    if draws is not None:
        draws.update(log.uncontrolled)
        draws.update(log.escaped)
        draws["(controlled)"] += sum(log.controlled.values())


def _first(bad: torch.Tensor) -> int | None:
    """The first row flagged in ``bad`` [B], or None."""
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def _no_forbidden_token(out, tensors, log: DrawLog) -> tuple[int, str] | None:
    p, _, tokens = tensors
    emitted = out != PADDING
    prob = p.gather(2, out.clamp(min=0)[..., None])[..., 0]
    row = _first((emitted & (prob == 0)).any(1))
    if row is None:
        return None
    return row, (f"row {row} emitted {out[row].tolist()} for drafts {tokens[row].tolist()}; "
                 f"target probabilities of the emitted tokens: "
                 f"{[float(x) for x in prob[row][emitted[row]]]}")


def _wrong_rows(raw, norm, d: float, mirrored: bool, accepted: np.ndarray, margin: np.ndarray) -> np.ndarray:
    """The judged rows whose accepted count is not the rule's (oracles ``raw`` and ``norm``, on
    the rows as handed in and normalised) with every uniform delivered as ``d``, compared as u = d
    or, ``mirrored``, as u = 1 - d; a row none of whose read tests is a tie is judged."""
    low, high = np.minimum(raw.thresholds, norm.thresholds), np.maximum(raw.thresholds, norm.thresholds)
    raised = max(d, UNIFORM_FLOOR)  # the delivered d, or the floor it may be raised to
    u, (u_low, u_high) = (1.0 - d, (1.0 - raised, 1.0 - d)) if mirrored else (d, (d, raised))
    # a tie if any u it stands for is one
    ambiguous = (u_high >= low * (1 - margin)) & (u_low <= high * (1 + margin))
    decided = norm.decide(u < norm.thresholds)
    judged = ~(ambiguous & norm.relevant(decided)).any(1)  # judged only if no test it read is a tie
    return np.flatnonzero(judged & (accepted != decided)), decided


def _accepted_counts(out) -> np.ndarray:
    return ((out != PADDING).sum(1) - 1).cpu().numpy()


def _acceptance(out, tensors, log: DrawLog, rule: RuleSpec | None) -> tuple[int, str, float] | None:
    """A wrong acceptance decision that no exact convention of the subject's rule (of any
    registered exact rule, if it declares none) explains: (row, message, the delivered uniform it
    was judged at), or None."""
    p, q, tokens = tensors
    values = sorted(log.values())
    if not values:
        return None
    accepted = _accepted_counts(out)
    margin = tie_margin(p, q, tokens).cpu().numpy()
    first = None
    for (spec, raw), (_, norm) in zip(_oracles(p, q, tokens, rule, False), _oracles(p, q, tokens, rule, True)):
        for d in values:
            for mirrored in (False, True):
                wrong, decided = _wrong_rows(raw, norm, d, mirrored, accepted, margin)
                if not wrong.size:
                    return None  # this rule and convention explain every judged row
                if first is None:
                    first = (int(wrong[0]), d, int(decided[wrong[0]]), spec, norm)
    row, d, expected, spec, norm = first
    values_at = [float(f"{float(x):.9g}") for x in norm.thresholds[row]]
    if rule is not None:
        why = "should be accepted (no exact convention, u or 1 - u, strict or not, explains every row)"
    else:
        why = (f"are accepted by {spec.label} (no registered exact rule, " + ", ".join(EXACT_RULES)
               + ", under any convention, u or 1 - u, strict or not, explains every row)")
    return row, (f"with every uniform = {d!r}, row {row} accepted {int(accepted[row])} drafts; "
                 f"{norm.described} at its drafts is {values_at}, so exactly {expected} {why}"), d


def _convention_fails(out, tensors, log: DrawLog, rule: RuleSpec | None, mirrored: bool) -> bool:
    """Whether, under one convention (u, or 1 - u), no rule (the subject's, or any registered
    exact one) explains every judged row of this forced call."""
    p, q, tokens = tensors
    values = sorted(log.values())
    if not values or isinstance(out, Exception) or not log.complete:
        return False
    accepted = _accepted_counts(out)
    margin = tie_margin(p, q, tokens).cpu().numpy()
    for (_, raw), (_, norm) in zip(_oracles(p, q, tokens, rule, False), _oracles(p, q, tokens, rule, True)):
        for d in values:
            if not _wrong_rows(raw, norm, d, mirrored, accepted, margin)[0].size:
                return False
    return True




def _point_reach(log: DrawLog, d: float) -> Reachability:
    """The probability of the forced uniform d itself, in the coarsest dtype among the draws that
    received it (the likeliest way to be handed it)."""
    dtype = max((draw.dtype for draw in log.draws if draw.value == d), key=lambda t: value_probability(d, t))
    return forced_draws([value_probability(d, dtype)], [str(dtype).replace("torch.", "")], ["the acceptance uniform"], d)


def with_wrong_uniforms(subject, failure: PropertyFailure, seed: int = 0, device="cpu",
                        rule: RuleSpec | None | str = FROM_SUBJECT) -> PropertyFailure:
    """An acceptance counterexample with its reachability widened from the forced uniform's point
    probability to the set of uniforms around it that give a wrong call (others unchanged): every
    uniform forced to c, c grown by bisection from the forced d (``wrong_interval``), under the
    subject's convention: the one (u or 1 - u) under which fewer of ``CONVENTION_GRID`` evenly
    spread uniforms give a wrong call (a mirrored subject is wrong under the direct convention on
    much of the range), the smaller set on a tie. Its measure replaces the point probability when
    it is larger."""
    reach = failure.reachability
    if failure.property != "acceptance" or reach is None or reach.kind != "forced" or not reach.draws:
        return failure
    rule = declared_rule(subject) if rule is FROM_SUBJECT else rule
    tensors, d = failure.case.tensors(device), reach.value
    found = []
    for mirrored in (False, True):
        def fails(c, mirrored=mirrored):
            out, forced_log = _forced_call(subject, tensors, c, seed)
            return _convention_fails(out, tensors, forced_log, rule, mirrored)
        wrong_on_grid = sum(fails((i + 0.5) / CONVENTION_GRID) for i in range(CONVENTION_GRID))
        a, b = wrong_interval(fails, d)
        found.append((wrong_on_grid, b - a, a, b))
    _, measure, a, b = min(found)
    if measure <= reach.probability:
        return failure
    return replace(failure, reachability=wrong_uniforms(a, b, d, reach.dtype))


def _accepts_row_generators(subject) -> bool:
    try:
        return "row_generators" in inspect.signature(subject).parameters
    except (TypeError, ValueError):
        return False


def _forced_call(subject, tensors, c, seed, *, only=None, **options):
    """Call the subject with draws forced to ``c`` (or only the elements ``only``); returns
    (output or the subject's error, the draw log)."""
    gen = torch.Generator(device=tensors[0].device).manual_seed(seed)
    handed = [gen, *(options.get("row_generators") or ())]
    with controlled_randomness(c, only=only, generators=handed) as log:
        try:
            out = call_verifier(subject, *tensors, gen, **options)
        except (SubjectCrashed, ContractViolation) as exc:
            out = exc
    return out, log


def _broken_output(name: str, out, tensors, log) -> tuple[int | None, str] | None:
    """Whether an output (or the error raised instead) breaks ``contract`` or
    ``no_forbidden_token``."""
    if isinstance(out, Exception):
        return (getattr(out, "row", None), str(out)) if name == "contract" else None
    if name == "contract":
        return None
    return _no_forbidden_token(out, tensors, log)


def _shrink_forced(subject, name: str, case: VerifyCase, c, seed: int, full: DrawLog,
                   options: dict, device="cpu") -> tuple[tuple[int, ...], Reachability]:
    """The fewest forced elements that still break ``name`` (the other draws coming from the
    generator), and its reachability."""

    def fails(only, s) -> bool:
        tensors = case.tensors(device)
        out, log = _forced_call(subject, tensors, c, s, only=frozenset(only), **options)
        return _broken_output(name, out, tensors, log) is not None

    return fewest_forced(fails, full, seed)


def check_property(subject: Verifier, name: str, case: VerifyCase, value: str | None,
                   seed: int = 0, draws: Counter | None = None, device="cpu",
                   rule: RuleSpec | None | str = FROM_SUBJECT) -> PropertyFailure | None:
    """Check one property on one case; None when it holds (or could not be judged). ``draws``
    collects the names of random sources the subject used that could not be forced. The case's
    tensors and every generator handed over are on ``device``. ``rule``: what the acceptance
    property judges by (None: any registered exact rule).

    Three steps: plan (the forced value, the call's tensors and options), drive (one forced call),
    judge (the property on its output, made again where a finding must reproduce)."""
    tensors = case.tensors(device)
    if name == "same_seed":
        return _same_seed(subject, tensors, seed, partial(_failure, name, value, case))
    if name not in PROPERTIES:
        raise ValueError(f"unknown property {name!r}")
    check = _PropertyCheck.plan(subject, name, case, value, seed, draws, device, rule, tensors)
    out, log = check.drive()
    return check.judge(out, log)


def _failure(name: str, value: str | None, case: VerifyCase, message, row=None, out=None, reach=None, forced=None,
             frames=()) -> PropertyFailure:
    return PropertyFailure(name, value, case, message, row,
                           None if out is None else out[row if row is not None else 0].tolist(),
                           reach, forced, frames)


@dataclass(frozen=True)
class _PropertyCheck:
    """One property on one case: the subject, the forced uniform ``c``, the tensors the call gets
    and its options (``seeded_rows``: row 0 repeated, with its row generators)."""

    subject: Verifier
    name: str
    case: VerifyCase
    value: str | None
    seed: int
    draws: Counter | None
    device: object
    rule: RuleSpec | None
    c: object
    tensors: tuple
    options: dict

    @classmethod
    def plan(cls, subject, name, case, value, seed, draws, device, rule, tensors) -> "_PropertyCheck":
        rule = declared_rule(subject) if rule is FROM_SUBJECT else rule
        c = forced_uniform(value, tensors, rule)
        options = {}
        if name == "seeded_rows":
            # row 0 repeated, alternately unseeded and seeded (at least one of each)
            options["row_generators"] = [torch.Generator(device=device).manual_seed(seed + b) if b % 2 else None
                                         for b in range(max(case.batch, 2))]
            tensors = tuple(t[:1].expand(len(options["row_generators"]), *t.shape[1:]).contiguous()
                            for t in tensors)
        return cls(subject, name, case, value, seed, draws, device, rule, c, tensors, options)

    def fail(self, message, row=None, out=None, reach=None, forced=None, frames=()) -> PropertyFailure:
        return _failure(self.name, self.value, self.case, message, row, out, reach, forced, frames)

    def not_judged(self, log: DrawLog) -> bool:
        if log.complete:
            return False
        if self.draws is not None:
            self.draws["(not judged)"] += 1
        return True

    def varies(self, calls) -> bool:
        """Whether any of ``calls`` ((tensors, output, options)) gives another output when made
        again, every draw forced as before: the output then depends on a random source no
        snapshot sees (a numpy Generator or ``random.Random`` seeded from OS entropy, a
        generator kept between calls), and a property judged on it would blame exact code."""
        for inputs, first, opts in calls:
            for _ in range(REPEATS):
                again, _ = _forced_call(self.subject, inputs, self.c, self.seed, **opts)
                if isinstance(again, Exception) or not torch.equal(again, first):
                    if self.draws is not None:
                        self.draws["(not judged)"] += 1
                        self.draws[UNSEEN_SOURCE] += 1
                    return True
        return False

    def drive(self) -> tuple:
        """The forced call: (its output or the subject's error, the draw log)."""
        out, log = _forced_call(self.subject, self.tensors, self.c, self.seed, **self.options)
        _record(self.draws, log)
        return out, log

    def judge(self, out, log: DrawLog) -> PropertyFailure | None:
        if isinstance(out, Exception) and self.name != "contract":
            # crashes and broken outputs are the contract property's findings, reported once there
            if self.draws is not None:
                self.draws["(broken)"] += 1
            return None
        if self.name in SHRUNK:
            return self.judge_output(out, log)
        if self.not_judged(log):
            return None
        if self.name == "acceptance":
            return self.judge_acceptance(out, log)
        if self.name == "seeded_rows":
            return self.judge_seeded_rows(out)
        return self.judge_row_independence(out, log)

    def judge_output(self, out, log: DrawLog) -> PropertyFailure | None:
        """``contract`` and ``no_forbidden_token``: judged on the output alone, the forced set shrunk."""
        found = _broken_output(self.name, out, self.tensors, log)
        if found is None:
            return None
        forced, reach = _shrink_forced(self.subject, self.name, self.case, self.c, self.seed, log, self.options,
                                       self.device)
        if isinstance(out, Exception):
            crash = isinstance(out, SubjectCrashed)
            return replace(self.fail(found[1], found[0], None, reach, forced, getattr(out, "frames", ())),
                           crashed=crash)
        return self.fail(found[1], found[0], out, reach, forced)

    def judge_acceptance(self, out, log: DrawLog) -> PropertyFailure | None:
        found = _acceptance(out, self.tensors, log, self.rule)
        if found is None:
            return None
        if self.varies([(self.tensors, out, self.options)]):
            return None
        row, message, d = found
        # the point probability of d; the search widens it to the interval of wrong uniforms
        # (``with_wrong_uniforms``) on the counterexample it keeps, not on every case it shrinks
        return self.fail(message, row, out, _point_reach(log, d))

    def judge_seeded_rows(self, out) -> PropertyFailure | None:
        gens = self.options["row_generators"]
        row = _first((out != out[:1]).any(1))
        if row is None or self.varies([(self.tensors, out, self.options)]):
            return None
        return self.fail(f"identical rows differ under forced uniforms: row 0 (unseeded) gave "
                         f"{out[0].tolist()}, row {row} ({'seeded' if gens[row] else 'unseeded'}) "
                         f"gave {out[row].tolist()}", row, out,
                         structural("identical rows differ at identical random numbers on every such call: "
                                    "the law of some rows depends on whether they are seeded"))

    def judge_row_independence(self, out, log: DrawLog) -> PropertyFailure | None:
        """Each row alone, every uniform forced as in the batch, must give the batch's row."""
        p, q, tokens = self.tensors
        for row in range(out.shape[0]):
            single = (p[row:row + 1], q[row:row + 1], tokens[row:row + 1])
            alone, alone_log = _forced_call(self.subject, single, self.c, self.seed)
            if isinstance(alone, Exception) or self.not_judged(alone_log):
                return None
            if not torch.equal(alone[0], out[row]):
                if self.varies([(self.tensors, out, self.options), (single, alone, {})]):
                    return None
                return self.fail(f"row {row} gave {out[row].tolist()} in a batch of {out.shape[0]} "
                                 f"but {alone[0].tolist()} alone, with every uniform forced to "
                                 f"{sorted(log.values())}", row, out,
                                 structural("a row's output depends on the other rows of its batch at "
                                            "identical random numbers"))
        return None


def _same_seed(subject, tensors, seed: int, fail) -> PropertyFailure | None:
    """Two calls with the same generator seed, torch's global generator in two different
    states; numpy and Python's ``random`` left as they are."""
    outs, sources = [], []
    for attempt in range(2):
        state = torch.random.get_rng_state()
        torch.manual_seed(seed + 7919 * attempt)
        try:
            with watched_randomness() as seen:
                try:
                    outs.append(call_verifier(subject, *tensors,
                                              torch.Generator(device=tensors[0].device).manual_seed(seed)))
                except (SubjectCrashed, ContractViolation):
                    return None  # the contract property reports it
        finally:
            torch.random.set_rng_state(state)
        sources += [s for s in seen if s not in sources]
    row = _first((outs[0] != outs[1]).any(1))
    if row is None:
        return None
    drew = ("; it drew from " + ", ".join(sources)) if sources else (
        "; no draw outside its generator was seen (state kept between calls, or an entropy "
        "source exactcheck does not watch)")
    return fail(f"two runs with the same generator seed differ at row {row}: "
                f"{outs[0][row].tolist()} then {outs[1][row].tolist()}{drew}", row, outs[1],
                structural("on every call: the output does not follow the generator's seed"))


class _OutOfTime(Exception):
    """The property search reached its deadline (``search(deadline=...)``)."""


def search(subject: Verifier, name: str, examples: int, seed: int = 0, device="cpu",
           rule: RuleSpec | None | str = FROM_SUBJECT, deadline: float | None = None) -> PropertyResult:
    """Search one property under each forced value in turn (``examples`` cases each), stopping
    at the first reachable counterexample, which is shrunk. An acceptance counterexample whose
    wrong uniforms are too few for ordinary random numbers (``_needs_forced_draws``) is kept while
    the other values are searched for one with more, and the likeliest is reported. ``deadline`` (a ``time.perf_counter``
    value; an audit under ``max_seconds``): no new case is started after it, and the verdict says
    how far the search got."""
    if name == "seeded_rows" and not _accepts_row_generators(subject):
        return PropertyResult(name, None, 0, None,
                              "not applicable: the subject takes no row_generators argument")
    seeded = getattr(subject, "random_numbers_from_seeds", None)
    if seeded and name in NEED_COMPLETE:
        # the subject says its kernel derives its random numbers from seeds: if its first case
        # confirms that draws escape the forcing, no case of this property can be judged
        draws: Counter = Counter()
        check_property(subject, name, edge_corpus()[0], FORCED_VALUES[0], seed, draws, device, rule)
        if draws["(not judged)"]:
            return PropertyResult(name, None, 0, None,
                                  f"{VACUOUS}: the subject derives its random numbers from a seed ({seeded}), "
                                  "which no forced value reaches; its laws decide")
    tally = _Tally(name)
    values = (None,) if name in UNFORCED else forced_values(name)
    held: PropertyResult | None = None  # a counterexample too rare for ordinary random numbers
    for group in corpus_order(name) if name not in UNFORCED else ((None,),):
        results = search_corpus(subject, name, group, seed, device, rule, deadline)
        for result in results:
            if (found := tally.add(result)) is not None:
                if not _needs_forced_draws(found.failure) or name not in RULE_PROPERTIES:
                    return found  # (a forced set is shrunk to its fewest draws: as likely as it gets)
                if held is None or _likelier(found.failure, held.failure):
                    held = found  # an acceptance counterexample: other values may widen its wrong uniforms
                break
        if any(r.out_of_time for r in results):
            tally.notes.add("search stopped at the time budget (--max-seconds) in the edge corpus under "
                            + ", ".join(str(v) for v in group))
            return replace(held, examples=tally.tried) if held else tally.searched()
        if not any(r.forced for r in results):
            break  # no draw took any forced value: the other values would make the same calls
    for position, value in enumerate(values):
        result = search_property(subject, name, value, examples, seed, device, rule, deadline, corpus=False)
        if result.out_of_time:
            reached = (f"in forced value {position + 1} of {len(values)} ({value})" if value is not None
                       else "before its last case")
            tally.notes.add(f"search stopped at the time budget (--max-seconds) {reached}")
        if (found := tally.add(result)) is not None:
            if not _needs_forced_draws(found.failure) or name not in RULE_PROPERTIES:
                return found
            # an acceptance counterexample whose wrong uniforms are few: generated cases under the
            # other values may show a wider set (a threshold near 1 rather than near 0)
            if held is None or _likelier(found.failure, held.failure):
                held = found
            continue
        if value is not None and not result.forced:
            break  # no draw took the forced value: the other values would make the same calls
        if result.out_of_time:
            break
    if held is not None:
        return replace(held, examples=tally.tried)
    return tally.searched()


class _Tally:
    """What one property's search has seen over its values: the cases tried, the notes, the first
    unreachable and unrepeatable counterexamples."""

    def __init__(self, name: str):
        self.name, self.tried, self.notes = name, 0, set()
        self.unreachable: PropertyFailure | None = None
        self.unrepeatable: PropertyFailure | None = None

    def add(self, result: PropertyResult) -> PropertyResult | None:
        """Count one value's result in; the search's result if it holds a reachable counterexample."""
        self.tried += result.examples
        if result.examples:  # a value no case was tried under (the deadline, or the corpus skipped it) says nothing
            self.notes.add(result.note)
        self.unreachable = self.unreachable or result.unreachable
        self.unrepeatable = self.unrepeatable or result.unrepeatable
        if result.failure is not None:
            return PropertyResult(self.name, result.value, self.tried, result.failure, result.note)
        return None

    def searched(self) -> PropertyResult:
        """The search's result when no reachable counterexample was found."""
        notes = "; ".join(sorted(n for n in self.notes if n))
        if self.unrepeatable is not None:
            return PropertyResult(self.name, self.unrepeatable.value, self.tried, None, notes,
                                  self.unreachable, self.unrepeatable)
        if all(n.startswith(VACUOUS) for n in self.notes):  # nothing was judged under any value
            return PropertyResult(self.name, None, 0, None, self.notes.pop(), self.unreachable)
        return PropertyResult(self.name, None, self.tried, None, notes, self.unreachable)


class _ValueSearch:
    """One property's search under one forced value: its checks, what its draws did, what it found."""

    def __init__(self, subject, name, value, seed, device, rule, deadline):
        self.subject, self.name, self.value, self.seed = subject, name, value, seed
        self.device, self.rule, self.deadline = device, rule, deadline
        self.failures: list[PropertyFailure] = []
        self.unreachable: list[PropertyFailure] = []
        self.unrepeatable: list[PropertyFailure] = []
        self.tried = 0
        self.draws: Counter = Counter()

    def check(self, case: VerifyCase) -> PropertyFailure | None:
        if len(self.unreachable) >= UNREACHABLE_ENOUGH:
            return None  # every counterexample so far needs a joint event: stop shrinking more
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise _OutOfTime
        self.tried += 1
        args = (self.subject, self.name, case, self.value, self.seed)
        failure = check_property(*args, self.draws, self.device, self.rule)
        if failure is not None and check_property(*args, None, self.device, self.rule) is None:
            self.unrepeatable.append(failure)  # the same check run again holds: reported, never a defect
            return None
        if failure is not None and failure.reachability is not None and not failure.reachability.reachable:
            self.unreachable.append(failure)
            return None
        return failure

    def widened(self, failure: PropertyFailure | None) -> PropertyFailure | None:
        """An acceptance counterexample with its interval of wrong uniforms (``with_wrong_uniforms``)."""
        if failure is None or (self.deadline is not None and time.perf_counter() > self.deadline):
            return failure  # (past the deadline: the point probability stands, a lower bound still)
        return with_wrong_uniforms(self.subject, failure, self.seed, self.device, self.rule)

    def result(self, failure, out_of_time=False) -> PropertyResult:
        forced = self.draws["(controlled)"] > 0
        return PropertyResult(self.name, self.value, self.tried, failure,
                              _draw_note(self.name, self.draws, self.tried),
                              self.unreachable[0] if self.unreachable else None,
                              self.unrepeatable[0] if self.unrepeatable and failure is None else None,
                              forced, out_of_time)


def search_corpus(subject: Verifier, name: str, values: tuple, seed: int = 0, device="cpu",
                  rule: RuleSpec | None | str = FROM_SUBJECT, deadline: float | None = None) -> list[PropertyResult]:
    """The fixed edge corpus, case by case, each case under every value of ``values`` in turn: one
    result a value, the last one carrying the counterexample found, if any. A counterexample that
    needs forced draws is held while the rest of the corpus is searched for one that needs none
    (the one reported then says the defect is reachable with ordinary random numbers, where the
    first could only say "at least 2^-53 a call"); the deadline ends that search with the one held.
    A case on which no draw took the first value's forcing makes the same calls under the others,
    which are then skipped for it."""
    searches = [_ValueSearch(subject, name, value, seed, device, rule, deadline) for value in values]
    held: tuple[int, PropertyFailure] | None = None  # (value index, counterexample needing forced draws)

    def results(out_of_time: bool = False) -> list[PropertyResult]:
        if held is None:
            return [s.result(None, out_of_time) for s in searches]
        index, failure = held
        return [s.result(None) for s in searches[:index]] + [searches[index].result(failure)]

    try:
        for case in edge_corpus():
            for index, one in enumerate(searches):
                if len(one.unreachable) >= UNREACHABLE_ENOUGH:
                    continue  # enough unreachable counterexamples under this value
                controlled = one.draws["(controlled)"]
                failure = one.widened(one.check(case))
                if failure is not None and not _needs_forced_draws(failure):
                    held = (index, failure)
                    return results()
                if failure is not None and _likelier(failure, held[1] if held else None):
                    held = (index, failure)
                if one.draws["(controlled)"] == controlled:
                    break  # nothing forced on this case: the other values would make the same calls
    except _OutOfTime:
        return results(out_of_time=True)
    return results()


def _needs_forced_draws(failure: PropertyFailure) -> bool:
    """Whether a counterexample's trigger is too rare to be met with ordinary random numbers (a
    forced value's point probability, or an interval of wrong uniforms narrower than
    ``ORDINARY``): the search then goes on for a likelier one."""
    reach = failure.reachability
    return (reach is not None and reach.kind in ("forced", "interval") and reach.draws > 0
            and (reach.probability or 0.0) < ORDINARY)


def _likelier(failure: PropertyFailure, than: PropertyFailure | None) -> bool:
    """Whether ``failure``'s trigger is likelier per call than ``than``'s (None: always)."""
    if than is None:
        return True
    def probability(f):
        return 1.0 if f.reachability is None or f.reachability.probability is None else f.reachability.probability
    return probability(failure) > probability(than)


def search_property(subject: Verifier, name: str, value: str | None, examples: int,
                    seed: int = 0, device="cpu", rule: RuleSpec | None | str = FROM_SUBJECT,
                    deadline: float | None = None, corpus: bool = True) -> PropertyResult:
    """Search the edge corpus (unless ``corpus`` is False: ``search`` runs it first for every
    value) and ``examples`` generated cases for a reachable counterexample to one property under
    one forced value; shrink what is found. Failures whose trigger is below the reachability floor
    are kept apart (``PropertyResult.unreachable``) and the search goes on, until
    ``UNREACHABLE_ENOUGH`` of them have been seen under this value (each costs a shrink)."""
    one = _ValueSearch(subject, name, value, seed, device, rule, deadline)
    try:
        for case in edge_corpus() if corpus else ():  # deterministic first: each edge class, every time
            failure = one.check(case)
            if failure is not None:
                return one.result(one.widened(failure))
    except _OutOfTime:
        return one.result(None, out_of_time=True)

    def broken(case: VerifyCase) -> bool:
        failure = one.check(case)
        if failure is not None:
            one.failures.append(failure)
        return failure is not None

    config = settings(max_examples=examples, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
    try:
        minimal = find(verify_cases(), broken, settings=config, random=random.Random(seed))
    except NoSuchExample:
        return one.result(None)
    except _OutOfTime:
        return one.result(one.failures[-1] if one.failures else None, out_of_time=True)  # found, not yet shrunk
    except (Flaky, FlakyFailure):  # a case failed once and passed when hypothesis ran it again
        one.unrepeatable.extend(one.failures[:1])
        return one.result(None)
    return one.result(one.widened(next(f for f in reversed(one.failures) if f.case == minimal)))


def _draw_note(name: str, draws: Counter, tried: int) -> str:
    broken = draws.pop("(broken)", 0)
    if broken and broken >= tried:
        return f"{VACUOUS}: every call crashed or broke the contract (see properties/contract)"
    if name in UNFORCED:
        return ""
    controlled = draws.pop("(controlled)", 0)
    skipped = draws.pop("(not judged)", 0)
    parts = []
    if skipped and skipped >= tried - broken:
        return (f"{VACUOUS}: on every case a draw escaped the forcing ("
                + ", ".join(sorted(draws)) + ")")
    if not controlled:
        parts.append("the subject made no draw exactcheck could force")
    if skipped:
        parts.append(f"not judged on {skipped} of {tried} cases, where a draw escaped the forcing")
    if draws:
        parts.append("not forced: " + ", ".join(sorted(draws)))
    return "; ".join(parts)


def reproducer(subject_name: str, failure: PropertyFailure, seed: int, rule: str | None = None) -> dict:
    """A JSON-able record that ``exactcheck replay`` re-runs against any subject. ``rule``: the
    rule the audit was told to judge by (``--rule``), kept so the replay judges by it too."""
    p, q, tokens = failure.case.tensors()
    small = p.numel() <= 4096
    extra = {} if rule is None else {"rule": rule}
    return {**extra,
        "schema": REPRODUCER_SCHEMA, "subject": subject_name, "property": failure.property,
        "value": failure.value, "seed": seed, "case": failure.case.to_dict(),
        "message": failure.message, "row": failure.row, "output": failure.output,
        "forced_elements": None if failure.forced is None else list(failure.forced),
        "reachability": None if failure.reachability is None else failure.reachability.to_dict(),
        "inputs": {"target_probs": p.tolist(), "draft_probs": q.tolist(),
                   "draft_tokens": tokens.tolist()} if small else None,
    }


def replay_reproducer(subject: Verifier, data: dict) -> PropertyFailure | None:
    """Re-run a reproducer's property on its case against ``subject`` (every draw forced): the
    property's verdict alone (None where it holds or was not judged). ``data`` is trusted: a file
    is checked first, and a crash, broken contract or unconsumed forced draw told apart from a
    holding property, by ``exactcheck.step.replay`` (``exactcheck replay``)."""
    if data.get("schema") not in (REPRODUCER_SCHEMA, "exactcheck.reproducer/1"):
        raise ValueError(f"not an exactcheck reproducer (schema {data.get('schema')!r})")
    rule = rule_spec(data["rule"]) if data.get("rule") else FROM_SUBJECT
    return check_property(subject, data["property"], VerifyCase(**data["case"]), data["value"],
                          data["seed"], rule=rule)
