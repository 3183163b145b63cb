"""Deterministic properties of a verifier, searched with hypothesis under forced random numbers.

Each property is checked first on a fixed corpus of small edge cases (one per row kind and draft
relation), then on cases hypothesis generates, with the subject's random
numbers forced to one boundary value (``exactcheck.randomness``). A counterexample is shrunk by
hypothesis to a minimal case and kept as a reproducer that ``exactcheck replay`` re-runs. No
sampling luck is involved: a property either holds on every case tried or a case breaks it.

Properties:
* ``contract`` — the output keeps the step contract (shape, int64, ids in [0, V) or -1 padding,
  drafts emitted as given) and the subject does not crash, on every case and forced value;
* ``no_forbidden_token`` — no emitted token has target probability 0 at its position;
* ``acceptance`` — with every uniform equal to c, the number of accepted drafts is the number of
  leading positions with c < p/q (rows whose ratio lies within 2^-18 of c, or whose normalised and
  raw ratios straddle c, are skipped). This assumes acceptance compares the uniform with the ratio
  directly (u < p/q or u <= p/q), as the Leviathan paper, vLLM, SGLang and transformers do;
* ``row_independence`` — under forced values, row b's output is the same alone as in its batch;
* ``seeded_rows`` — for subjects that take ``row_generators`` (one ``torch.Generator`` or None per
  row): identical rows give identical outputs under forced values whether seeded or not, with
  uninitialised memory poisoned;
* ``same_seed`` — unforced, the same seeds (generator and torch's global RNG) give the same output.
"""
from __future__ import annotations

import inspect
import math
import random
from collections import Counter
from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, find, settings
from hypothesis.errors import NoSuchExample

from exactcheck.contract import PADDING, Verifier, call_verifier
from exactcheck.errors import ContractViolation, SubjectCrashed
from exactcheck.randomness import boundary_value, controlled_randomness
from exactcheck.strategies import VerifyCase, edge_corpus, verify_cases

__all__ = ["PropertyFailure", "PropertyResult", "FORCED_VALUES", "PROPERTIES", "check_property",
           "search", "search_property", "reproducer", "replay_reproducer", "REPRODUCER_SCHEMA", "UNFORCED"]

REPRODUCER_SCHEMA = "exactcheck.reproducer/1"
FORCED_VALUES = ("zero", "one_minus_ulp", "ratio", "ratio_minus", "ratio_plus")
PROPERTIES = ("contract", "no_forbidden_token", "acceptance", "row_independence", "seeded_rows",
              "same_seed")
UNFORCED = ("same_seed",)
VACUOUS = "not judged"
RATIO_STEP = 2.0 ** -14  # ratio_minus / ratio_plus sit this far (relative) from row 0's p/q
TIE_MARGIN = 2.0 ** -18  # acceptance decisions this close to c are not judged


@dataclass(frozen=True)
class PropertyFailure:
    property: str
    value: str | None
    case: VerifyCase
    message: str
    row: int | None = None
    output: list | None = None


@dataclass(frozen=True)
class PropertyResult:
    """Outcome of searching one property under one forced value."""

    property: str
    value: str | None
    examples: int
    failure: PropertyFailure | None
    note: str = ""  # e.g. what could not be controlled, or why the property did not apply


def _ratio(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, normalise: bool) -> torch.Tensor:
    p64, q64 = p[:, :-1].double(), q.double()
    if normalise:
        p64 = p64 / p64.sum(-1, keepdim=True)
        q64 = q64 / q64.sum(-1, keepdim=True)
    pi = p64.gather(2, tokens[..., None])[..., 0]
    qi = q64.gather(2, tokens[..., None])[..., 0]
    return torch.where(qi > 0, pi / qi, torch.full_like(pi, math.inf))


def forced_uniform(value: str, case_tensors) -> float:
    """The constant a forced value stands for on this case: ``ratio`` is exactly p/q of row 0's
    first draft (normalised rows, float64); ``ratio_minus``/``ratio_plus`` sit 2^-14 below/above."""
    if value in ("ratio", "ratio_minus", "ratio_plus"):
        p, q, tokens = case_tensors
        r = float(_ratio(p[:1], q[:1], tokens[:1], normalise=True)[0, 0].clamp(max=1.0))
        c = {"ratio": r, "ratio_minus": r * (1 - RATIO_STEP), "ratio_plus": r * (1 + RATIO_STEP)}[value]
        return min(max(c, 0.0), boundary_value("one_minus_ulp"))
    return boundary_value(value)


def _record(draws: Counter | None, log) -> None:
    if draws is not None:
        draws.update(log.uncontrolled)
        draws["(controlled)"] += sum(log.controlled.values())


def _first(bad: torch.Tensor) -> int | None:
    """The first row flagged in ``bad`` [B], or None."""
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def _no_forbidden_token(out, tensors, c) -> tuple[int, str] | None:
    p, _, tokens = tensors
    emitted = out != PADDING
    prob = p.gather(2, out.clamp(min=0)[..., None])[..., 0]
    row = _first((emitted & (prob == 0)).any(1))
    if row is None:
        return None
    return row, (f"row {row} emitted {out[row].tolist()} for drafts {tokens[row].tolist()}; "
                 f"target probabilities of the emitted tokens: "
                 f"{[float(x) for x in prob[row][emitted[row]]]}")


def _acceptance(out, tensors, c) -> tuple[int, str] | None:
    p, q, tokens = tensors
    accepted = (out != PADDING).sum(1) - 1
    raw, norm = _ratio(p, q, tokens, False), _ratio(p, q, tokens, True)
    low, high = torch.minimum(raw, norm), torch.maximum(raw, norm)
    ambiguous = (c >= low * (1 - TIE_MARGIN)) & (c <= high * (1 + TIE_MARGIN))
    oracle = (c < norm).to(torch.int64).cumprod(1).sum(1)
    # a row is judged only if no decision up to its first rejection is ambiguous
    k = tokens.shape[1]
    upto = torch.arange(k)[None] <= oracle.clamp(max=k - 1)[:, None]
    row = _first(~(ambiguous & upto).any(1) & (accepted != oracle))
    if row is None:
        return None
    ratios = [float(f"{float(x):.9g}") for x in norm[row]]
    return row, (f"with every uniform = {c!r}, row {row} accepted {int(accepted[row])} drafts; "
                 f"p/q at its drafts is {ratios}, so exactly {int(oracle[row])} should be accepted")


_OUTPUT_CHECKS = {"no_forbidden_token": _no_forbidden_token, "acceptance": _acceptance}


def _accepts_row_generators(subject) -> bool:
    try:
        return "row_generators" in inspect.signature(subject).parameters
    except (TypeError, ValueError):
        return False


def check_property(subject: Verifier, name: str, case: VerifyCase, value: str | None,
                   seed: int = 0, draws: Counter | None = None) -> PropertyFailure | None:
    """Check one property on one case; None when it holds. ``draws`` collects the names of
    random entry points the subject used that could not be forced."""
    tensors = case.tensors()
    p, q, tokens = tensors

    def fail(message, row=None, out=None):
        return PropertyFailure(name, value, case, message, row,
                               None if out is None else out[row if row is not None else 0].tolist())

    try:
        if name == "same_seed":
            outs = []
            for _ in range(2):
                state = torch.random.get_rng_state()
                torch.manual_seed(seed)
                try:
                    outs.append(call_verifier(subject, p, q, tokens, torch.Generator().manual_seed(seed)))
                finally:
                    torch.random.set_rng_state(state)
            row = _first((outs[0] != outs[1]).any(1))
            if row is not None:
                return fail(f"two runs with the same seeds differ at row {row}: "
                            f"{outs[0][row].tolist()} then {outs[1][row].tolist()}", row, outs[1])
            return None
        c = forced_uniform(value, tensors)
        gen = torch.Generator().manual_seed(seed)
        if name == "seeded_rows":
            # row 0 repeated, alternately unseeded and seeded (at least one of each)
            gens = [torch.Generator().manual_seed(seed + b) if b % 2 else None
                    for b in range(max(case.batch, 2))]
            same = tuple(t[:1].expand(len(gens), *t.shape[1:]).contiguous() for t in tensors)
            with controlled_randomness(c) as log:
                out = call_verifier(subject, *same, gen, row_generators=gens)
            _record(draws, log)
            row = _first((out != out[:1]).any(1))
            if row is not None:
                return fail(f"identical rows differ under forced uniforms: row 0 (unseeded) gave "
                            f"{out[0].tolist()}, row {row} ({'seeded' if gens[row] else 'unseeded'}) "
                            f"gave {out[row].tolist()}", row, out)
            return None
        with controlled_randomness(c) as log:
            out = call_verifier(subject, p, q, tokens, gen)
        _record(draws, log)
        if name == "contract":
            return None
        if name in _OUTPUT_CHECKS:
            if name == "acceptance" and log.uncontrolled:
                return None  # acceptance may not have used a controlled uniform
            found = _OUTPUT_CHECKS[name](out, tensors, c)
            return None if found is None else fail(found[1], found[0], out)
        if name == "row_independence":
            for row in range(out.shape[0]):
                with controlled_randomness(c):
                    alone = call_verifier(subject, p[row:row + 1], q[row:row + 1], tokens[row:row + 1],
                                  torch.Generator().manual_seed(seed))
                if not torch.equal(alone[0], out[row]):
                    return fail(f"row {row} gave {out[row].tolist()} in a batch of {out.shape[0]} "
                                f"but {alone[0].tolist()} alone, with every uniform = {c!r}", row, out)
            return None
        raise ValueError(f"unknown property {name!r}")
    except (SubjectCrashed, ContractViolation) as exc:
        # crashes and broken outputs are the contract property's findings, reported once there;
        # other properties count the case as not judged
        if draws is not None:
            draws["(broken)"] += 1
        return fail(str(exc), getattr(exc, "row", None)) if name == "contract" else None


def search(subject: Verifier, name: str, examples: int, seed: int = 0) -> PropertyResult:
    """Search one property under each forced value in turn (``examples`` cases each), stopping
    at the first counterexample, which is shrunk."""
    if name == "seeded_rows" and not _accepts_row_generators(subject):
        return PropertyResult(name, None, 0, None,
                              "not applicable: the subject takes no row_generators argument")
    tried, notes = 0, set()
    for value in ((None,) if name in UNFORCED else FORCED_VALUES):
        result = search_property(subject, name, value, examples, seed)
        tried += result.examples
        notes.add(result.note)
        if result.failure is not None:
            return PropertyResult(name, value, tried, result.failure, result.note)
    if all(n.startswith(VACUOUS) for n in notes):  # nothing was judged under any value
        return PropertyResult(name, None, 0, None, notes.pop())
    return PropertyResult(name, None, tried, None, "; ".join(sorted(n for n in notes if n)))


def search_property(subject: Verifier, name: str, value: str | None, examples: int,
                    seed: int = 0) -> PropertyResult:
    """Search ``examples`` cases for a counterexample to one property under one forced value;
    shrink what is found."""
    failures: list[PropertyFailure] = []
    tried = [0]
    draws: Counter = Counter()
    for case in edge_corpus():  # deterministic first: each edge class, every time
        tried[0] += 1
        failure = check_property(subject, name, case, value, seed, draws)
        if failure is not None:
            return PropertyResult(name, value, tried[0], failure, _draw_note(name, draws, tried[0]))

    def broken(case: VerifyCase) -> bool:
        tried[0] += 1
        failure = check_property(subject, name, case, value, seed, draws)
        if failure is not None:
            failures.append(failure)
        return failure is not None

    config = settings(max_examples=examples, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck))
    try:
        minimal = find(verify_cases(), broken, settings=config, random=random.Random(seed))
    except NoSuchExample:
        return PropertyResult(name, value, tried[0], None, _draw_note(name, draws, tried[0]))
    failure = next(f for f in reversed(failures) if f.case == minimal)
    return PropertyResult(name, value, tried[0], failure, _draw_note(name, draws, tried[0]))


def _draw_note(name: str, draws: Counter, tried: int) -> str:
    broken = draws.pop("(broken)", 0)
    if broken and broken >= tried:
        return f"{VACUOUS}: every call crashed or broke the contract (see properties/contract)"
    if name in UNFORCED:
        return ""
    controlled = draws.pop("(controlled)", 0)
    parts = []
    if not controlled:
        parts.append("the subject made no draw exactcheck could force")
    if draws:
        parts.append("not forced: " + ", ".join(sorted(draws)))
    return "; ".join(parts)


def reproducer(subject_name: str, failure: PropertyFailure, seed: int) -> dict:
    """A JSON-able record that ``exactcheck replay`` re-runs against any subject."""
    p, q, tokens = failure.case.tensors()
    small = p.numel() <= 4096
    return {
        "schema": REPRODUCER_SCHEMA, "subject": subject_name, "property": failure.property,
        "value": failure.value, "seed": seed, "case": failure.case.to_dict(),
        "message": failure.message, "row": failure.row, "output": failure.output,
        "inputs": {"target_probs": p.tolist(), "draft_probs": q.tolist(),
                   "draft_tokens": tokens.tolist()} if small else None,
    }


def replay_reproducer(subject: Verifier, data: dict) -> PropertyFailure | None:
    """Re-run a reproducer's property on its case against ``subject``."""
    if data.get("schema") != REPRODUCER_SCHEMA:
        raise ValueError(f"not an exactcheck reproducer (schema {data.get('schema')!r})")
    return check_property(subject, data["property"], VerifyCase(**data["case"]), data["value"],
                          data["seed"])
