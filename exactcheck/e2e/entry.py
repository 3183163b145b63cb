"""The generator audits' rows of ``exactcheck.audit_kinds.AUDIT_KINDS``: ``exactcheck e2e`` (the toy
model worlds), ``greedy`` (greedy identity on real models), ``grammar`` (SmolLM2 under an xgrammar
mask) and ``cost`` (the speed claim next to the exactness verdict): their command-line arguments,
their settings from the parsed command line, how they plan, run and show their results. Light:
the runners (and torch) are imported when an audit runs; each resolves its device once here
(``exactcheck.core.resolve_device``) or in its runner."""
from __future__ import annotations

import dataclasses

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import BUILTIN_GENERATORS, DEFAULT_ALPHA, DEFAULT_LEVEL, HYBRID_MODELS, REAL_MODELS, AuditOptions, AuditPlan

__all__ = ["parse_policy", "named", "show_generator_audit",
           "e2e_arguments", "e2e_settings", "plan_e2e", "run_e2e",
           "greedy_arguments", "greedy_settings", "plan_greedy", "run_greedy", "greedy_stem",
           "grammar_arguments", "grammar_settings", "plan_grammar", "run_grammar",
           "cost_arguments", "cost_settings", "served_cost_settings", "load_cost_subject", "run_cost", "cost_stem",
           "show_cost"]


def parse_policy(spec: str):
    """'top_k=2,temperature=0.7' -> DecodingPolicy(temperature=0.7, top_k=2)."""
    from exactcheck.e2e.policy import DecodingPolicy
    kinds = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float,
             "presence_penalty": float, "frequency_penalty": float, "penalty_convention": str, "penalty_last_n": int}
    settings = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key not in kinds:
            raise UsageError(f"policy {spec!r}: expected KEY=VALUE with KEY in {sorted(kinds)}")
        try:
            settings[key] = kinds[key](value)
        except ValueError as exc:
            raise UsageError(f"policy {spec!r}: {exc}") from exc
    try:
        return DecodingPolicy(**settings)
    except ValueError as exc:
        raise UsageError(f"policy {spec!r}: {exc}") from exc


def named(result, subject: str):
    """``result`` naming its subject as the command line gave it when that was MODULE:CALLABLE
    (the runners name a generator by its callable's ``__name__``); a built-in generator or a loop
    mutant keeps its own descriptive name."""
    if subject in BUILTIN_GENERATORS or subject.startswith("loop-mutant:") or ":" not in subject:
        return result
    lossy = " [lossy by design]"
    return dataclasses.replace(result, subject=subject + (lossy if result.subject.endswith(lossy) else ""))


def show_generator_audit(result, args, stem: str, **how) -> int:
    """``exactcheck.console.show_audit`` of a generator audit named as the command line named it."""
    from exactcheck.console import show_audit
    return show_audit(named(result, args.subject), args, stem, **how)


def _seed_report_quiet(parser) -> None:
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    parser.add_argument("--quiet", action="store_true")


def _models_device(parser) -> None:
    parser.add_argument("--device", default="cpu", help="torch device for the models (cpu, cuda, cuda:1)")


# -- e2e: the toy model worlds -------------------------------------------------------------------

def e2e_arguments(parser) -> None:
    parser.add_argument("subject", help="a built-in generator (" + ", ".join(BUILTIN_GENERATORS) + ", or "
                        "loop-mutant:NAME) or MODULE:CALLABLE")
    parser.add_argument("--level", default=DEFAULT_LEVEL, choices=arguments.LEVELS,
                        help="sampled generations per world: quick 2,000, standard 8,000, release 40,000")
    parser.add_argument("--generations", type=int, metavar="N", help="sampled generations per world")
    parser.add_argument("--temperature", type=float, action="append", metavar="T",
                        help="sampling temperature (repeatable; default 1)")
    parser.add_argument("--policy", action="append", metavar="SPEC",
                        help="a decoding policy to audit under, e.g. 'temperature=0.7', 'top_k=2', "
                             "'top_p=0.8,temperature=0.9', 'min_p=0.3' (repeatable; with --temperature)")
    parser.add_argument("--world", action="append", metavar="NAME", help="only this model world (repeatable)")
    parser.add_argument("--no-greedy", dest="greedy", action="store_false", help="skip the greedy-identity sweep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument("--report", metavar="DIR", help="write JSON and Markdown reports here")
    parser.add_argument("--quiet", action="store_true")
    _models_device(parser)
    arguments.sharding(parser, "split each run's generations into N ranges (default 1); generations keep their "
                               "seeds, so the verdicts are the unsharded audit's")
    arguments.jobs(parser, "draw each run's generations in N worker processes (default 1); generations keep their "
                           "seeds, so the verdicts are the serial audit's")
    arguments.require(parser)
    arguments.call_timeout(parser)
    arguments.isolate(parser)


def e2e_settings(args) -> dict:
    from exactcheck.e2e.policy import DecodingPolicy
    policies = tuple(DecodingPolicy(t) for t in (args.temperature or ([] if args.policy else [1.0])))
    policies += tuple(parse_policy(spec) for spec in (args.policy or []))
    return dict(level=args.level, seed=args.seed, alpha=args.alpha, worlds=args.world, policies=policies,
                generations=args.generations, greedy=args.greedy, progress=not args.quiet, require=args.require,
                device=args.device, shards=args.shards, call_timeout=args.call_timeout, isolate=args.isolate,
                jobs=args.jobs)


def plan_e2e(subject, options: AuditOptions, policies=None, greedy: bool = True) -> AuditPlan:
    from exactcheck.e2e.generator import capabilities_of, takes_different_tokenizers
    from exactcheck.e2e.plan import plan_generator_audit
    return plan_generator_audit(options, policies, greedy, capabilities_of(subject), takes_different_tokenizers(subject))


def run_e2e(subject, options: AuditOptions, **keywords):
    from exactcheck.e2e.runner import run_generator_audit
    return run_generator_audit(subject, options=options, **keywords)


# -- greedy: greedy identity on real models ------------------------------------------------------

def greedy_arguments(parser) -> None:
    parser.add_argument("subject", nargs="?", default="transformers-assisted",
                        help="a built-in generator or MODULE:CALLABLE (default transformers-assisted)")
    parser.add_argument("--model", default="tiny-llama", choices=list(REAL_MODELS + HYBRID_MODELS), metavar="NAME",
                        help=f"a real model pair: {', '.join(REAL_MODELS)} (default tiny-llama), or a tiny hybrid "
                             f"with a recurrent or conv state, whose final cache is also checked state by state: "
                             f"{', '.join(HYBRID_MODELS)}")
    parser.add_argument("--prompts", type=int, default=20, help="prompts to decode (default 20)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens to decode per prompt (default 32)")
    parser.add_argument("--per-prompt", type=int, metavar="K",
                        help="run K of the draft lengths 1..8 per prompt, in rotation (default: all 8)")
    _seed_report_quiet(parser)
    _models_device(parser)


def greedy_settings(args) -> dict:
    return dict(model=args.model, prompts=args.prompts, new_tokens=args.new_tokens, per_prompt=args.per_prompt,
                seed=args.seed, progress=not args.quiet, device=args.device)


def greedy_stem(args) -> str:
    return f"greedy-{args.model}-"


def plan_greedy(subject, options: AuditOptions, model: str = "tiny-llama", **_settings) -> AuditPlan:
    from exactcheck.e2e.plan import plan_greedy_audit
    return plan_greedy_audit(model)


def run_greedy(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None,
               model: str = "tiny-llama", **settings):
    from exactcheck.core import resolve_device
    from exactcheck.e2e.real_models import run_greedy_audit
    return run_greedy_audit(subject, model, seed=options.seed, progress=progress,
                            device=resolve_device(options.device), subject_name=subject_name, **settings)


# -- grammar: SmolLM2 under an xgrammar mask -----------------------------------------------------

def grammar_arguments(parser) -> None:
    parser.add_argument("subject", nargs="?", default="transformers-assisted")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=24, help="sampled outputs for the chain-rule tests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", metavar="DIR")
    parser.add_argument("--quiet", action="store_true")
    _models_device(parser)


def grammar_settings(args) -> dict:
    return dict(prompts=args.prompts, samples=args.samples, seed=args.seed, progress=not args.quiet,
                device=args.device)


def plan_grammar(subject, options: AuditOptions, **_settings) -> AuditPlan:
    from exactcheck.e2e.plan import plan_grammar_audit
    return plan_grammar_audit(options.alpha)


def run_grammar(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None,
                **settings):
    from exactcheck.core import resolve_device
    from exactcheck.e2e.real_grammar import run_grammar_audit
    return run_grammar_audit(subject, seed=options.seed, progress=progress, device=resolve_device(options.device),
                             subject_name=subject_name, **settings)


# -- cost: the speed claim next to the exactness verdict -----------------------------------------
# A subject that is a URL is a served system: its cost against --reference (exactcheck.serve.cost);
# any other is a generator against the target alone (exactcheck.e2e.cost).

def _is_url(name) -> bool:
    import urllib.parse
    if not isinstance(name, str):
        return False
    parsed = urllib.parse.urlparse(name)
    return parsed.scheme in ("http", "https")


def cost_arguments(parser) -> None:
    from exactcheck.serve.apis import APIS
    parser.add_argument("subject", nargs="?", default="transformers-assisted",
                        help="a built-in generator or MODULE:CALLABLE (default transformers-assisted), or the URL "
                             "of a served system (http://HOST:PORT, speculation on) measured against --reference")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--model", metavar="NAME", help="a real model pair: " + ", ".join(REAL_MODELS) + " (default "
                       "tiny-llama); for a served system, the model asked of an OpenAI endpoint (default: the one "
                       "/v1/models lists) or mlx-lm's model directory")
    where.add_argument("--world", metavar="NAME", help="a toy model world (the exact acceptance is known there)")
    parser.add_argument("--draft-lengths", default="1,2,4,8", metavar="K,K,...")
    parser.add_argument("--prompts", type=int, default=8, help="requests per draft length (default 8); for a served "
                                                               "system, requests per sampling setting")
    parser.add_argument("--new-tokens", type=int, metavar="N", help="new tokens per request (default 32; a world's length)")
    parser.add_argument("--policy", metavar="SPEC", help="'greedy', or e.g. 'temperature=0.7,top_k=50' (default: "
                                                         "sampling at temperature 1)")
    parser.add_argument("--no-exactness", dest="exactness", action="store_false",
                        help="skip the exactness audit that goes into the same report")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", metavar="DIR", help="write JSON, Markdown and HTML here")
    parser.add_argument("--quiet", action="store_true")
    _models_device(parser)
    served = parser.add_argument_group("a served system (the subject a URL)")
    served.add_argument("--reference", metavar="URL", help="the same model served with speculation off (required)")
    served.add_argument("--api", default="auto", choices=APIS, help="llama.cpp's /completion, OpenAI's "
                        "/v1/completions or mlx-lm's (default auto, as `exactcheck serve` picks it)")
    served.add_argument("--sampling", action="append", metavar="SPEC", help="a sampling setting, e.g. 'greedy', "
                        "'temperature=0.7,top_k=8' (repeatable; default greedy and temperature 1)")
    served.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt, tokenized by the audited server "
                        "(repeatable; default the serve audit's three prompts)")
    served.add_argument("--prompt-ids", action="append", metavar="ID,ID,...", help="a prompt as token ids (repeatable)")
    served.add_argument("--timeout", type=float, metavar="S", help="seconds per request before it is retried "
                        "(default 60; at most 2 retries)")


def _cost_model(args) -> str | None:
    return None if args.world else (args.model or "tiny-llama")


_SERVED_ONLY = ("reference", "sampling", "prompt", "prompt_ids", "timeout")
_IN_PROCESS_ONLY = (("world", None), ("policy", None), ("exactness", True), ("draft_lengths", "1,2,4,8"),
                    ("device", "cpu"))


def _flag(name: str) -> str:
    return "--" + {"exactness": "no-exactness"}.get(name, name.replace("_", "-"))


def cost_settings(args) -> dict:
    if _is_url(args.subject):
        return served_cost_settings(args)
    from exactcheck.reproduce import cost_line
    given = [_flag(name) for name in _SERVED_ONLY if getattr(args, name) is not None]
    if given or args.api != "auto":
        raise UsageError(f"{', '.join(given + (['--api'] if args.api != 'auto' else []))}: only for a served system "
                         f"(a subject http://HOST:PORT)")
    if args.model is not None and args.model not in REAL_MODELS:
        raise UsageError(f"--model {args.model!r}: expected one of {', '.join(REAL_MODELS)}")
    try:
        lengths = tuple(int(k) for k in args.draft_lengths.split(",") if k.strip())
    except ValueError:
        raise UsageError(f"--draft-lengths {args.draft_lengths!r}: expected integers like 1,2,4,8") from None
    if not lengths or min(lengths) < 1:
        raise UsageError(f"--draft-lengths {args.draft_lengths!r}: expected positive integers")
    if args.prompts < 2:
        raise UsageError("--prompts must be at least 2 (the intervals need more than one request)")
    if args.policy is None:
        policy = None
    elif args.policy == "greedy":
        from exactcheck.e2e.policy import GREEDY
        policy = GREEDY
    else:
        policy = parse_policy(args.policy)
    model = _cost_model(args)
    reproduce = cost_line(args.subject, model, args.world, args.draft_lengths, args.prompts, args.seed,
                          args.new_tokens, args.policy)
    return dict(model=model, world=args.world, draft_lengths=lengths, prompts=args.prompts,
                new_tokens=args.new_tokens, policy=policy, device=args.device, seed=args.seed,
                exactness=args.exactness, progress=not args.quiet, reproduce=reproduce)


def served_cost_settings(args) -> dict:
    """A served system's settings (``exactcheck.serve.cost.run_served_cost``) from the command line;
    an in-process flag, a missing --reference or a bad value is one line (exit 2)."""
    given = [_flag(name) for name, default in _IN_PROCESS_ONLY if getattr(args, name) != default]
    if given:
        raise UsageError(f"{', '.join(given)}: not for a served system (it takes --reference, --api, --model, "
                         f"--sampling, --prompt, --prompt-ids, --prompts, --new-tokens, --timeout)")
    if not args.reference:
        raise UsageError(f"cost of the served system {args.subject} needs --reference URL2: the same model served "
                         f"with speculation off")
    if not _is_url(args.reference):
        raise UsageError(f"--reference ({args.reference!r}) must look like http://HOST:PORT")
    from exactcheck.serve.settings import parse_prompts
    prompts = parse_prompts(args.prompt, args.prompt_ids)
    from exactcheck.serve.settings import parse_samplings
    samplings = parse_samplings(args.sampling)
    if args.prompts < 2:
        raise UsageError("--prompts must be at least 2 (the intervals need more than one request)")
    if args.new_tokens is not None and args.new_tokens < 1:
        raise UsageError(f"--new-tokens ({args.new_tokens}) must be at least 1")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout ({args.timeout}) must be a positive number of seconds")
    from exactcheck.reproduce import served_cost_line
    reproduce = served_cost_line(args.subject, args.reference, api=args.api, model=args.model, prompts=prompts,
                                 samplings=args.sampling or (), requests=args.prompts,
                                 new_tokens=args.new_tokens or 32, seed=args.seed, timeout=args.timeout)
    values = dict(reference=args.reference.rstrip("/"), api=args.api, model=args.model, prompts=args.prompts,
                  new_tokens=args.new_tokens or 32, timeout=args.timeout, seed=args.seed, progress=not args.quiet,
                  reproduce=reproduce)
    if prompts:
        values["served_prompts"] = tuple(prompts)
    if samplings:
        values["samplings"] = tuple(samplings)
    return values


def load_cost_subject(name: str):
    """A served system's URL (checked to be one), or a generator by name."""
    if _is_url(name):
        from exactcheck.serve.entry import load as load_url
        return load_url(name)
    from exactcheck.loading import load_generator
    return load_generator(name)


def cost_stem(args) -> str:
    return "cost-served-" if _is_url(args.subject) else f"cost-{_cost_model(args) or args.world}-"


def run_cost(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None,
             **settings) -> dict:
    """The cost report's JSON: ``exactcheck.report.cost_report.COST_SCHEMA`` for a generator,
    ``exactcheck.report.served_cost_report.SERVED_COST_SCHEMA`` for a served system (a URL)."""
    if isinstance(subject, str):
        from exactcheck.serve.cost import run_served_cost
        prompts = settings.pop("served_prompts", None)
        timeout = settings.pop("timeout", None)
        requests = settings.pop("prompts", 8)
        return run_served_cost(subject, seed=options.seed, progress=progress, requests=requests,
                               **({"prompts": prompts} if prompts else {}),
                               **({"timeout": timeout} if timeout is not None else {}), **settings)
    from exactcheck.core import resolve_device
    from exactcheck.e2e.cost import run_cost as cost
    return cost(subject, device=resolve_device(options.device), seed=options.seed, progress=progress, **settings)


def show_cost(data: dict, args, stem: str) -> int:
    """The headline; the JSON, Markdown and HTML when ``--report``. The speed is measured, not
    judged: 0, except a served system that stopped answering mid-run (1, its partial report written)
    or a run interrupted (130)."""
    from exactcheck.console import EXIT_DEFECT, EXIT_INTERRUPTED, EXIT_PASS, write_and_list
    from exactcheck.report.cost_report import cost_headline
    from exactcheck.report.served_cost_report import SERVED_COST_SCHEMA, served_cost_headline
    served = data.get("schema") == SERVED_COST_SCHEMA
    print(served_cost_headline(data) if served else cost_headline(data))
    if args.report:
        write_and_list(data, args.report, stem)
    stopped = data.get("stopped") if served else None
    if stopped:
        return EXIT_INTERRUPTED if stopped.get("reason") == "interrupted" else EXIT_DEFECT
    return EXIT_PASS


def catalogue() -> list[str]:
    """The e2e kind's part of ``exactcheck list``: model and tokenizer worlds, generators, loop mutants."""
    try:
        from exactcheck.e2e.plan import all_model_worlds as model_worlds
    except ImportError:  # transformers is not installed: no end-to-end worlds
        model_worlds = tuple
    lines = ["model worlds (`exactcheck e2e`; toy LMs as transformers models; need transformers):"]
    lines += [f"  {w.name:<26} {w.description}" for w in model_worlds()]
    if model_worlds is not tuple:
        lines.append("tokenizer worlds (a generator declaring different_tokenizers; two vocabularies, need tokenizers):")
        lines += [f"  {w.name:<26} {w.description}" for w in model_worlds(different_tokenizers=True)]
    from exactcheck.loading import builtin_generators, loop_mutants
    lines.append("generators (`exactcheck e2e NAME`, `exactcheck greedy NAME`):")
    lines += [f"  {name:<26} {g.name}" + (" [lossy by design]" if getattr(g, "lossy", False) else "")
              for name, g in builtin_generators().items()]
    for m in loop_mutants():
        doc = " ".join(type(m).__doc__.split())
        lines.append(f"  loop-mutant:{m.name.split(': ')[1]:<22} {doc[:110] + ('...' if len(doc) > 110 else '')}")
    return lines


def greedy_catalogue() -> list[str]:
    """The greedy kind's part of ``exactcheck list``: the real model pairs and the tiny hybrids."""
    return [f"real models (`exactcheck greedy --model`): {', '.join(REAL_MODELS)}",
            f"real tiny hybrids (`exactcheck greedy --model`; greedy identity and the final cache state by state): "
            f"{', '.join(HYBRID_MODELS)}"]
