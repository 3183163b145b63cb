"""``exactcheck replay``: re-run a saved property counterexample (a reproducer) against a subject,
trusting neither the file nor the subject.

**The file is checked before anything is imported.** ``read_reproducers`` reads a reproducer
(or an audit report's reproducers) and ``validate_reproducer`` checks each one (schema, fields,
types, sizes, values, and that its parts agree with each other) before the subject it names is
loaded: a bad file is one ``UsageError`` line naming the file, the field, the value and the rule
(exit 2), never a traceback, and no module it names is imported. Replaying then *runs the named
subject's code*, as pytest runs test code: replay files you would run.

**The subject is not trusted either.** ``replay`` makes the property's calls itself first, every
draw forced to the recorded value, and says what happened when the subject

* raised (``BaseException`` subclasses such as ``SystemExit`` included; only
  ``KeyboardInterrupt`` passes): *crashed*;
* returned something that breaks the step contract (None, a wrong shape or dtype): *broke the
  contract* (for the ``contract`` property itself, both are the property failing: *still fails*);
* did not consume the forced value: it made no draw exactcheck forces, a draw escaped the forcing
  where the property needs every draw forced, its output changed between identical forced calls,
  or (replayed against the subject the file names) the values, dtypes, entry points or element
  indices the file records were not delivered to it: *the forced draw was not consumed*.

None of these is ever "holds". The property is judged (``check_property``) only after them:
*still fails* or *holds*.
"""
from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from exactcheck.errors import ContractViolation, SubjectCrashed, UsageError
from exactcheck.report.json_md import AUDIT_SCHEMA
from exactcheck.rules import declared_rule, rule_spec
from exactcheck.contracts.verifier import call_verifier
from exactcheck.step.properties import (forced_values, FROM_SUBJECT, NEED_COMPLETE, PROPERTIES,
                                        REPRODUCER_SCHEMA, UNFORCED, UNSEEN_SOURCE, check_property,
                                        forced_uniform)
from exactcheck.forcing.randomness import CONTROLLED, DrawLog, boundary_value, controlled_randomness, deliverable
from exactcheck.step.strategies import DRAFT_CHOICES, INPUT_DTYPES, RELATIONS, ROW_KINDS, VerifyCase

__all__ = ["validate_reproducer", "read_reproducers", "replay", "ReplayOutcome", "SCHEMAS", "MAX_CASE_ELEMENTS",
           "MAX_FILE_BYTES", "HOLDS", "STILL_FAILS", "CRASHED", "BROKE_CONTRACT", "NOT_CONSUMED"]

SCHEMAS = (REPRODUCER_SCHEMA, "exactcheck.reproducer/1")
MAX_FILE_BYTES = 64 << 20  # a reproducer is a few KiB, an audit report well under 1 MiB
# the tensors a case builds: batch (at least 2: seeded_rows repeats row 0) x (k+1) x V elements;
# a generated case has at most 2^18 (V = 151,936 at B = k = 1: 303,872)
MAX_CASE_ELEMENTS = 1 << 24
MAX_VOCAB, MAX_DRAFT_LENGTH, MAX_BATCH = 1 << 20, 256, 4096
MAX_SEED = 1 << 63  # seeds are below it (exactcheck.options.derive_seed); torch takes seed + a few
INPUTS_ELEMENTS = 4096  # ``reproducer`` keeps the inputs when the target tensor has at most this many
MAX_TEXT = 100_000
MAX_INDEX = 1 << 31
DTYPES = ("float16", "bfloat16", "float32", "float64")  # of a forced draw (``Draw.dtype``)
DRAW_FUNCTIONS = (*CONTROLLED, "the acceptance uniform")
REACH_KINDS = ("forced", "interval", "observed", "structural")
CASE_FIELDS = ("vocab_size", "draft_length", "batch", "row_kind", "relation", "draft_choice", "seed", "dtype")
REQUIRED = ("schema", "subject", "property", "value", "seed", "case")
OPTIONAL = ("rule", "message", "row", "output", "forced_elements", "reachability", "inputs")
REACH_FIELDS = ("kind", "probability", "detail", "draws", "per_draw_probability", "dtype", "draw_function",
                "value", "minimal", "observed", "trials", "low", "high")
INPUT_FIELDS = ("target_probs", "draft_probs", "draft_tokens")

HOLDS, STILL_FAILS, CRASHED, BROKE_CONTRACT, NOT_CONSUMED = (
    "holds", "still fails", "crashed", "broke the contract", "the forced draw was not consumed")


# ---- the file ----------------------------------------------------------------------------------

def read_reproducers(path: str | Path, *, subject_given: bool = False) -> list[dict]:
    """Every reproducer in ``path`` (one reproducer, or an audit report's), each checked by
    ``validate_reproducer``; a ``UsageError`` naming the file otherwise. Nothing is imported.
    ``subject_given``: the subject to run is named apart (``--subject``), so the file's own
    subject need not be loadable."""
    path = str(path)
    try:
        size = Path(path).stat().st_size
        if size > MAX_FILE_BYTES:
            raise UsageError(f"{path}: the file is {size:,} bytes; a reproducer or report is at most "
                             f"{MAX_FILE_BYTES:,}")
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
        raise UsageError(f"{path} is not JSON: {type(exc).__name__}: {_short(str(exc))}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} holds a JSON {type(data).__name__}, not an exactcheck report or reproducer")
    if data.get("schema") == AUDIT_SCHEMA:
        verdicts = data.get("verdicts")
        if not isinstance(verdicts, list) or not all(isinstance(v, dict) for v in verdicts):
            raise UsageError(f"{path} is not an exactcheck reproducer or audit report (its verdicts are not a list "
                             "of objects)")
        found = [(i, v["reproducer"]) for i, v in enumerate(verdicts) if v.get("reproducer") is not None]
        if not found:
            raise UsageError(f"{path} holds no reproducer")
        return [validate_reproducer(r, f"{path}: verdict {i}'s reproducer", subject_given=subject_given)
                for i, r in found]
    if data.get("schema") not in SCHEMAS:
        raise UsageError(f"{path} is not an exactcheck reproducer or audit report (schema "
                         f"{_show(data.get('schema'))}; a reproducer's is {REPRODUCER_SCHEMA!r})")
    return [validate_reproducer(data, path, subject_given=subject_given)]


def _builtin(subject) -> bool:
    from exactcheck.step.subjects import builtin_verifiers
    return isinstance(subject, str) and subject in builtin_verifiers()


def validate_reproducer(record, where: str = "reproducer", *, subject_given: bool = False) -> dict:
    """``record`` if it is a well-formed reproducer whose parts agree with each other; else a
    one-line ``UsageError`` "WHERE: FIELD (VALUE) must ...". Checked: the schema; ``subject`` a
    string of the MODULE:CALLABLE form or a built-in verifier's name (any string when ``subject_given``: it is then only a
    name); ``property`` a known property and ``value`` one of its forced values (a name of
    ``forced_values(property)`` or a finite uniform in [0, 1); None for the unforced ``same_seed``);
    ``seed`` an integer in [0, 2^63); ``rule`` a known rule; the case's fields typed (integers
    are not bools) and bounded, its tensors at most ``MAX_CASE_ELEMENTS`` elements; ``row``,
    ``output``, ``forced_elements``, ``reachability`` (finite probabilities in [0, 1], a forced
    uniform in [0, 1), known dtypes and draw functions) and ``inputs`` typed; and consistency:
    the recorded forced uniform is the one ``value`` delivers in the recorded dtype (where that
    does not hang on the subject's declared rule), the forced element count is the recorded draw
    count, and the recorded inputs are the tensors the case builds. Nothing is imported."""
    check = _Checker(where)
    if not isinstance(record, dict):
        check.fail(f"a reproducer is a JSON object, not {type(record).__name__}")
    unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        check.fail(f"unknown field {_show(unknown[0])} (a reproducer has " + ", ".join(REQUIRED + OPTIONAL) + ")")
    for name in REQUIRED:
        if name not in record:
            check.fail(f"the field {name!r} is missing")
    check.that("schema", record["schema"], record["schema"] in SCHEMAS, f"be one of {', '.join(SCHEMAS)}")
    subject = record["subject"]
    check.text("subject", subject, 1000)
    if not subject_given:
        check.that("subject", subject, _module_callable(subject) or _builtin(subject),
                   "be of the MODULE:CALLABLE form (dotted Python names), or a built-in verifier's name (`exactcheck "
                   "list`); or name the subject to run with --subject")
    prop = record["property"]
    check.that("property", prop, isinstance(prop, str) and prop in PROPERTIES, f"be one of {', '.join(PROPERTIES)}")
    value = record["value"]
    if prop in UNFORCED:
        check.that("value", value, value is None, f"be null: {prop} forces no draw")
    else:
        values = forced_values(prop)
        check.that("value", value, (isinstance(value, str) and value in values) or _uniform(value),
                   f"be one of {', '.join(values)} or a finite uniform in [0, 1)")
    check.integer("seed", record["seed"], 0, MAX_SEED - 1)
    rule = record.get("rule")
    if rule is not None:
        check.text("rule", rule, 1000)
        try:
            rule_spec(rule)
        except (ValueError, KeyError, TypeError) as exc:
            check.fail(f"rule ({_show(rule)}) must name a known rule and its parameters: {_short(str(exc))}")
    case = _check_case(check, record["case"])
    rows = max(case.batch, 2)
    for name in ("message",):
        if record.get(name) is not None:
            check.text(name, record[name], MAX_TEXT)
    if record.get("row") is not None:
        check.integer("row", record["row"], 0, rows - 1)
    output = record.get("output")
    if output is not None:
        check.that("output", output, isinstance(output, list) and len(output) == case.draft_length + 1,
                   f"be null or a list of {case.draft_length + 1} token ids")
        for i, token in enumerate(output):
            check.integer(f"output[{i}]", token, -MAX_SEED, MAX_SEED - 1)
    forced = record.get("forced_elements")
    if forced is not None:
        check.that("forced_elements", forced, isinstance(forced, list) and len(forced) <= MAX_CASE_ELEMENTS,
                   f"be null or a list of at most {MAX_CASE_ELEMENTS:,} element indices")
        for i, index in enumerate(forced):
            check.integer(f"forced_elements[{i}]", index, 0, MAX_INDEX - 1)
        check.that("forced_elements", forced, len(set(forced)) == len(forced), "name each element once")
    reach = record.get("reachability")
    if reach is not None:
        _check_reachability(check, reach)
        _check_forced_value(check, record, prop, value, reach, forced, case, rule)
    if record.get("inputs") is not None:
        _check_inputs(check, record["inputs"], case)
    return record


class _Checker:
    """One reproducer's checks: each failure a ``UsageError`` "WHERE: ..."."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, what: str):
        raise UsageError(f"{self.where}: {what}")

    def that(self, name: str, value, ok: bool, rule: str) -> None:
        if not ok:
            self.fail(f"{name} ({_show(value)}) must {rule}")

    def integer(self, name: str, value, low: int, high: int) -> None:
        self.that(name, value, isinstance(value, int) and not isinstance(value, bool) and low <= value <= high,
                  f"be an integer in [{_bound(low)}, {_bound(high)}]")

    def text(self, name: str, value, longest: int) -> None:
        self.that(name, value, isinstance(value, str) and len(value) <= longest,
                  f"be a string of at most {longest:,} characters")

    def probability(self, name: str, value, nullable: bool = True) -> None:
        ok = (value is None and nullable) or (_number(value) and 0.0 <= value <= 1.0)
        self.that(name, value, ok, "be " + ("null or " if nullable else "") + "a finite number in [0, 1]")


def _check_case(check: _Checker, case) -> VerifyCase:
    check.that("case", case, isinstance(case, dict), "be an object with the fields " + ", ".join(CASE_FIELDS))
    unknown = sorted(set(case) - set(CASE_FIELDS))
    if unknown:
        check.fail(f"case: unknown field {_show(unknown[0])} (a case has " + ", ".join(CASE_FIELDS) + ")")
    for name in CASE_FIELDS[:-1]:  # dtype may be absent (reproducer/1): float32
        if name not in case:
            check.fail(f"case: the field {name!r} is missing")
    check.integer("case.vocab_size", case["vocab_size"], 1, MAX_VOCAB)
    check.integer("case.draft_length", case["draft_length"], 1, MAX_DRAFT_LENGTH)
    check.integer("case.batch", case["batch"], 1, MAX_BATCH)
    for name, known in (("row_kind", ROW_KINDS), ("relation", RELATIONS), ("draft_choice", DRAFT_CHOICES),
                        ("dtype", tuple(dict.fromkeys(INPUT_DTYPES)))):
        if name in case:
            check.that(f"case.{name}", case[name], isinstance(case[name], str) and case[name] in known,
                       f"be one of {', '.join(known)}")
    check.integer("case.seed", case["seed"], 0, MAX_SEED - 1)
    elements = max(case["batch"], 2) * (case["draft_length"] + 1) * case["vocab_size"]
    if elements > MAX_CASE_ELEMENTS:
        check.fail(f"case (vocab_size {case['vocab_size']:,}, draft_length {case['draft_length']}, batch "
                   f"{case['batch']}) builds {elements:,} elements per tensor (max(batch, 2) x (draft_length + 1) "
                   f"x vocab_size); a replay builds at most 2^{MAX_CASE_ELEMENTS.bit_length() - 1}")
    return VerifyCase(**case)


def _check_reachability(check: _Checker, reach) -> None:
    check.that("reachability", reach, isinstance(reach, dict), "be null or an object")
    unknown = sorted(set(reach) - set(REACH_FIELDS))
    if unknown:
        check.fail(f"reachability: unknown field {_show(unknown[0])}")
    if "kind" not in reach:
        check.fail("reachability: the field 'kind' is missing")
    check.that("reachability.kind", reach["kind"], reach["kind"] in REACH_KINDS, f"be one of {', '.join(REACH_KINDS)}")
    for name in ("probability", "per_draw_probability"):
        check.probability(f"reachability.{name}", reach.get(name))
    if reach.get("detail") is not None:
        check.text("reachability.detail", reach["detail"], MAX_TEXT)
    for name in ("draws", "observed", "trials"):
        if name in reach:
            check.integer(f"reachability.{name}", reach[name], 0, MAX_INDEX - 1)
    if "minimal" in reach:
        check.that("reachability.minimal", reach["minimal"], isinstance(reach["minimal"], bool), "be true or false")
    uniform = reach.get("value")
    check.that("reachability.value", uniform, uniform is None or _uniform(uniform),
               "be null or a finite uniform in [0, 1)")
    for name in ("low", "high"):
        check.that(f"reachability.{name}", reach.get(name), reach.get(name) is None or _uniform(reach[name]),
                   "be null or a finite uniform in [0, 1)")
    if reach["kind"] == "interval":
        low, high = reach.get("low"), reach.get("high")
        check.that("reachability", reach, None not in (low, high, uniform) and low <= uniform <= high,
                   "of kind 'interval' hold low <= value <= high")
    for name, known in (("dtype", DTYPES), ("draw_function", DRAW_FUNCTIONS)):
        text = reach.get(name)
        ok = text is None or (isinstance(text, str) and len(text) <= 1000
                              and all(part.strip() in known for part in text.split(",")))
        check.that(f"reachability.{name}", text, ok, f"be null or a comma-separated list of {', '.join(known)}")


def _check_forced_value(check: _Checker, record, prop, value, reach, forced, case: VerifyCase, rule) -> None:
    """The recorded forced draws agree with the value and with each other."""
    if reach["kind"] not in ("forced", "interval") or not reach.get("draws"):
        return
    if prop in UNFORCED:
        check.fail(f"reachability says {reach['draws']} forced draws, but {prop} forces none")
    for name in ("value", "dtype", "draw_function"):
        if reach.get(name) is None:
            check.fail(f"reachability.{name} is null, but it records {reach['draws']} forced draws")
    if forced is not None and len(forced) != reach["draws"]:
        check.fail(f"forced_elements names {len(forced)} elements, but reachability.draws says {reach['draws']}: "
                   "the file is inconsistent with itself")
    dtypes = [getattr(torch, part.strip()) for part in reach["dtype"].split(",")]
    uniform = reach["value"]
    if value in ("zero", "one_minus_ulp") or _uniform(value):
        delivered = {boundary_value(value, dtype) for dtype in dtypes}
        stands = f"{value!r}"
    elif rule is not None:  # a ratio of the rule the file names: computed from the case alone
        try:
            c = forced_uniform(value, case.tensors(), rule_spec(rule))
        except IndexError:
            check.fail(f"value ({value!r}) is no threshold of the rule {rule!r}, which no forced uniform decides")
        delivered = {deliverable(c, dtype) for dtype in dtypes}
        stands = f"{value!r} ({c!r} on this case, by {rule})"
    else:  # a ratio of the subject's own rule: the replay checks that it delivers the recorded uniform
        delivered = {uniform} if any(deliverable(uniform, dtype) == uniform for dtype in dtypes) else set()
        stands = f"{value!r} (a value a {reach['dtype']} draw can return)"
    if uniform not in delivered:
        check.fail(f"reachability.value ({uniform!r}) is not what the forced value {stands} delivers to a "
                   f"{reach['dtype']} draw ({', '.join(repr(d) for d in sorted(delivered)) or 'none'}): "
                   "the file is inconsistent with itself")


def _check_inputs(check: _Checker, inputs, case: VerifyCase) -> None:
    check.that("inputs", inputs, isinstance(inputs, dict) and set(inputs) == set(INPUT_FIELDS),
               "be null or an object with " + ", ".join(INPUT_FIELDS))
    if case.batch * (case.draft_length + 1) * case.vocab_size > INPUTS_ELEMENTS:
        check.fail(f"inputs are recorded only for cases of at most {INPUTS_ELEMENTS:,} target elements; this case "
                   "has more: the file is inconsistent with itself")
    for name, tensor in zip(INPUT_FIELDS, case.tensors()):
        if inputs[name] != tensor.tolist():
            check.fail(f"inputs.{name} is not the tensor the case builds (its fields were changed, or the inputs): "
                       "the file is inconsistent with itself")


def _module_callable(text) -> bool:
    if not isinstance(text, str):
        return False
    module, sep, attr = text.partition(":")
    return bool(sep) and all(part.isidentifier() for side in (module, attr) for part in side.split("."))


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _uniform(value) -> bool:
    return _number(value) and 0.0 <= value < 1.0


def _bound(n: int) -> str:
    if abs(n) >= 1 << 20 and (abs(n) + 1) & abs(n) == 0:
        return f"{'-' if n < 0 else ''}2^{abs(n).bit_length()} - 1"
    if abs(n) >= 1 << 20 and abs(n) & (abs(n) - 1) == 0:
        return f"{'-' if n < 0 else ''}2^{abs(n).bit_length() - 1}"
    return f"{n:,}"


def _short(text: str, length: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= length else text[:length - 3] + "..."


def _show(value) -> str:
    return _short(repr(value), 80)


# ---- the replay --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReplayOutcome:
    """What one replay found: ``status`` is ``HOLDS``, ``STILL_FAILS``, ``CRASHED``,
    ``BROKE_CONTRACT`` or ``NOT_CONSUMED``; ``detail`` says what happened."""

    status: str
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.status == HOLDS

    def line(self, record: dict, name: str) -> str:
        case = ", ".join(f"{k}={v}" for k, v in record["case"].items())
        head = f"{record['property']} on [{case}] with uniforms {record['value']}: "
        if self.holds:
            return head + f"holds for {name}"
        if self.status == STILL_FAILS:
            return head + "still fails\n  " + self.detail
        return head + f"{self.status}: {self.detail}"


class _Call:
    """One guarded call of the subject: its output or what went wrong, and the draw log."""

    def __init__(self, out=None, error: BaseException | None = None, log: DrawLog | None = None):
        self.out, self.error, self.log = out, error, log


def _guarded(fn):
    """(fn(), None), or (None, the error) for anything it raised but KeyboardInterrupt: foreign code."""
    try:
        return fn(), None
    except KeyboardInterrupt:
        raise
    except (SubjectCrashed, ContractViolation) as exc:
        return None, exc
    except BaseException as exc:  # SystemExit, GeneratorExit, custom BaseExceptions: a crash
        return None, SubjectCrashed(exc)


def _call(subject, tensors, seed: int, c, options: dict) -> _Call:
    gen = torch.Generator().manual_seed(seed)
    handed = [gen, *(options.get("row_generators") or ())]
    if c is None:  # unforced (same_seed): torch's global generator is put back as it was
        state = torch.random.get_rng_state()
        try:
            out, error = _guarded(lambda: call_verifier(subject, *tensors, gen, **options))
        finally:
            torch.random.set_rng_state(state)
        return _Call(out, error)
    with controlled_randomness(c, generators=handed) as log:
        out, error = _guarded(lambda: call_verifier(subject, *tensors, gen, **options))
    return _Call(out, error, log)


def _accepts_row_generators(subject) -> bool:
    try:
        return "row_generators" in inspect.signature(subject).parameters
    except (TypeError, ValueError):
        return False


def _calls(prop: str, case: VerifyCase, seed: int):
    """The inputs (label, tensors, options maker) of the calls ``check_property`` makes for ``prop``."""
    tensors = case.tensors()
    if prop == "seeded_rows":  # row 0 repeated, alternately unseeded and seeded (as check_property does)
        rows = max(case.batch, 2)
        expanded = tuple(t[:1].expand(rows, *t.shape[1:]).contiguous() for t in tensors)
        yield "", expanded, lambda: {"row_generators": [torch.Generator().manual_seed(seed + b) if b % 2 else None
                                                         for b in range(rows)]}
        return
    yield "", tensors, dict
    if prop == "row_independence":
        for row in range(case.batch):
            yield f" (row {row} alone)", tuple(t[row:row + 1] for t in tensors), dict


def replay(subject, record: dict, *, as_recorded: bool = False) -> ReplayOutcome:
    """Replay a reproducer (checked by ``validate_reproducer``) against ``subject``. ``as_recorded``:
    ``subject`` is the one the file names, so the forced draws must reach it as the file records
    them (values, dtypes, entry points, element indices). A ``UsageError`` where the reproducer
    cannot be replayed on this subject at all (seeded_rows on a subject that takes no
    row_generators)."""
    prop, value, seed = record["property"], record["value"], record["seed"]
    case = VerifyCase(**record["case"])
    if prop == "seeded_rows" and not _accepts_row_generators(subject):
        raise UsageError(f"{prop} is replayed with row_generators, and the subject takes no row_generators argument")
    if record.get("rule"):
        rule = rule_spec(record["rule"])
    else:
        rule, error = _guarded(lambda: declared_rule(subject))
        if error is not None:
            return ReplayOutcome(CRASHED, f"reading its acceptance_rule: {error}")
    c = None
    if prop not in UNFORCED:
        try:
            c = forced_uniform(value, case.tensors(), rule)
        except IndexError:  # the rule has no oracle: no forced uniform decides it
            raise UsageError(f"the forced value {value!r} is no threshold of the subject's rule "
                             f"({rule.label if rule else 'token-wise'}): it cannot be replayed on this subject") from None
    for index, (label, tensors, options) in enumerate(_calls(prop, case, seed)):
        call = _call(subject, tensors, seed, c, options())
        if isinstance(call.error, SubjectCrashed):
            where = _frame(call.error)
            return ReplayOutcome(STILL_FAILS if prop == "contract" else CRASHED,
                                 f"{call.error}{label}" + (f" (at {where})" if where else ""))
        if isinstance(call.error, ContractViolation):
            return ReplayOutcome(STILL_FAILS if prop == "contract" else BROKE_CONTRACT, f"{call.error}{label}")
        if c is None:
            continue
        missing = _not_consumed(prop, call.log, record if as_recorded and index == 0 else None)
        if missing:
            return ReplayOutcome(NOT_CONSUMED, missing + label)
        again = _call(subject, tensors, seed, c, options())
        if again.error is not None or not torch.equal(again.out, call.out):
            return ReplayOutcome(NOT_CONSUMED, "alone: " + UNSEEN_SOURCE + label)
    failure, error = _guarded(lambda: check_property(subject, prop, case, value, seed, rule=rule))
    if error is not None:  # a second run of the same calls raised: still a crash
        return ReplayOutcome(STILL_FAILS if prop == "contract" else CRASHED, str(error))
    if failure is not None:
        return ReplayOutcome(STILL_FAILS, failure.message)
    return ReplayOutcome(HOLDS)


def _frame(error: SubjectCrashed) -> str:
    frames = getattr(error, "frames", ())
    return frames[-1] if frames else ""


def _not_consumed(prop: str, log: DrawLog, record: dict | None) -> str:
    """Why the forced value did not reach the subject as needed ('' if it did)."""
    if not log.values():
        drew = log.describe_escapes()
        return ("the subject made no draw exactcheck forces (" + ", ".join(CONTROLLED) + ")"
                + (f"; it drew from {drew}" if drew else ""))
    if prop in NEED_COMPLETE and not log.complete:
        return f"a draw escaped the forcing ({log.describe_escapes()}), and {prop} needs every draw forced"
    if record is None:
        return ""
    forced = record.get("forced_elements") or ()
    if forced and max(forced) >= log.elements:
        return (f"the file forces element {max(forced)}, but this call drew {log.elements} forced elements "
                "in all (not as recorded)")
    reach = record.get("reachability")
    if not reach or reach["kind"] not in ("forced", "interval") or not reach.get("draws"):
        return ""
    got = sorted({(str(d.dtype).replace("torch.", ""), d.entry, d.value) for d in log.draws if d.forced})
    said = (f"the file records {reach['draw_function']} ({reach['dtype']}) draws of {reach['value']!r}; this call "
            "delivered " + ", ".join(f"{v!r} to {e} ({t})" for t, e, v in got) + " (not as recorded)")
    if reach["value"] not in {v for _, _, v in got}:
        return said
    if not {p.strip() for p in reach["dtype"].split(",")} <= {t for t, _, _ in got}:
        return said
    functions = {p.strip() for p in reach["draw_function"].split(",")} - {"the acceptance uniform"}
    if not functions <= {e for _, e, _ in got}:
        return said
    return ""
