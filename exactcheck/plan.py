"""What an audit runs, decided once: its options, its false-alarm budget and its checks.

Every front end (the CLI, the gate, the pytest plugin, Python) builds one frozen
``AuditOptions``; ``plan_step_audit`` / ``plan_generator_audit`` turn options into an
``AuditPlan``: the ``Check``s (name, kind, world) the runner will report, in order, and the
``AlphaBudget`` that splits alpha among them. The plugin and the gate list the plan's names; the
runners (``exactcheck.audit``, ``exactcheck.e2e.audit``) execute the plan and read every share
from its budget. This module imports no torch: ``exactcheck --help`` and pytest sessions that
never run an exactcheck test stay light.
"""
from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass

__all__ = ["Level", "DEFAULT_ALPHA", "DEFAULT_LEVEL", "DEFAULT_REQUIRE", "derive_seed",
           "AuditOptions", "AlphaBudget", "CheckKind", "Check", "AuditPlan", "budget_plan", "plan_step_audit",
           "plan_generator_audit"]

DEFAULT_ALPHA = 1e-3
DEFAULT_LEVEL = "quick"  # every front end's default: the CLI, the gate, the plugin, Python
DEFAULT_REQUIRE = ("exactness",)
# elements of target_probs (B * (k+1) * V) per verify call in a step audit, unless an audit asks
# for another size (``AuditOptions.call_elements``; ``exactcheck.memory.device_max_elements``)
DEFAULT_CALL_ELEMENTS = 1 << 24


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


def derive_seed(root: int, name: str) -> int:
    """A stable 63-bit seed for ``name`` under ``root``: adding or dropping a check does not
    shift any other check's random stream."""
    digest = hashlib.sha256(f"{root}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _usage(message: str):
    from exactcheck.errors import UsageError
    return UsageError(message)


@dataclass(frozen=True)
class AuditOptions:
    """What to run, as every front end states it. ``worlds``: only these (world names,
    ``properties``, ``properties/NAME``, ``inputs``); ``require``: finding categories that fail
    the audit besides exactness ("reproducible", "input-handling")."""

    level: Level = Level(DEFAULT_LEVEL)
    seed: int = 0
    alpha: float = DEFAULT_ALPHA
    device: str = "cpu"
    worlds: tuple[str, ...] | None = None
    properties: bool = True
    stop_early: bool = True
    detect_tv: float | None = None
    max_samples: int | None = None
    require: tuple[str, ...] = DEFAULT_REQUIRE
    generations: int | None = None  # end-to-end audits: generations per world (default: the level's)
    # step audits: the subject's acceptance rule (``exactcheck.step.contract.AcceptanceRule``
    # value), which the step laws follow; set from the subject by ``run_audit``
    acceptance_rule: str = "min(1, p/q)"
    # shards per batch (step audits: seeds derived per shard) or per run (end-to-end audits:
    # generations keep their seeds); ``exactcheck.executors``
    shards: int = 1
    # step audits: the largest target_probs tensor (B * (k+1) * V elements) handed to the subject
    # in one call; None: ``DEFAULT_CALL_ELEMENTS``, the same on every machine. The size decides
    # which random numbers each trial gets, so a different size gives different (equally valid)
    # samples, and the reproducer names it. "auto": half the device's free memory, resolved to a
    # number when the audit starts (``exactcheck.memory.device_max_elements``)
    call_elements: int | str | None = None

    @classmethod
    def build(cls, **values) -> "AuditOptions":
        """Options from loose values (strings, lists, None for the defaults), validated: a bad
        value raises ``UsageError`` naming it and its rule."""
        values = {k: v for k, v in values.items() if v is not None}
        level = values.get("level", DEFAULT_LEVEL)
        try:
            values["level"] = level if isinstance(level, Level) else Level(level)
        except ValueError:
            raise _usage(f"level ({level!r}) must be one of quick, standard, release") from None
        alpha = values.get("alpha", DEFAULT_ALPHA)
        if not 0 < alpha < 1:
            raise _usage(f"alpha ({alpha}) must be in (0, 1)")
        if "device" in values:
            values["device"] = str(values["device"])
        if "worlds" in values:
            values["worlds"] = tuple(values["worlds"]) or None
        if values.get("detect_tv") is not None and not 0 < values["detect_tv"] <= 1:
            raise _usage(f"detect_tv ({values['detect_tv']}) must be in (0, 1]")
        if values.get("max_samples") is not None and int(values["max_samples"]) < 1:
            raise _usage(f"max_samples ({values['max_samples']}) must be positive")
        if values.get("shards") is not None and int(values["shards"]) < 1:
            raise _usage(f"shards ({values['shards']}) must be at least 1")
        if values.get("call_elements") not in (None, "auto"):  # auto: sized when the audit runs
            try:
                values["call_elements"] = int(values["call_elements"])
            except (TypeError, ValueError):
                raise _usage(f"call_elements ({values['call_elements']!r}) must be a number or 'auto'") from None
            if values["call_elements"] < 1:
                raise _usage(f"call_elements ({values['call_elements']}) must be positive")
        if values.get("generations") is not None and int(values["generations"]) < 1:
            raise _usage(f"generations ({values['generations']}) must be positive")
        values["require"] = _resolve_require(values.get("require", ()))
        return cls(**values)

    @classmethod
    def of(cls, options: "AuditOptions | None", settings: dict) -> "AuditOptions":
        """The options of a run given either ``options`` or loose keyword ``settings``."""
        if options is None:
            return cls.build(**settings)
        if settings:
            raise _usage(f"give options or keyword settings, not both ({sorted(settings)})")
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

    def reproduce(self, subject: str, world: str, command: str = "audit", importable: bool | None = None,
                  extra: tuple[tuple[str, str], ...] = ()) -> str:
        """The one line that re-runs this audit on ``world`` with the same samples: a command when
        the subject can be named on the command line (MODULE:CALLABLE, or a built-in generator), else
        the Python call. It names every setting that changes what the world draws or how it is
        judged (budget, call size, shards, device, generations, categories required); ``extra``
        holds (command-line flag, Python keyword) pairs for settings the front end keeps outside
        the options (an end-to-end audit's decoding policies)."""
        step = command == "audit"
        settings: list[tuple[str, str]] = []
        if step and not self.stop_early:
            settings.append(("--no-stop-early", "stop_early=False"))
        if step and self.detect_tv is not None:
            settings.append((f"--detect-tv {self.detect_tv!r}", f"detect_tv={self.detect_tv!r}"))
        if step and self.max_samples is not None:
            settings.append((f"--max-samples {int(self.max_samples)}", f"max_samples={int(self.max_samples)}"))
        if step and self.shards > 1:
            settings.append((f"--shards {self.shards}", f"shards={self.shards}"))
        if step and self.call_elements is not None:
            settings.append((f"--call-elements {self.call_elements}", f"call_elements={self.call_elements!r}"))
        if not step and self.generations is not None:
            settings.append((f"--generations {int(self.generations)}", f"generations={int(self.generations)}"))
        if self.device != "cpu":
            settings.append((f"--device {self.device}", f"device={self.device!r}"))
        required = [category for category in self.require if category != "exactness"]
        if required:
            settings.append((" ".join(f"--require {'reproducible' if c == 'reproducibility' else c}"
                                      for c in required), f"require={required!r}"))
        settings += extra
        head = f"--level {self.level.value} --seed {self.seed} --alpha {self.alpha!r} --world {world}"
        if importable if importable is not None else ":" in subject:
            return " ".join([f"exactcheck {command} {subject} {head}"] + [flag for flag, _ in settings])
        call = "run_audit" if step else "run_generator_audit"
        keywords = [f"level={self.level.value!r}", f"seed={self.seed}", f"alpha={self.alpha!r}", f"worlds=[{world!r}]"]
        return f"{call}({subject}, " + ", ".join(keywords + [keyword for _, keyword in settings]) + ")"


def _resolve_require(require) -> tuple[str, ...]:
    """The categories an audit gates on: exactness always, plus those named."""
    from exactcheck.report.verdict import Category
    if isinstance(require, str):
        require = (require,)
    try:
        named = {Category.parse(r).value for r in require}
    except ValueError as exc:
        raise _usage(str(exc)) from None
    return tuple(c.value for c in Category if c.value in named | {Category.EXACTNESS.value})


@dataclass(frozen=True)
class AlphaBudget:
    """How alpha is split over ``checks`` statistical checks. With early stopping, half goes
    to the anytime-valid e-processes (Bonferroni: each law's e-value must pass 2m/alpha) and half
    to the fixed-budget tests under Holm; without, Holm gets all of it. Deterministic checks
    spend none. ``first_share`` is the smallest Holm share, alpha_Holm / m: the planner sizes
    budgets with it, so the detectable TV the plan promises is the one the tests deliver."""

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


class CheckKind(enum.Enum):
    """How a check turns samples into a verdict."""

    LAW = "law"  # a step or context world's law: e-process while driving, then fixed-budget chi-square
    CHAIN_RULE = "chain-rule test"  # PIT / moment tests on a large-vocabulary world
    GENERATOR_LAW = "generation law"  # fixed-budget chi-square over whole generations
    PROPERTY = "deterministic property"  # forced random numbers, hypothesis search
    INPUTS = "invalid-input probe"
    VALIDITY = "output validity"  # every output of a grammar world must be valid
    CACHE_INVARIANT = "cache invariant"
    GREEDY_IDENTITY = "greedy identity"

    @property
    def statistical(self) -> bool:
        """Whether the check spends alpha."""
        return self in (CheckKind.LAW, CheckKind.CHAIN_RULE, CheckKind.GENERATOR_LAW)


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
    # the world objects the checks name, built once here and handed to the runner
    worlds: tuple = ()
    # step audits: each law world's planned laws at its budget (``exactcheck.stats.laws.LawPlan``)
    laws: tuple[tuple[str, tuple], ...] = ()

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.checks]

    def world_samples(self, world: str) -> int:
        return dict(self.samples)[world]

    def world(self, name: str):
        """The world object named ``name``."""
        return next(w for w in self.worlds if w.name == name)

    def world_laws(self, name: str) -> tuple:
        return dict(self.laws)[name]


def budget_plan(options: AuditOptions):
    """The trials each built-in world gets (``exactcheck.stats.planning.BudgetPlan``), sized with
    the Holm share the fixed-budget tests will use; planned on every built-in world, so a world's
    budget (and its samples) is the same when it is audited alone."""
    from exactcheck.stats.planning import default_plan
    from exactcheck.step.contract import AcceptanceRule
    holm_alpha = AlphaBudget(options.alpha, 1, options.stop_early).holm_alpha
    return default_plan(options.target_tv, holm_alpha, options.cap, options.level.min_samples,
                        AcceptanceRule(options.acceptance_rule))


def plan_step_audit(options: AuditOptions) -> AuditPlan:
    """The plan of a step-level verifier audit: the laws of every chosen world at its planned
    budget, the chain-rule tests of named large worlds, the properties, the invalid-input probe."""
    from exactcheck.stats.chain_rule import CHAIN_RULE_TESTS
    from exactcheck.stats.laws import planned_laws
    from exactcheck.step.contract import AcceptanceRule
    from exactcheck.step.properties import PROPERTIES
    from exactcheck.suite import default_worlds, large_worlds

    chosen, chains, searched = default_worlds(), [], list(PROPERTIES) if options.properties else []
    inputs = options.properties
    if options.worlds:
        large = large_worlds()
        known = ([w.name for w in chosen] + [w.name for w in large] + ["properties", "inputs"]
                 + [f"properties/{p}" for p in PROPERTIES])
        unknown = set(options.worlds) - set(known)
        if unknown:
            raise _usage(f"unknown world(s) {sorted(unknown)}; known: {known}")
        chosen = [w for w in chosen if w.name in options.worlds]
        chains = [w for w in large if w.name in options.worlds]
        searched = [p for p in searched if f"properties/{p}" in options.worlds or "properties" in options.worlds]
        inputs = inputs and "inputs" in options.worlds
    plan = budget_plan(options)
    checks, samples, laws = [], [], []
    for world in chosen:
        n = plan.samples(world.name)
        samples.append((world.name, n))
        laws.append((world.name, tuple(planned_laws(world, n, AcceptanceRule(options.acceptance_rule)))))
        checks += [Check(f"{world.name}/{law.law}", CheckKind.LAW, world.name, law.law)
                   for law in laws[-1][1]]
    for world in chains:
        samples.append((world.name, options.level.chain_sequences))
        checks += [Check(f"{world.name}/{test}", CheckKind.CHAIN_RULE, world.name, test)
                   for test in CHAIN_RULE_TESTS]
    checks += [Check(f"properties/{p}", CheckKind.PROPERTY, "properties", p) for p in searched]
    if inputs:
        checks.append(Check("inputs/invalid", CheckKind.INPUTS, "inputs", "invalid"))
    m = sum(c.kind.statistical for c in checks)
    return AuditPlan(options, tuple(checks), AlphaBudget(options.alpha, m, options.stop_early), tuple(samples),
                     worlds=(*chosen, *chains), laws=tuple(laws))


def plan_generator_audit(options: AuditOptions, policies=None, greedy: bool = True) -> AuditPlan:
    """The plan of an end-to-end generator audit: per model world and policy, the law of whole
    outputs, its first-token marginal, the stop position (with stop tokens) and the world's own
    marginals; validity on grammar worlds; cache rollback once per world; greedy identity."""
    from exactcheck.e2e.audit import all_model_worlds, policy_suffix
    from exactcheck.e2e.policy import SAMPLING

    policies = tuple(policies) if policies else (SAMPLING,)
    worlds = all_model_worlds()
    if options.worlds:
        unknown = set(options.worlds) - {w.name for w in worlds}
        if unknown:
            raise _usage(f"unknown model world(s) {sorted(unknown)}; known: {[w.name for w in worlds]}")
        worlds = [w for w in worlds if w.name in options.worlds]
    n = options.level.generations if options.generations is None else int(options.generations)
    checks, samples = [], []
    for world in worlds:
        chosen = (world.policy,) if world.policy is not None else policies
        for i, policy in enumerate(chosen):
            suffix = policy_suffix(policy, world)
            laws = ["sequence", "first_token"] + (["stop_position"] if policy.stop_tokens else [])
            laws += [name for name, _, _ in world.marginals]
            checks += [Check(f"{world.name}/{law}{suffix}", CheckKind.GENERATOR_LAW, world.name, law + suffix)
                       for law in laws]
            if world.validate is not None:
                checks.append(Check(f"{world.name}/valid_outputs", CheckKind.VALIDITY, world.name, "valid_outputs"))
            if i == 0:
                checks.append(Check(f"{world.name}/cache_rollback", CheckKind.CACHE_INVARIANT, world.name,
                                    "cache_rollback"))
            samples.append((f"{world.name}{suffix}", n))
        if greedy:
            checks.append(Check(f"{world.name}/greedy_identity", CheckKind.GREEDY_IDENTITY, world.name,
                                "greedy_identity"))
    m = sum(c.kind.statistical for c in checks)
    # generation laws are fixed-budget tests: Holm gets all of alpha
    return AuditPlan(options, tuple(checks), AlphaBudget(options.alpha, m, stop_early=False), tuple(samples),
                     worlds=tuple(worlds))


def plan_greedy_audit(model: str) -> AuditPlan:
    """The plan of ``exactcheck greedy``: greedy identity and the final target cache on a real
    model pair (deterministic checks only: no alpha is spent)."""
    checks = (Check(f"{model}/greedy_identity", CheckKind.GREEDY_IDENTITY, model, "greedy_identity"),
              Check(f"{model}/final_cache", CheckKind.CACHE_INVARIANT, model, "final_cache"))
    return AuditPlan(AuditOptions.build(), checks, AlphaBudget(DEFAULT_ALPHA, 0, stop_early=False))


GRAMMAR_WORLD = "smollm2-json"


def plan_grammar_audit(alpha: float = DEFAULT_ALPHA) -> AuditPlan:
    """The plan of ``exactcheck grammar``: masked greedy identity, validity of every output, and
    two chain-rule tests of the sampled outputs under Holm at ``alpha``. A generator that fails
    some sampled generations also gets a ``WORLD/contract`` verdict after these."""
    w = GRAMMAR_WORLD
    checks = (Check(f"{w}/greedy_identity", CheckKind.GREEDY_IDENTITY, w, "greedy_identity"),
              Check(f"{w}/valid_outputs", CheckKind.VALIDITY, w, "valid_outputs"),
              Check(f"{w}/pit_target_order", CheckKind.CHAIN_RULE, w, "pit_target_order"),
              Check(f"{w}/surprisal", CheckKind.CHAIN_RULE, w, "surprisal"))
    return AuditPlan(AuditOptions.build(alpha=alpha), checks, AlphaBudget(alpha, 2, stop_early=False))
