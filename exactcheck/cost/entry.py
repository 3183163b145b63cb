"""The cost kind's row of ``exactcheck.audit_kinds.AUDIT_KINDS`` (``exactcheck cost``): the speed
claim next to the exactness verdict. A generator is timed against the target alone on the same
prompts and policy, per draft length (``exactcheck.cost.generators``); a served system (a URL)
against ``--reference``, the same model with speculation off (``exactcheck.cost.served``). Its
command-line arguments, settings, subject, run and presentation; the result is a ``CostResult``.
Light: the runners (and torch) are imported when a measurement runs."""
from __future__ import annotations

from dataclasses import dataclass

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import REAL_MODELS, AuditOptions

__all__ = ["CostResult", "cost_arguments", "cost_settings", "served_cost_settings", "is_url", "run", "cost_stem",
           "show_cost", "parse_policy"]


@dataclass(frozen=True)
class CostResult:
    """A cost measurement: its report (``data``: the JSON of ``exactcheck.report.cost_report`` or
    ``exactcheck.report.served_cost_report``, by ``schema``), and what a caller reads of it."""

    data: dict

    @property
    def schema(self) -> str:
        return self.data["schema"]

    @property
    def served(self) -> bool:
        from exactcheck.report.served_cost_report import SERVED_COST_SCHEMA
        return self.schema == SERVED_COST_SCHEMA

    @property
    def stopped(self) -> dict | None:
        """Why a served measurement stopped early (``reason``: interrupted, or the server failed)."""
        return self.data.get("stopped") if self.served else None

    @property
    def exactness(self) -> dict | None:
        """The exactness audit on the same models, where one ran."""
        return self.data.get("exactness")


def parse_policy(spec: str):
    from exactcheck.contracts.policy import DecodingPolicy
    try:
        return DecodingPolicy.parse(spec)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# A subject that is a URL is a served system: its cost against --reference (exactcheck.cost.served);
# any other is a generator against the target alone (exactcheck.cost.generators).

def is_url(name) -> bool:
    import urllib.parse
    if not isinstance(name, str):
        return False
    parsed = urllib.parse.urlparse(name)
    return parsed.scheme in ("http", "https")


def cost_arguments(parser) -> None:
    from exactcheck.endpoints.apis import APIS
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
    arguments.options(parser, "seed", "device")
    arguments.output(parser)
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
    if is_url(args.subject):
        return served_cost_settings(args)
    from exactcheck.cost.reproduce import cost_line
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
        from exactcheck.contracts.policy import GREEDY
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
    """A served system's settings (``exactcheck.cost.served.run_served_cost``) from the command line;
    an in-process flag, a missing --reference or a bad value is one line (exit 2)."""
    given = [_flag(name) for name, default in _IN_PROCESS_ONLY if getattr(args, name) != default]
    if given:
        raise UsageError(f"{', '.join(given)}: not for a served system (it takes --reference, --api, --model, "
                         f"--sampling, --prompt, --prompt-ids, --prompts, --new-tokens, --timeout)")
    if not args.reference:
        raise UsageError(f"cost of the served system {args.subject} needs --reference URL2: the same model served "
                         f"with speculation off")
    if not is_url(args.reference):
        raise UsageError(f"--reference ({args.reference!r}) must look like http://HOST:PORT")
    from exactcheck.endpoints.requests import parse_prompts, parse_samplings
    prompts = parse_prompts(args.prompt, args.prompt_ids)
    samplings = parse_samplings(args.sampling)
    if args.prompts < 2:
        raise UsageError("--prompts must be at least 2 (the intervals need more than one request)")
    if args.new_tokens is not None and args.new_tokens < 1:
        raise UsageError(f"--new-tokens ({args.new_tokens}) must be at least 1")
    if args.timeout is not None and not args.timeout > 0:
        raise UsageError(f"--timeout ({args.timeout}) must be a positive number of seconds")
    from exactcheck.cost.reproduce import served_cost_line
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


def cost_stem(args) -> str:
    return "cost-served-" if is_url(args.subject) else f"cost-{_cost_model(args) or args.world}-"


def run(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None,
        exactness_audit=None, **settings) -> CostResult:
    """The measurement: ``exactcheck.cost.served`` for a served system (a URL), else
    ``exactcheck.cost.generators`` with ``exactness_audit`` (the audit that goes into the same report,
    handed over by the registry) unless ``--no-exactness`` (``exactness`` False)."""
    if isinstance(subject, str):
        from exactcheck.cost.served import run_served_cost
        prompts = settings.pop("served_prompts", None)
        timeout = settings.pop("timeout", None)
        requests = settings.pop("prompts", 8)
        return CostResult(run_served_cost(subject, seed=options.seed, progress=progress, requests=requests,
                                          **({"prompts": prompts} if prompts else {}),
                                          **({"timeout": timeout} if timeout is not None else {}), **settings))
    from exactcheck.core import resolve_device
    from exactcheck.cost.generators import run_cost
    audit = exactness_audit if settings.pop("exactness", True) else None
    return CostResult(run_cost(subject, device=resolve_device(options.device), seed=options.seed, progress=progress,
                               exactness=audit, **settings))


def show_cost(result: CostResult, args, stem: str) -> int:
    """The headline; the JSON, Markdown and HTML when ``--report``. The speed is measured, not
    judged: 0, except a served system that stopped answering mid-run (1, its partial report written)
    or a run interrupted (130)."""
    from exactcheck.console import EXIT_DEFECT, EXIT_INTERRUPTED, EXIT_PASS, write_and_list
    from exactcheck.report.cost_report import cost_headline
    from exactcheck.report.served_cost_report import served_cost_headline
    print(served_cost_headline(result.data) if result.served else cost_headline(result.data))
    if args.report:
        write_and_list(result.data, args.report, stem)
    if result.stopped:
        return EXIT_INTERRUPTED if result.stopped.get("reason") == "interrupted" else EXIT_DEFECT
    return EXIT_PASS
