"""The serve audit's row of ``exactcheck.audit_kinds.AUDIT_KINDS`` (``exactcheck serve URL``): its
command-line arguments, its settings from the parsed command line, the subject (a URL, checked to
be one), its plan and its run. Light: the runner is imported when an audit runs."""
from __future__ import annotations

from pathlib import Path

from exactcheck import arguments
from exactcheck.serve import settings
from exactcheck.errors import UsageError
from exactcheck.options import AuditOptions, AuditPlan

__all__ = ["serve_arguments", "serve_settings", "load", "plan", "run", "OPTIONS", "SETTINGS", "FIELDS"]

OPTIONS = ("level", "seed", "alpha", "worlds", "max_samples", "detect_tv", "require")
SETTINGS, FIELDS = settings.NAMES, settings.FIELDS  # the registry row's: declared once, in serve/settings.py


def serve_arguments(parser) -> None:
    parser.add_argument("subject", metavar="URL", help="the audited server (llama.cpp's /completion, or an "
                                                       "OpenAI-compatible /v1/completions), e.g. http://127.0.0.1:8080")
    arguments.options(parser, "level", "detect_tv", "max_samples", "seed", "alpha", "worlds")
    parser.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt, tokenized by the server (repeatable)")
    parser.add_argument("--prompt-ids", action="append", metavar="ID,ID,...", help="a prompt as token ids (repeatable)")
    parser.add_argument("--chat", action="store_true",
                        help="audit the chat endpoint (/v1/chat/completions): its answers to a conversation, "
                             "against the law of the tokens its chat template made (default conversation "
                             f"{settings.DEFAULT_CHAT.specs()[0]!r} unless --message)")
    parser.add_argument("--message", action="append", metavar="ROLE:TEXT",
                        help="one message of the audited conversation, e.g. 'system:be brief' then 'user:abc' "
                             "(repeatable, in order; implies --chat)")
    parser.add_argument("--sampling", action="append", metavar="SPEC",
                        help="sampling settings of a world, e.g. 'temperature=0.7,top_k=8', 'top_p=0.9,min_p=0.05', "
                             "penalties 'repetition_penalty=1.3,presence_penalty=0.5,frequency_penalty=0.5,"
                             "repeat_last_n=64', a constraint last (structured output, its value to the end of the spec): "
                             "'choice=yes|no', 'temperature=0.7,regex=[a-d]{1,4}', 'json_schema=@schema.json', "
                             "'grammar=@file.gbnf' (repeatable; default three settings)")
    parser.add_argument("--server-setting", action="append", metavar="NAME=VALUE", dest="server_setting",
                        help="a server setting the audit cannot read, declared by the operator for every server of the "
                             "audit and recorded in the report (repeatable): mlx-lm's prompt_cache=off (started with "
                             "--prompt-cache-size 0), which lets its penalties be judged")
    settings.add_arguments(parser)
    arguments.output(parser)
    arguments.require(parser)


def serve_settings(args) -> dict:
    from exactcheck.serve.settings import parse_prompts
    prompts = parse_prompts(args.prompt, args.prompt_ids)
    if args.message:
        try:
            prompts.append(settings.ChatPrompt.parse(args.message))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif args.chat:
        prompts.append(settings.DEFAULT_CHAT)
    if args.chat_template_tokenizer is not None and not (args.chat or args.message):
        raise UsageError("--chat-template-tokenizer makes the chat worlds' prompt tokens: give --chat or --message")
    from exactcheck.serve.settings import parse_samplings
    samplings = parse_samplings(args.sampling)
    own = settings.from_args(args)
    journal = own.pop("journal")
    if journal is None and args.report:
        slug = "".join(c if c.isalnum() else "-" for c in args.subject).strip("-")
        journal = str(Path(args.report) / f"serve-journal-{slug}-seed{args.seed}.jsonl")
    if args.resume and journal is None:
        raise UsageError("--resume needs the journal of the interrupted audit (--journal FILE or --report DIR)")
    values = dict(arguments.given(args), progress=not args.quiet, **own, journal=journal)
    if prompts:
        values["prompts"] = tuple(prompts)
    if samplings:
        values["samplings"] = tuple(samplings)
    if args.server_setting:
        bad = [item for item in args.server_setting if "=" not in item]
        if bad:
            raise UsageError(f"--server-setting {bad[0]!r}: expected NAME=VALUE, e.g. prompt_cache=off")
        values["server_settings"] = tuple(args.server_setting)
    return values


def load(name: str) -> str:
    """The audited server's URL (a subject of this kind is where it listens)."""
    from exactcheck.endpoints.requests import check_url
    return check_url(name)


def plan(subject, options: AuditOptions, **own) -> AuditPlan:
    """The checks by name (the worlds are the prompts x the samplings; nothing is asked of the server)."""
    from exactcheck.serve.runner import serve_budget, serve_checks, serve_worlds
    prompts = own.get("prompts") or settings.DEFAULT_PROMPTS
    worlds = serve_worlds([p if isinstance(p, settings.ChatPrompt) else () for p in prompts],
                          own.get("samplings") or settings.DEFAULT_SAMPLINGS, own.get("length", 3),
                          unseeded=own.get("traffic", settings.MIXED) == settings.MIXED)
    if options.worlds:
        worlds = [w for w in worlds if w.name in options.worlds]
    checks = serve_checks(worlds)
    return AuditPlan(options, tuple(checks), serve_budget(options.alpha, len(worlds)))


def run(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None, **own):
    from exactcheck.serve.runner import run_serve_audit
    return run_serve_audit(subject, options=options, settings=settings.ServeSettings(**own), progress=progress,
                           subject_name=subject_name)


def catalogue() -> list[str]:
    """This kind's part of ``exactcheck list``: the default prompts and samplings, the proxy mutants."""
    from exactcheck.serve.mutants import PROXY_MUTANTS
    from exactcheck.serve.runner import DEFAULT_PROMPTS, DEFAULT_SAMPLINGS
    lines = ["served systems (`exactcheck serve URL [--reference URL2]`; llama.cpp's /completion or OpenAI's "
             "/v1/completions): one world per prompt and sampling"]
    lines.append(f"  prompts (tokenized by the server; --prompt, --prompt-ids): {', '.join(map(repr, DEFAULT_PROMPTS))}")
    lines.append(f"  samplings (--sampling): {'; '.join(s.describe() for s in DEFAULT_SAMPLINGS)}")
    lines.append(f"  conversations (--chat, --message ROLE:TEXT; /v1/chat/completions, llama.cpp and vLLM): "
                 f"{settings.DEFAULT_CHAT.describe()} by default, worlds c0-...")
    lines.append("served-system mutants (HTTP proxies in front of a correct server: exactcheck.serve.mutants):")
    lines += [f"  {m.name:<26} {m.defect}" for m in PROXY_MUTANTS.values()]
    return lines
