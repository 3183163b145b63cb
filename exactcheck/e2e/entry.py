"""The generator audits' rows of ``exactcheck.audit_kinds.AUDIT_KINDS``: ``exactcheck e2e`` (the toy
model worlds), ``greedy`` (greedy identity on real models) and ``grammar`` (SmolLM2 under an
xgrammar mask), and the exactness audit the cost report carries: their command-line arguments,
their settings from the parsed command line, how they plan, run and show their results. Light:
the runners (and torch) are imported when an audit runs; each resolves its device once here
(``exactcheck.core.resolve_device``) or in its runner."""
from __future__ import annotations

import dataclasses

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import BUILTIN_GENERATORS, HYBRID_MODELS, REAL_MODELS, AuditOptions, AuditPlan

__all__ = ["parse_policy", "named", "show_generator_audit",
           "e2e_arguments", "e2e_settings", "plan_e2e", "run_e2e",
           "greedy_arguments", "greedy_settings", "plan_greedy", "run_greedy", "greedy_stem",
           "grammar_arguments", "grammar_settings", "plan_grammar", "run_grammar", "load", "cost_exactness",
           "catalogue", "greedy_catalogue"]


def parse_policy(spec: str):
    """'top_k=2,temperature=0.7' -> DecodingPolicy(temperature=0.7, top_k=2); a bad spec is a
    one-line ``UsageError``."""
    from exactcheck.contracts.policy import DecodingPolicy
    try:
        return DecodingPolicy.parse(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


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


# -- e2e: the toy model worlds -------------------------------------------------------------------

def e2e_arguments(parser) -> None:
    parser.add_argument("subject", help="a built-in generator (" + ", ".join(BUILTIN_GENERATORS) + ", or "
                        "loop-mutant:NAME) or MODULE:CALLABLE")
    arguments.options(parser, "level", "generations")
    parser.add_argument("--temperature", type=float, action="append", metavar="T",
                        help="sampling temperature (repeatable; default 1)")
    parser.add_argument("--policy", action="append", metavar="SPEC",
                        help="a decoding policy to audit under, e.g. 'temperature=0.7', 'top_k=2', "
                             "'top_p=0.8,temperature=0.9', 'min_p=0.3' (repeatable; with --temperature)")
    arguments.option(parser, "worlds")
    parser.add_argument("--no-greedy", dest="greedy", action="store_false", help="skip the greedy-identity sweep")
    arguments.options(parser, "seed", "alpha", "device")
    arguments.output(parser)
    arguments.sharding(parser)
    arguments.jobs(parser)
    arguments.require(parser)
    arguments.call_timeout(parser)
    arguments.isolate(parser)


def e2e_settings(args) -> dict:
    from exactcheck.contracts.policy import DecodingPolicy
    policies = tuple(DecodingPolicy(t) for t in (args.temperature or ([] if args.policy else [1.0])))
    policies += tuple(parse_policy(spec) for spec in (args.policy or []))
    return dict(arguments.given(args), policies=policies, greedy=args.greedy, progress=not args.quiet,
                isolate=args.isolate)


def plan_e2e(subject, options: AuditOptions, policies=None, greedy: bool = True) -> AuditPlan:
    from exactcheck.contracts.generator import capabilities_of, takes_different_tokenizers
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
    arguments.options(parser, "seed", "device")
    arguments.output(parser)


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
    arguments.options(parser, "seed", "device")
    arguments.output(parser)


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


def load(name: str):
    """A built-in generator or loop mutant by name, or MODULE:CALLABLE (``exactcheck.e2e.subjects``)."""
    from exactcheck.e2e.subjects import load_generator
    return load_generator(name)



def cost_exactness(generator, model, toy, target, draft, all_prompts, prompts, new_tokens, draft_lengths, seed,
               device, progress) -> dict:
    """A generator's exactness on the models its cost was measured on, for the cost report
    (``exactcheck.cost.generators.run_cost``; the registry hands it over): greedy identity (and
    final caches) on a real model, the quick end-to-end audit on a toy world."""
    if model is not None:
        from exactcheck.e2e.real_models import run_greedy_audit
        result = run_greedy_audit(generator, model, prompts=prompts, new_tokens=new_tokens,
                                  draft_lengths=tuple(draft_lengths), seed=seed, progress=progress,
                                  loaded=(target, draft, all_prompts), device=str(device))
    else:
        from exactcheck.e2e.runner import run_generator_audit
        result = run_generator_audit(generator, level="quick", seed=seed, worlds=[toy.name], device=str(device),
                                     progress=progress)
    tvs = [v.tv_estimate for v in result.verdicts if v.tv_estimate is not None and v.outcome.failed]
    return {"kind": result.label, "passed": result.passed, "checks": len(result.verdicts),
            "failed": [v.check for v in result.failed], "tv": max(tvs) if tvs else None,
            "summary": {v.check: v.outcome.value for v in result.verdicts}}


def catalogue() -> list[str]:
    """The e2e kind's part of ``exactcheck list``: model and tokenizer worlds, generators, loop mutants."""
    try:
        from toy_models.suite import all_model_worlds as model_worlds
    except ImportError:  # transformers is not installed: no end-to-end worlds
        model_worlds = tuple
    lines = ["model worlds (`exactcheck e2e`; toy LMs as transformers models; need transformers):"]
    lines += [f"  {w.name:<26} {w.description}" for w in model_worlds()]
    if model_worlds is not tuple:
        lines.append("tokenizer worlds (a generator declaring different_tokenizers; two vocabularies, need tokenizers):")
        lines += [f"  {w.name:<26} {w.description}" for w in model_worlds(different_tokenizers=True)]
    from exactcheck.e2e.subjects import builtin_generators, loop_mutants
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
