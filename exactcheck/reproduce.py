"""The reproduce line: the one line in every verdict that re-runs its check with the same samples.

Every audit kind states its settings as ``Setting``s, each in both forms, the command line's
flag and the Python call's argument, and ``reproduce_line`` writes either the command (when the
subject can be named on the command line and every setting can be stated there) or the Python
call. The builders below are the only places that know which settings change what an audit of
each kind draws or how it is judged; ``replay_line`` is the line of a property counterexample,
which re-runs the saved reproducer instead.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Sequence

from exactcheck.options import DEFAULT_ALPHA, DEFAULT_REQUIRE, AuditOptions, Category

__all__ = ["Setting", "reproduce_line", "stated", "flag", "step_audit_line", "generator_audit_line", "tree_audit_line",
           "tree_loop_line", "greedy_audit_line", "grammar_audit_line", "cost_line", "served_cost_line",
           "isolated_audit_line", "replay_line", "written_replay_line", "reproducer_path", "DEFAULT_REPORT_DIR"]


@dataclass(frozen=True)
class Setting:
    """One setting of an audit in both forms. ``flag``: as the command states it ("" when the
    command need not: its default; None when the command cannot state it at all, which makes the
    line the Python call); ``argument``: as the Python call states it (a positional value or
    ``keyword=value``; "" when the call need not)."""

    flag: str | None
    argument: str


def reproduce_line(command: str, subject: str, settings: Sequence[Setting], call: str | None = None,
                   by_command: bool = True) -> str:
    """``exactcheck COMMAND SUBJECT FLAG...`` if ``by_command`` and every setting can be stated
    on the command line (or there is no Python ``call``), else ``CALL(SUBJECT, ARGUMENT...)``."""
    if call is None or (by_command and all(s.flag is not None for s in settings)):
        return " ".join([f"exactcheck {command} {subject}"] + [s.flag for s in settings if s.flag])
    return f"{call}(" + ", ".join([subject] + [s.argument for s in settings if s.argument]) + ")"


def stated(options: AuditOptions, name: str, value=None, argument: str | None = None) -> Setting:
    """The option ``name`` (its value in ``options``, or ``value``) in both forms: the flag as its
    ``Option`` (declared on the ``AuditOptions`` field) writes it, and the Python keyword
    (``argument``: another spelling of it)."""
    value = getattr(options, name) if value is None else value
    shown = getattr(value, "value", value)
    return Setting(AuditOptions.option(name).flag_text(shown), argument or f"{name}={shown!r}")


def _required(options: AuditOptions) -> list[Setting]:
    named = [Category(c) for c in options.require if c not in DEFAULT_REQUIRE]  # the others always gate
    if not named:
        return []
    return [stated(options, "require", [c.flag for c in named], f"require={[c.value for c in named]!r}")]


def _head(options: AuditOptions, world: str) -> list[Setting]:
    return [stated(options, "level"), stated(options, "seed"), stated(options, "alpha"),
            stated(options, "worlds", [world], f"worlds=[{world!r}]")]


def flag(name: str, value) -> str:
    """``value`` of the shared option ``name`` as the command line states it (its ``Option``)."""
    return AuditOptions.option(name).flag_text(value)


def _when_set(options: AuditOptions, *names: str) -> list[Setting]:
    """The options ``names`` that ``options`` sets away from their defaults, in that order."""
    fields = AuditOptions.__dataclass_fields__
    return [stated(options, name) for name in names if getattr(options, name) != fields[name].default]


def _device(device: str, always: bool = False) -> list[Setting]:
    device = str(device)
    if device == "cpu" and not always:
        return []
    return [Setting(AuditOptions.option("device").flag_text(device) if device != "cpu" else "", f"device={device!r}")]


def step_audit_line(options: AuditOptions, subject: str, world: str, by_command: bool | None = None) -> str:
    """A step audit's line for ``world``: every option that changes what the world draws (budget,
    call size, shards, device) or how it is judged (early stopping, categories required). A
    subject the command can name (``by_command``; default: given as MODULE:CALLABLE) is named on
    the command line; any other, in the call."""
    settings = _head(options, world)
    if options.rule is not None:
        settings.append(Setting(f"--rule {options.rule}", f"rule={options.rule!r}"))
    settings += _when_set(options, "stop_early", "detect_tv", "max_samples")
    fitted = dict(options.trials or ()).get(world)
    if fitted is not None:  # a budget cut to fit --max-seconds, or trials named: the same trials
        settings.append(Setting(f"--trials {world}={fitted}", f"trials={{{world!r}: {fitted}}}"))
    if options.stop_early and not options.looks_from_one:  # --max-seconds: its batches, as drawn
        settings.append(Setting("--looks-from-share", "looks_from_one=False"))
    settings += _when_set(options, "shards", "call_elements", "call_timeout")  # a slow call's verdict depends on it
    settings += _device(options.device) + _required(options)
    return reproduce_line("audit", subject, settings, "run_audit",
                          by_command=":" in subject if by_command is None else by_command)


def generator_audit_line(options: AuditOptions, subject: str, world: str, policies=(), greedy: bool = True,
                         by_command: bool = True) -> str:
    """An end-to-end audit's line for ``world``: generations, device, categories required, and the
    decoding policies other than plain sampling (``exactcheck.contracts.policy.DecodingPolicy``; () for
    plain sampling; a policy the command line cannot state, such as a logit bias, makes the line the
    Python call) and whether greedy identity ran."""
    settings = _head(options, world) + _when_set(options, "generations")
    settings += _device(options.device) + _required(options)
    if policies:
        specs = [policy.spec() for policy in policies]
        settings.append(Setting(" ".join(f"--policy {spec}" for spec in specs) if all(specs) else None,
                                f"policies=[{', '.join(policy.code() for policy in policies)}]"))
    if not greedy:
        settings.append(Setting("--no-greedy", "greedy=False"))
    return reproduce_line("e2e", subject, settings, "run_generator_audit", by_command)


def tree_audit_line(options: AuditOptions, subject: str, world: str, by_command: bool = True) -> str:
    """A tree audit's line for ``world``: level, seed and world, and what else changes what the
    world draws (budget, device) or how it is judged (alpha, categories required, call timeout),
    where it differs from the default. ``by_command``: the subject is named as the command takes it
    (else the line is the ``run_tree_audit`` call)."""
    settings = [stated(options, "level"), stated(options, "seed"), stated(options, "worlds", [world], f"worlds=[{world!r}]")]
    settings += _when_set(options, "alpha", "detect_tv", "max_samples", "call_timeout")
    if options.tree_rule:
        settings.append(Setting(f"--rule {options.tree_rule}", f"tree_rule={options.tree_rule!r}"))
    settings += _device(options.device) + _required(options)
    return reproduce_line("tree", subject, settings, "run_tree_audit", by_command)


def greedy_audit_line(subject: str, model: str, prompts: int, new_tokens: int, draft_lengths, per_prompt,
                      seed: int, device, by_command: bool = True) -> str:
    """``exactcheck greedy``'s line; the command states draft lengths 1..8 only."""
    settings = [Setting(f"--model {model}", repr(model)), Setting(f"--prompts {prompts}", f"prompts={prompts}"),
                Setting(f"--new-tokens {new_tokens}", f"new_tokens={new_tokens}"),
                Setting("" if tuple(draft_lengths) == tuple(range(1, 9)) else None,
                        f"draft_lengths={tuple(draft_lengths)!r}"),
                Setting(f"--per-prompt {per_prompt}" if per_prompt else "", f"per_prompt={per_prompt!r}"),
                Setting(flag("seed", seed), f"seed={seed}"), *_device(device, always=True)]
    return reproduce_line("greedy", subject, settings, "run_greedy_audit", by_command)


def grammar_audit_line(subject: str, prompts: int, draft_lengths, samples: int, new_tokens: int, seed: int,
                       alpha: float, device, by_command: bool = True) -> str:
    """``exactcheck grammar``'s line; the command states draft lengths (1, 4, 8), 64 new tokens and
    the default alpha only."""
    settings = [Setting(f"--prompts {prompts}", f"prompts={prompts}"),
                Setting("" if tuple(draft_lengths) == (1, 4, 8) else None, f"draft_lengths={tuple(draft_lengths)!r}"),
                Setting(f"--samples {samples}", f"samples={samples}"),
                Setting("" if new_tokens == 64 else None, f"new_tokens={new_tokens}"),
                Setting(flag("seed", seed), f"seed={seed}"),
                Setting("" if alpha == DEFAULT_ALPHA else None, f"alpha={alpha!r}"), *_device(device, always=True)]
    return reproduce_line("grammar", subject, settings, "run_grammar_audit", by_command)


def cost_line(subject: str, model: str | None, world: str | None, draft_lengths: str, prompts: int, seed: int,
              new_tokens: int | None = None, policy: str | None = None) -> str:
    """``exactcheck cost``'s line (the command is the only way to name its settings)."""
    settings = [Setting(f"--model {model}" if model else f"--world {world}", ""),
                Setting(f"--draft-lengths {draft_lengths}", ""), Setting(f"--prompts {prompts}", ""),
                Setting(flag("seed", seed), ""), Setting(f"--new-tokens {new_tokens}" if new_tokens else "", ""),
                Setting(f"--policy '{policy}'" if policy else "", "")]
    return reproduce_line("cost", subject, settings)


def served_cost_line(url: str, reference: str, *, api: str = "auto", model: str | None = None, prompts=(),
                     samplings: Sequence[str] = (), requests: int = 8, new_tokens: int = 32, seed: int = 0,
                     timeout: float | None = None) -> str:
    """``exactcheck cost URL --reference URL2``'s line: the served cost (``prompts``: texts or id
    tuples as given, none for the defaults; ``samplings``: their specs, none for the defaults)."""
    settings = [Setting(f"--reference {shlex.quote(reference)}", "")]
    settings += [Setting(f"{flag} {shlex.quote(str(value))}", "") for flag, value in
                 (("--api", None if api == "auto" else api), ("--model", model)) if value]
    settings += [Setting(f"--prompt {shlex.quote(p)}" if isinstance(p, str)
                         else f"--prompt-ids {','.join(str(int(t)) for t in p)}", "") for p in prompts]
    settings += [Setting(f"--sampling {shlex.quote(s)}", "") for s in samplings]
    settings += [Setting(f"--prompts {int(requests)}", ""), Setting(f"--new-tokens {int(new_tokens)}", ""),
                 Setting(flag("seed", int(seed)), ""), Setting(f"--timeout {timeout:g}" if timeout else "", "")]
    return reproduce_line("cost", shlex.quote(url), settings)


def isolated_audit_line(command: str, subject: str, options: AuditOptions) -> str:
    """The line of an isolated audit whose subject killed its worker process: the audit again,
    isolated (the subject is by name: an isolated audit loads it in the worker)."""
    return reproduce_line(command, subject, [stated(options, "level"), stated(options, "seed"),
                                             Setting("--isolate", "")])


def tree_loop_line(options: AuditOptions, subject: str, world: str, generations: int, by_command: bool = True) -> str:
    """``exactcheck tree-loop``'s line for ``world``: seed, world and the generations drawn there
    (which the level only stands for), and alpha and the categories required where they differ
    from the default. ``by_command``: the subject is named as the command takes it (else the line
    is the ``run_tree_generation_audit`` call, ``subject`` then the Python name)."""
    settings = [stated(options, "seed"), stated(options, "worlds", [world], f"worlds=[{world!r}]"),
                stated(options, "generations", generations, f"trials={generations}")]
    settings += _when_set(options, "alpha") + _required(options)
    return reproduce_line("tree-loop", subject, settings, "run_tree_generation_audit", by_command)


def serve_audit_line(url: str, reference: str | None, options: AuditOptions, world: str, *, api: str = "auto",
                     model: str | None = None, reference_probabilities: str | None = None, prompts=(),
                     sampling: str | None = None, length: int = 3, samples_per_request: int = 2,
                     n_probs: int = 256, traffic: str = "mixed", stream_share: float = 0.25,
                     server_settings=(), eos_ids: str | None = None) -> str:
    """``exactcheck serve``'s line for ``world`` (the command is the only way to name a server):
    every setting that names the world or changes what it draws: the prompts in their order
    (``prompts``: texts or id tuples, empty for the defaults: a world's name is its prompt's index),
    the world's sampling spec (``sampling``; None for the pseudo-worlds greedy and server), the
    continuation length, the samples asked of one request, the probabilities asked of the
    reference and the traffic, where they differ from the defaults."""
    settings = ([Setting(f"--reference {shlex.quote(reference)}", "")] if reference else []) + _head(options, world)
    settings += [Setting(f"{flag} {shlex.quote(value)}", "") for flag, value in (
        ("--api", None if api == "auto" else api), ("--model", model),
        ("--reference-probabilities", reference_probabilities)) if value]
    settings += [Setting(f"--server-setting {shlex.quote(item)}", "") for item in server_settings]
    settings += [Setting(f"--prompt {shlex.quote(p)}" if isinstance(p, str)
                         else f"--prompt-ids {','.join(str(int(t)) for t in p)}", "") for p in prompts]
    if sampling is not None:  # the plain sampling's spec is empty: temperature 1 says the same
        settings.append(Setting(f"--sampling {shlex.quote(sampling or 'temperature=1')}", ""))
    settings += [Setting(f"{flag} {int(value)}" if value != default else "", "") for flag, value, default in (
        ("--length", length, 3), ("--samples-per-request", samples_per_request, 2), ("--n-probs", n_probs, 256))]
    if traffic != "mixed":  # which requests share the engine's batches: another order, other samples
        settings.append(Setting(f"--traffic {traffic}", ""))
    if stream_share != 0.25:
        settings.append(Setting(f"--stream-share {stream_share:g}", ""))
    if eos_ids:  # where answers may end: the ids they end on
        settings.append(Setting(f"--eos-ids {shlex.quote(str(eos_ids))}", ""))
    settings += _when_set(options, "max_samples", "detect_tv")
    return reproduce_line("serve", shlex.quote(url), settings)


def reproducer_path(check: str, subject: str = "", level: str | None = None, seed: int | None = None) -> str:
    """Where a report directory keeps the reproducer of ``check`` of ``subject`` (one file per
    subject and check, so subjects failing the same property in one gate keep theirs apart; with
    the audit's ``level`` and ``seed``, one per level and seed too, as the report files are)."""
    slug = "".join(ch if ch.isalnum() or ch in "._" else "-" for ch in subject).strip("-")
    settings = (f"-{level}" if level else "") + ("" if seed is None else f"-seed{int(seed)}")
    return "reproducers/" + (f"{slug}--" if slug else "") + check.replace("/", "-") + settings + ".json"


DEFAULT_REPORT_DIR = "exactcheck-reports"  # where a printed line asks a rerun to write its reproducer


def replay_line(check: str, subject: str, level: str, seed: int, audit_line: str) -> str:
    """The line of a property counterexample before its reproducer is written anywhere: the audit
    of that check again (``audit_line``), which finds the same counterexample, with a report
    directory where it is a command, so that the rerun writes the reproducer, then the replay of
    that file (a shell comment, so the line pastes as it is). ``written_replay_line`` replaces it
    when a report directory holds the file."""
    where = reproducer_path(check, subject, level, seed)
    if audit_line.startswith("exactcheck "):
        return (f"{audit_line} --report {DEFAULT_REPORT_DIR}  # writes its reproducer; then: "
                f"exactcheck replay {DEFAULT_REPORT_DIR}/{where}")
    return (f"{audit_line}  # the same counterexample; with a report directory (pytest --exactcheck-report DIR, "
            f"the gate's --report DIR) its reproducer is kept for: exactcheck replay DIR/{where}")


def written_replay_line(directory, check: str, subject: str, level: str | None, seed: int | None) -> str:
    """The line of a property counterexample whose reproducer ``directory`` holds."""
    import os
    return f"exactcheck replay {shlex.quote(os.path.join(str(directory), reproducer_path(check, subject, level, seed)))}"
