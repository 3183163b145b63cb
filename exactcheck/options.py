"""What every layer of an audit reads, and nothing else: its options, its levels, how its alpha
is split, the kinds of check, the checks and the plan record, the finding categories, the
pseudo-worlds and the name of an audit kind.

This is the leaf of the package: it imports no other exactcheck module but ``exactcheck.errors``
(itself a leaf: the one root exception), no torch and no scipy, so ``exactcheck --help``, the
pytest plugin and every layer below the runners may read it. The planners that fill an
``AuditPlan`` live next to the audits they plan (``exactcheck.step.plan``, ``exactcheck.e2e.plan``).
"""
from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar

from exactcheck.errors import UsageError

__all__ = ["Level", "LEVEL_NAMES", "Option", "chosen_worlds", "DEFAULT_ALPHA", "DEFAULT_LEVEL", "DEFAULT_REQUIRE", "DEFAULT_CALL_ELEMENTS", "DEFAULT_CALL_TIMEOUT",
           "derive_seed",
           "REAL_MODELS", "HYBRID_MODELS", "BUILTIN_GENERATORS", "REQUIRABLE", "Category", "AuditOptions", "AlphaBudget", "CheckKind", "Check", "AuditPlan", "PseudoWorld",
           "AuditKind", "SubjectKind"]

DEFAULT_ALPHA = 1e-3
DEFAULT_LEVEL = "quick"  # every front end's default: the CLI, the gate, the plugin, Python
DEFAULT_REQUIRE = ("exactness", "conformance")  # always gating; --require adds the others
REAL_MODELS = ("tiny-llama", "tiny-gpt2", "smollm2")  # the real model pairs of ``exactcheck greedy --model``
# the real tiny hybrid transformers models (recurrent or conv state beside attention) it also takes:
# ``exactcheck.e2e.real_models.hybrid_model_names`` builds them (a test keeps the two lists equal)
HYBRID_MODELS = ("tiny-qwen3-next", "tiny-qwen3-5-text", "tiny-qwen3-5-moe-text", "tiny-lara-mini", "tiny-olmo-hybrid",
                 "tiny-kimi-linear", "tiny-bailing-hybrid", "tiny-bamba", "tiny-falcon-h1", "tiny-granitemoehybrid",
                 "tiny-nemotron-h", "tiny-zamba2", "tiny-jamba", "tiny-zamba", "tiny-lfm2", "tiny-lfm2-moe", "tiny-lfm3",
                 "tiny-zaya")
# the generators ``exactcheck e2e`` (and every generator audit) takes by name (``exactcheck.audit_kinds``)
BUILTIN_GENERATORS = ("reference-loop", "batched-reference-loop", "reference-tli", "reference-slem", "transformers-assisted",
                      "transformers-prompt-lookup", "transformers-ensemble-0.9", "transformers-assisted-universal",
                      "transformers-assisted-different-tokenizers")
# elements of target_probs (B * (k+1) * V) per verify call in a step audit, unless an audit asks
# for another size (``AuditOptions.call_elements``; ``exactcheck.memory.device_max_elements``)
DEFAULT_CALL_ELEMENTS = 1 << 24
# what pads a verifier's output row past its last emitted token (the step contract's PADDING)
PADDING = -1
# seconds one call of the subject may take before it is stopped and reported as a hang
# (``AuditOptions.call_timeout``, ``--call-timeout``; ``exactcheck.subject_call``): generous for an
# engine's kernel under Triton's interpreter, whose largest batches here take well under a minute
DEFAULT_CALL_TIMEOUT = 600.0


class Level(enum.Enum):
    """Audit depth, defined by the TV every law is planned to detect with power 0.9 at its
    share of alpha (``exactcheck.stats.planning``), and the most trials one world may use for it."""

    QUICK = "quick"
    STANDARD = "standard"
    RELEASE = "release"

    @property
    def detect_tv(self) -> float:
        return {Level.QUICK: 0.05, Level.STANDARD: 0.01, Level.RELEASE: 0.003}[self]

    @property
    def max_samples(self) -> int:
        """The cap on trials per world; a law whose condition is too rare to reach ``detect_tv``
        within it is reported with the TV it does reach."""
        return {Level.QUICK: 50_000, Level.STANDARD: 1_000_000, Level.RELEASE: 10_000_000}[self]

    @property
    def chain_sequences(self) -> int:
        """Sequences generated through a large-vocabulary chain-rule world."""
        return {Level.QUICK: 200, Level.STANDARD: 1_000, Level.RELEASE: 5_000}[self]

    @property
    def min_samples(self) -> int:
        """The floor on trials per world. Certifying "TV <= eps" costs more than detecting eps
        (the bound adds a concentration radius to the plug-in TV); the floor lets a passing
        audit certify a three-cell law to about the level's TV (standard: <= 0.01)."""
        return {Level.QUICK: 5_000, Level.STANDARD: 150_000, Level.RELEASE: 1_500_000}[self]

    @property
    def property_examples(self) -> int:
        """Random cases searched per property and forced value, after the fixed edge corpus."""
        return {Level.QUICK: 8, Level.STANDARD: 12, Level.RELEASE: 200}[self]

    @property
    def generations(self) -> int:
        """Sampled generations per model world in an end-to-end audit."""
        return {Level.QUICK: 2_000, Level.STANDARD: 8_000, Level.RELEASE: 40_000}[self]


LEVEL_NAMES = tuple(level.value for level in Level)


def chosen_worlds(asked, known, what: str) -> list[str]:
    """The worlds an audit runs: those ``asked`` (``AuditOptions.worlds``), each one of ``known``
    (else a ``UsageError`` naming the unknown ones and the known), or every known one."""
    known = list(known)
    if not asked:
        return known
    unknown = [w for w in asked if w not in known]
    if unknown:
        raise UsageError(f"unknown {what}(s) {unknown}; known: {', '.join(known)}")
    return list(asked)


def derive_seed(root: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` under ``root``: adding or dropping a check does not
    shift any other check's random stream."""
    digest = hashlib.sha256(f"{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Category(enum.Enum):
    """What a finding is about. An audit's pass/fail follows ``EXACTNESS`` unless more
    categories are required (``--require reproducible``, ``--require input-handling``)."""

    EXACTNESS = "exactness"  # output laws, forbidden tokens, contract, crashes
    # the rule-specific laws (accepted length, correction law, decisions at forced uniforms): the
    # subject follows the rule it declares, or one registered exact rule if it declares none
    CONFORMANCE = "conformance"
    REPRODUCIBILITY = "reproducibility"  # the same seed gives the same output
    INPUT_HANDLING = "input-handling"  # NaN, inf, negative, all-zero rows
    SPECULATION = "speculation"  # a served system's speculation did not run where claimed (not the law's)

    @property
    def flag(self) -> str:
        """The word ``--require`` takes for this category ("reproducible" for reproducibility)."""
        return "reproducible" if self is Category.REPRODUCIBILITY else self.value

    @classmethod
    def parse(cls, name: str) -> "Category":
        """A category from its value or the command line's word for it."""
        for category in cls:
            if name in (category.value, category.flag) or (category is cls.INPUT_HANDLING and name == "inputs"):
                return category
        raise ValueError(f"category ({name!r}) must be one of exactness, reproducible, input-handling, speculation")


# the categories ``--require`` can add (exactness always gates)
REQUIRABLE = tuple(c.flag for c in Category if c.value not in DEFAULT_REQUIRE)


class PseudoWorld(str, enum.Enum):
    """Check groups of a step audit that are not worlds one drives: the deterministic property
    search and the invalid-input probe (their values are names ``--world`` takes); and the worker
    process of an isolated audit of any kind (``exactcheck.isolation``), which only a verdict that
    the subject killed it names."""

    PROPERTIES = "properties"
    INPUTS = "inputs"
    PROCESS = "process"


class AuditKind(str):
    """The name of an audit kind: the key of its row in ``exactcheck.audit_kinds.AUDIT_KINDS``, the
    key naming a subject of that kind in the gate's ``[[tool.exactcheck.subject]]`` tables and the
    ``kind`` the pytest plugin takes (``verifier``: a step-level verifier, vLLM's rejection-sampler
    layout; ``generator``: an end-to-end generator, ``exactcheck.contracts.generator``; ``tree``: a tree
    verifier, ``exactcheck.contracts.tree_verifier``; ``tree-loop``, ``greedy``, ``grammar``, ``serve``, ``cost``,
    ``selftest``). One type for the concept: an audit's result carries its kind (``AuditResult.kind``)
    and, for the JSON schema, the word its reports have always written (``AuditResult.label``).

    The registry, not this class, says which kinds exist: a new audit kind is its package and one
    row there, and its name needs no member here. A kind is a string (``AuditKind.TREE ==
    "tree"``), one object per name (``AuditKind("tree") is AuditKind.TREE``), with ``value``
    as an enum member has."""

    __slots__ = ()
    _names: dict = {}

    def __new__(cls, name: str) -> "AuditKind":
        if isinstance(name, AuditKind):
            return name
        if not isinstance(name, str) or not name:
            raise ValueError(f"an audit kind is a non-empty name, not {name!r}")
        known = cls._names.get(name)
        if known is None:
            known = cls._names.setdefault(name, super().__new__(cls, name))
        return known

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"AuditKind({self.value!r})"

    def __reduce__(self):
        return AuditKind, (self.value,)


AuditKind.VERIFIER = AuditKind("verifier")
AuditKind.GENERATOR = AuditKind("generator")
AuditKind.TREE = AuditKind("tree")
SubjectKind = AuditKind  # its name before the result types' enum was folded into it (kept for callers)


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _strings(v) -> bool:
    return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)


def _category(name: str) -> bool:
    try:
        Category.parse(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Option:
    """How every front end states one ``AuditOptions`` field, declared once on the field
    (``metadata``): its command-line ``flag`` (``--alpha``; a ``switch`` turning a default-True field
    off, such as ``--no-stop-early``), ``type`` and ``metavar``, whether it repeats (``append``), its
    ``choices``, its ``help``; and what a valid value is (``valid``, a test of a value as a config file
    or a Python caller gives it, with ``rule`` its words). The command line (``exactcheck.arguments
    .option``), the gate's and the pytest plugin's checks, ``AuditOptions.build`` and every reproduce
    line (``Option.flag_text``) read it from here."""

    flag: str
    help: str
    valid: Callable[[object], bool]
    rule: str
    type: Callable | None = None
    metavar: str | None = None
    choices: tuple | None = None
    append: bool = False
    switch: bool = False
    show: Callable[[object], str] | None = None  # how a value is written on the command line (default: repr of a float)
    # how a loose string (a config file's, a Python caller's) becomes the value; default: ``type`` where it
    # is int or float, else the string as it is
    parse: Callable[[str], object] | None = None

    def convert(self, value):
        """``value`` as the field holds it (a string parsed: ``parse``, else an int or float ``type``)."""
        parse = self.parse or (self.type if self.type in (int, float) else None)
        return parse(value) if parse is not None and isinstance(value, str) else value

    def flag_text(self, value) -> str:
        """The value as the command line states it (a repeatable flag once per item; a switch when off)."""
        value = getattr(value, "value", value)  # a Level as its name
        if self.switch:
            return self.flag if not value else ""
        if self.append:
            return " ".join(f"{self.flag} {item}" for item in value)
        if self.show is not None:
            return f"{self.flag} {self.show(value)}"
        return f"{self.flag} {value!r}" if isinstance(value, float) else f"{self.flag} {value}"

    def invalid(self, name: str, value) -> str | None:
        """None if ``value`` is valid, else "NAME (VALUE) must be RULE"."""
        return None if self.valid(value) else f"{name} ({value!r}) must be {self.rule}"


def option(default, flag: str, help: str, valid: Callable[[object], bool], rule: str, **how):
    """An ``AuditOptions`` field with its ``Option`` (``metadata["option"]``)."""
    return field(default=default, metadata={"option": Option(flag, help, valid, rule, **how)})


@dataclass(frozen=True)
class AuditOptions:
    """What to run, as every front end states it. ``worlds``: only these (world names,
    ``properties``, ``properties/NAME``, ``inputs``); ``require``: finding categories that fail
    the audit besides exactness ("reproducibility", "input-handling"). The options several kinds
    share carry their ``Option`` (flag, help, validation) on the field: ``AuditOptions.option``."""

    level: Level = option(Level(DEFAULT_LEVEL), "--level", "the TV every law is planned to detect: quick 0.05, "
                          "standard 0.01, release 0.003 (see `exactcheck plan`)",
                          lambda v: isinstance(v, (str, Level)) and str(getattr(v, "value", v)) in LEVEL_NAMES,
                          "one of " + ", ".join(LEVEL_NAMES), choices=LEVEL_NAMES)
    seed: int = option(0, "--seed", "root seed (default 0): every world's, shard's and request's seed derives from it",
                       lambda v: _whole(v) and v >= 0, "a non-negative integer", type=int)
    alpha: float = option(DEFAULT_ALPHA, "--alpha", "false-alarm budget for the whole audit (default 1e-3), split "
                          "by Holm; with early stopping, half goes to the early-stopping tests and half to Holm",
                          lambda v: _number(v) and 0 < v < 1, "a number in (0, 1)", type=float)
    device: str = option("cpu", "--device", "torch device for the subject's tensors or the models (cpu, cuda, cuda:1)",
                         lambda v: isinstance(v, str) and v != "", "a device name (cpu, cuda, cuda:1)")
    worlds: tuple[str, ...] | None = option(None, "--world", "only this world (repeatable; see `exactcheck list`)",
                                            _strings, "a list of world names (see `exactcheck list`)",
                                            metavar="NAME", append=True)
    properties: bool = True
    stop_early: bool = option(True, "--no-stop-early", "run every world to its budget (default: stop at the first "
                              "defect an anytime-valid test makes evident)", lambda v: isinstance(v, bool),
                              "true or false", switch=True)
    detect_tv: float | None = option(None, "--detect-tv", "plan the budget to detect this TV instead of the level's",
                                     lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]", type=float,
                                     metavar="EPS")
    max_samples: int | None = option(None, "--max-samples", "cap on trials (requests, generations) per world "
                                     "(default: the level's: 50k, 1M, 10M)", lambda v: _whole(v) and v >= 1,
                                     "a positive integer", type=int, metavar="N")
    require: tuple[str, ...] = option(DEFAULT_REQUIRE, "--require", "also fail on findings of this category "
                                      "(repeatable; by default only exactness findings fail: laws, forbidden "
                                      "tokens, acceptance decisions, contract, crashes)",
                                      lambda v: _strings(v) and all(_category(c) for c in v),
                                      "a list of categories (" + ", ".join(REQUIRABLE) + ")", choices=REQUIRABLE,
                                      append=True)
    generations: int | None = option(None, "--generations", "sampled generations per world (default: the level's)",
                                     lambda v: _whole(v) and v >= 1, "a positive integer", type=int, metavar="N")
    # step audits: the verification rule the subject is judged by (``exactcheck.rules``: a name or
    # NAME:param=value,...): ``rule`` as the user gives it (``--rule``), else the subject's own
    # ``acceptance_rule`` (set by the step entry point); None: undeclared, judged against every
    # registered exact rule
    rule: str | None = None
    acceptance_rule: str | None = None
    # tree audits: the tree rule conformance is judged by (``exactcheck.tree.rules``; ``--rule`` of
    # ``exactcheck tree``, checked against that registry when the audit plans); None: the subject's
    # own ``tree_rule``, else exactness alone
    tree_rule: str | None = None
    # shards per batch (step audits: seeds derived per shard) or per run (end-to-end audits:
    # generations keep their seeds); ``exactcheck.executors``
    shards: int = option(1, "--shards", "split every batch (or run) into N shards with derived seeds (default 1); "
                         "the counts are merged, so alpha and the verdicts' meaning are unchanged",
                         lambda v: _whole(v) and v >= 1, "a positive integer", type=int, metavar="N")
    # step audits: the largest target_probs tensor (B * (k+1) * V elements) handed to the subject
    # in one call; None: ``DEFAULT_CALL_ELEMENTS``, the same on every machine. The size decides
    # which random numbers each trial gets, so a different size gives different (equally valid)
    # samples, and the reproducer names it. "auto": half the device's free memory, resolved to a
    # number when the audit starts (``exactcheck.memory.device_max_elements``)
    call_elements: int | str | None = option(
        None, "--call-elements", "largest target_probs tensor (B*(k+1)*V elements) per verify call: a number, or "
        "auto (half the device's free memory); default 2^24 on every machine. Another size draws other random "
        "numbers: the same seed gives other, equally valid samples, and the reproducer names it",
        lambda v: v == "auto" or (_whole(v) and v >= 1), "a positive integer or 'auto'", metavar="N|auto",
        parse=lambda v: v if v == "auto" else int(v))
    # step audits: a wall-clock budget for a slow subject (an interpreted kernel): each world's
    # trials are cut to what the subject's measured speed allows (``exactcheck.step.plan.
    # fit_to_seconds``); the alpha family is unchanged and every verdict states the TV it could
    # detect at the trials it drew. None: the level's budget, however long it takes
    max_seconds: float | None = None
    # step audits: trials per world, set (WORLD, N) pairs replacing the planned budget of those
    # worlds; ``max_seconds`` resolves to this when the audit starts, so a report's reproduce
    # lines draw the same trials on any machine (``--trials WORLD=N``)
    trials: tuple[tuple[str, int], ...] | None = None
    # step audits under early stopping, without ``max_seconds``: the laws look once, at 1/64 of
    # their budget, then the properties are searched before any further trial, and the audit stops
    # at the first defect either shows (the selftest's mutants, where the question is whether each
    # is found, and by what a user meets first; an audit of a real subject keeps its laws whatever
    # the properties find, since a boundary finding says nothing of the output law)
    properties_first: bool = False
    # step audits under early stopping: the looks double from one trial (True), or start at the
    # first share of the budget (False: what ``max_seconds`` resolves to, whose calls are costly);
    # the batches, so the samples, differ, and reproduce lines state it (``--looks-from-share``)
    looks_from_one: bool = True
    # seconds one subject call may take (``exactcheck.subject_call``); None: unbounded
    call_timeout: float | None = option(
        DEFAULT_CALL_TIMEOUT, "--call-timeout", f"seconds one call of the subject may take before it is stopped and "
        f"reported as a hang (default {DEFAULT_CALL_TIMEOUT:g}; 0: no limit)",
        lambda v: _number(v) and 0 <= v < math.inf, "a finite number of seconds, at least 0 (0: no limit)",
        type=float, metavar="S", show=lambda v: f"{v or 0:g}")
    # step audits: worker processes the laws' batches and the property searches run in
    # (``exactcheck.step.workers``); the seeds are the serial run's, so are the verdicts
    jobs: int = option(1, "--jobs", "run the independent draws (laws' batches, property searches, generations) in "
                       "N worker processes; the verdicts are the serial run's with the same seed (the command "
                       "line's default, auto: one per core for e2e, recurrent and tree-loop audits of exactcheck's "
                       "own subjects on the CPU, else 1; a Python caller's: 1)",
                       lambda v: _whole(v) and v >= 1, "a positive integer", type=int, metavar="N")

    @classmethod
    def option(cls, name: str) -> Option:
        """The ``Option`` of the field ``name`` (a ``KeyError`` for a field with none)."""
        return cls.__dataclass_fields__[name].metadata["option"]

    @classmethod
    def shared(cls) -> dict[str, Option]:
        """Every field that carries an ``Option``, by name."""
        return {name: f.metadata["option"] for name, f in cls.__dataclass_fields__.items() if "option" in f.metadata}

    @classmethod
    def build(cls, **values) -> "AuditOptions":
        """Options from loose values (strings, lists, None for the defaults), validated: a bad
        value raises ``UsageError`` naming it and its rule (the field's ``Option.rule``)."""
        values = {k: v for k, v in values.items() if v is not None}
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"unknown audit option(s) {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        # the loose forms a caller may give: a level's name, numbers as strings, a device object, any sequence
        for name, spec in cls.shared().items():
            if name in values:
                try:
                    values[name] = spec.convert(values[name])
                except ValueError:
                    raise UsageError(f"{name} ({values[name]!r}) must be {spec.rule}") from None
        if isinstance(values.get("level"), Level):
            values["level"] = values["level"].value
        for key in ("worlds", "require"):
            if isinstance(values.get(key), str):
                values[key] = (values[key],)
            elif key in values:
                values[key] = tuple(values[key])
        if "device" in values:
            values["device"] = str(values["device"])
        for name, spec in cls.shared().items():
            if name in values and name != "require" and (problem := spec.invalid(name, values[name])):
                raise UsageError(problem)
        values["level"] = Level(values.get("level", DEFAULT_LEVEL))
        if "worlds" in values:
            values["worlds"] = values["worlds"] or None
        if values.get("call_timeout") is not None:
            values["call_timeout"] = float(values["call_timeout"]) or None
        if values.get("max_seconds") is not None:
            try:
                values["max_seconds"] = float(values["max_seconds"])
            except (TypeError, ValueError):
                raise UsageError(f"max_seconds ({values['max_seconds']!r}) must be a number of seconds") from None
            if not values["max_seconds"] > 0:
                raise UsageError(f"max_seconds ({values['max_seconds']}) must be positive")
        if values.get("trials") is not None:
            values["trials"] = _world_trials(values["trials"]) or None
        values["require"] = _resolve_require(values.get("require", ()))
        for key in ("rule", "acceptance_rule"):
            if values.get(key) is not None:
                values[key] = _rule_label(values[key])
        return cls(**values)

    @classmethod
    def of(cls, options: "AuditOptions | None", settings: dict) -> "AuditOptions":
        """The options of a run given either ``options`` or loose keyword ``settings``."""
        if options is None:
            return cls.build(**settings)
        if settings:
            raise UsageError(f"give options or keyword settings, not both ({sorted(settings)})")
        return options

    @property
    def target_tv(self) -> float:
        return self.level.detect_tv if self.detect_tv is None else self.detect_tv

    @property
    def max_elements(self) -> int:
        """Elements of target_probs per verify call in a step audit ("auto" resolved first)."""
        if self.call_elements == "auto":
            raise ValueError("call_elements 'auto' is resolved on the device when the audit starts")
        return DEFAULT_CALL_ELEMENTS if self.call_elements is None else self.call_elements

    @property
    def cap(self) -> int:
        return self.level.max_samples if self.max_samples is None else int(self.max_samples)

    @property
    def generations_per_world(self) -> int:
        """Sampled generations per model world and policy in an end-to-end audit."""
        return self.level.generations if self.generations is None else int(self.generations)


def _world_trials(value) -> tuple[tuple[str, int], ...]:
    """``trials`` as sorted (world, n) pairs, from a mapping, pairs, or WORLD=N strings."""
    items = value.items() if isinstance(value, dict) else value
    out = {}
    for item in items:
        if isinstance(item, str):
            world, _, n = item.partition("=")
        else:
            world, n = item
        try:
            n = int(n)
        except (TypeError, ValueError):
            raise UsageError(f"trials ({item!r}) must be WORLD=N with N a whole number") from None
        if n < 1:
            raise UsageError(f"trials ({item!r}): N must be positive")
        out[str(world)] = n
    return tuple(sorted(out.items()))


def _rule_label(value) -> str:
    """A rule as its canonical label, checked against the registry (``exactcheck.rules``, numpy
    only; imported when a rule is named)."""
    from exactcheck.rules import rule_spec
    try:
        return rule_spec(value).label
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _resolve_require(require) -> tuple[str, ...]:
    """The categories an audit gates on: exactness always, plus those named."""
    if isinstance(require, str):
        require = (require,)
    try:
        named = {Category.parse(r).value for r in require}
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return tuple(c.value for c in Category if c.value in named | set(DEFAULT_REQUIRE))


@dataclass(frozen=True)
class AlphaBudget:
    """How alpha is split over a family of ``checks`` statistical checks. With early stopping,
    half goes to the anytime-valid e-processes (Bonferroni: each law's e-value must pass
    2m/alpha) and half to the fixed-budget tests under Holm; without, Holm gets all of it.
    Deterministic checks spend none. ``first_share`` is the smallest Holm share, alpha_Holm / m:
    the planner sizes budgets with it and Holm runs over a family of exactly ``checks`` (checks of
    the family that an audit does not run count as p = 1), so the detectable TV the plan promises
    is the one the tests deliver, whichever worlds are chosen."""

    alpha: float
    checks: int
    stop_early: bool = True

    @property
    def holm_alpha(self) -> float:
        return self.alpha / 2 if self.stop_early else self.alpha

    @property
    def first_share(self) -> float:
        return self.holm_alpha / max(self.checks, 1)

    @property
    def e_share(self) -> float:
        """Each e-process's share of alpha (Bonferroni over the checks, half of alpha)."""
        return self.alpha / (2 * max(self.checks, 1))

    @property
    def log_e_threshold(self) -> float:
        """The log e-value at which an e-process shows a defect."""
        return math.log(1 / self.e_share)

    @property
    def holm_scale(self) -> float:
        """Factor that puts a Holm-adjusted p-value at ``holm_alpha`` on the scale of alpha."""
        return self.alpha / self.holm_alpha

    def describe(self) -> str:
        if self.stop_early:
            return (f"alpha {self.alpha:g}: half to the early-stopping e-processes (each {self.e_share:.3g}), "
                    f"half to Holm over {self.checks} statistical checks (first share {self.first_share:.3g})")
        return f"alpha {self.alpha:g}: Holm over {self.checks} statistical checks (first share {self.first_share:.3g})"


class CheckKind:
    """How a check turns samples into a verdict. The plan gives every check its kind and the
    verdict carries it: Holm, the renderers and the failure ranking read it, never a guess.

    An open set, one object per kind: the kinds several audit kinds share are declared here; an
    audit kind declares its own in its package (``CheckKind.declare``; the served system's in
    ``exactcheck.serve.check_kinds``). ``CheckKind("law")`` is ``CheckKind.LAW``: a JSON report's
    ``check_kind`` reads back to the declared object once the kind that declares it is imported
    (``exactcheck.audit_kinds.load_result_types``). ``statistical``: whether the check spends
    alpha; ``met``: how a user meets a failure of it, where that is not what its kind of evidence
    says (``exactcheck.report.ranking.how_reachable``)."""

    _declared: ClassVar[dict[str, "CheckKind"]] = {}
    __slots__ = ("name", "value", "statistical", "met")

    def __new__(cls, value: str) -> "CheckKind":
        try:
            return cls._declared[value]
        except KeyError:
            raise ValueError(f"{value!r} is not a declared check kind (declared: "
                             f"{', '.join(map(repr, cls._declared))})") from None

    @classmethod
    def declare(cls, name: str, value: str, *, statistical: bool = False, met: str | None = None) -> "CheckKind":
        """The check kind ``value`` (``name``: its constant's name), declared once; declaring it
        again with the same name returns the same object (a module imported twice)."""
        known = cls._declared.get(value)
        if known is not None:
            if (known.name, known.statistical, known.met) != (name, statistical, met):
                raise ValueError(f"two check kinds are named {value!r}: {known.name} and {name}")
            return known
        kind = object.__new__(cls)
        for attribute, given in (("name", name), ("value", value), ("statistical", statistical), ("met", met)):
            object.__setattr__(kind, attribute, given)
        cls._declared[value] = kind
        return kind

    def __setattr__(self, name, value):
        raise AttributeError("a check kind is immutable")

    def __reduce__(self):  # one object per kind across processes too (--jobs workers, isolated audits)
        return CheckKind, (self.value,)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __repr__(self) -> str:
        return f"<CheckKind.{self.name}: {self.value!r}>"


# the kinds several audit kinds share (an audit kind's own: in its package)
CheckKind.LAW = CheckKind.declare(  # a step or context world's law: e-process while driving, then fixed-budget chi-square
    "LAW", "law", statistical=True)
CheckKind.CHAIN_RULE = CheckKind.declare(  # PIT / moment tests on a large-vocabulary world
    "CHAIN_RULE", "chain-rule test", statistical=True)
CheckKind.GENERATOR_LAW = CheckKind.declare(  # fixed-budget chi-square over whole generations
    "GENERATOR_LAW", "generation law", statistical=True)
CheckKind.PROPERTY = CheckKind.declare("PROPERTY", "deterministic property")  # forced random numbers, hypothesis search
CheckKind.INPUTS = CheckKind.declare("INPUTS", "invalid-input probe")
CheckKind.VALIDITY = CheckKind.declare("VALIDITY", "output validity")  # every output of a grammar world must be valid
CheckKind.CACHE_INVARIANT = CheckKind.declare("CACHE_INVARIANT", "cache invariant")
CheckKind.GREEDY_IDENTITY = CheckKind.declare("GREEDY_IDENTITY", "greedy identity")
CheckKind.CONTRACT = CheckKind.declare(  # a world whose subject crashed or broke its contract: stands for its checks
    "CONTRACT", "subject contract")


@dataclass(frozen=True)
class Check:
    name: str  # "world/law": the test id in the plugin, the testcase in the gate's JUnit
    kind: CheckKind
    world: str
    law: str


@dataclass(frozen=True)
class AuditPlan:
    """The checks an audit reports, in order, and how alpha is split among them. ``samples``:
    trials (step audits) or generations (end-to-end) per world."""

    options: AuditOptions
    checks: tuple[Check, ...]
    budget: AlphaBudget
    samples: tuple[tuple[str, int], ...] = ()
    # the world objects the checks name, built once by the planner and handed to the runner
    worlds: tuple = ()
    # step audits: each law world's planned laws at its budget (``exactcheck.stats.laws.LawPlan``)
    laws: tuple[tuple[str, tuple], ...] = ()
    # checks reported but not run, with why ("the generator declares no grammar masks"); they
    # spend none of alpha
    not_applicable: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.checks]

    def kind_of(self, check: str) -> CheckKind | None:
        return next((c.kind for c in self.checks if c.name == check), None)

    def world_samples(self, world: str) -> int:
        return dict(self.samples)[world]

    def world(self, name: str):
        """The world object named ``name``."""
        return next(w for w in self.worlds if w.name == name)

    def world_laws(self, name: str) -> tuple:
        return dict(self.laws)[name]
