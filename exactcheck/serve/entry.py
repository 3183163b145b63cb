"""The serve audit's row of ``exactcheck.subjects.ENTRY_POINTS`` (``exactcheck serve URL``): its
command-line arguments, its settings from the parsed command line, the subject (a URL, checked to
be one), its plan and its run. Light: the runner is imported when an audit runs."""
from __future__ import annotations

import urllib.parse
from pathlib import Path

from exactcheck import arguments
from exactcheck.errors import UsageError
from exactcheck.options import DEFAULT_ALPHA, DEFAULT_LEVEL, AuditOptions, AuditPlan

__all__ = ["serve_arguments", "serve_settings", "load", "plan", "run", "OPTIONS", "SETTINGS", "FIELDS"]

OPTIONS = ("level", "seed", "alpha", "worlds", "max_samples", "detect_tv", "require")
SETTINGS = ("reference", "api", "model", "reference_probabilities", "prompts", "samplings", "length", "n_probs", "journal", "resume", "concurrency", "timeout",
            "logprob_tolerance")


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# how the gate checks a [[tool.exactcheck.subject]] serve = "URL" entry's own settings
FIELDS = {
    "reference": (lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "a URL http://HOST:PORT"),
    "api": (lambda v: v in ("auto", "llama.cpp", "openai"), "auto, llama.cpp or openai"),
    "model": (lambda v: isinstance(v, str) and v != "", "a model name the server serves"),
    "reference_probabilities": (lambda v: v in ("raw", "post-sampling"), "raw or post-sampling"),
    "length": (_positive_int, "a positive integer"),
    "n_probs": (_positive_int, "a positive integer"),
    "concurrency": (_positive_int, "a positive integer"),
    "timeout": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0, "a positive number"),
    "logprob_tolerance": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1,
                          "a number in (0, 1)"),
    "resume": (lambda v: isinstance(v, bool), "true or false"),
    "journal": (lambda v: isinstance(v, str), "a file path"),
}


def serve_arguments(parser) -> None:
    parser.add_argument("subject", metavar="URL", help="the audited server (llama.cpp's /completion, or an "
                                                       "OpenAI-compatible /v1/completions), e.g. http://127.0.0.1:8080")
    parser.add_argument("--reference", metavar="URL",
                        help="a server of the same model with speculation off (default: the audited server itself, "
                             "through one-token requests, which llama.cpp serves from the target alone)")
    parser.add_argument("--api", default="auto", choices=("auto", "llama.cpp", "openai"),
                        help="llama.cpp's /completion or OpenAI's /v1/completions (default auto: llama.cpp where the "
                             "server answers its /props)")
    parser.add_argument("--model", help="the model asked of an OpenAI endpoint (default: the one /v1/models lists)")
    parser.add_argument("--reference-probabilities", choices=("raw", "post-sampling"),
                        help="what an OpenAI reference's logprobs are: raw (vLLM's default) or post-sampling (vLLM "
                             "--logprobs-mode processed_logprobs; llama.cpp); default: raw, llama.cpp post-sampling")
    parser.add_argument("--level", default=DEFAULT_LEVEL, choices=arguments.LEVELS,
                        help="the TV every continuation law is planned to detect: quick 0.05, standard 0.01, release 0.003")
    parser.add_argument("--detect-tv", type=float, metavar="EPS", help="plan to detect this TV instead of the level's")
    parser.add_argument("--max-samples", type=int, metavar="N", help="cap on sampled requests per world")
    parser.add_argument("--seed", type=int, default=0, help="root seed (default 0): every request's seed derives from it")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="false-alarm budget, split by Holm (default 1e-3)")
    parser.add_argument("--world", action="append", metavar="NAME", help="only this world, e.g. p0-t1 (repeatable)")
    parser.add_argument("--prompt", action="append", metavar="TEXT", help="a prompt, tokenized by the server (repeatable)")
    parser.add_argument("--prompt-ids", action="append", metavar="ID,ID,...", help="a prompt as token ids (repeatable)")
    parser.add_argument("--sampling", action="append", metavar="SPEC",
                        help="sampling settings of a world, e.g. 'temperature=0.7,top_k=8', 'top_p=0.9,min_p=0.05' "
                             "(repeatable; default three settings)")
    parser.add_argument("--length", type=int, default=3, help="tokens of each continuation whose law is audited (default 3)")
    parser.add_argument("--n-probs", type=int, default=256, help="next-token probabilities asked of the reference")
    parser.add_argument("--resume", action="store_true",
                        help="take the answers the journal holds (an interrupted audit with the same settings) "
                             "instead of sending those requests again")
    parser.add_argument("--journal", metavar="FILE",
                        help="the journal of every request and answer (default: under --report, else none)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at most (default 8)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request before it is retried")
    parser.add_argument("--logprob-tolerance", type=float, default=0.02,
                        help="largest difference in probability allowed between reported and reference probabilities")
    parser.add_argument("--report", metavar="DIR", help="write JSON, Markdown and HTML reports (and the journal) here")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    arguments.require(parser)


def serve_settings(args) -> dict:
    from exactcheck.serve.endpoint import Sampling
    prompts = list(args.prompt or [])
    for spec in args.prompt_ids or []:
        try:
            prompts.append(tuple(int(t) for t in spec.split(",") if t.strip()))
        except ValueError:
            raise UsageError(f"--prompt-ids {spec!r}: expected integers like 1,2,3") from None
    samplings = []
    for spec in args.sampling or []:
        try:
            samplings.append(Sampling.parse(spec))
        except ValueError as exc:
            raise UsageError(f"--sampling {spec!r}: {exc}") from None
    for flag, value, low in (("--length", args.length, 1), ("--n-probs", args.n_probs, 1),
                             ("--concurrency", args.concurrency, 1)):
        if value < low:
            raise UsageError(f"{flag} ({value}) must be at least {low}")
    if not args.timeout > 0 or not 0 < args.logprob_tolerance < 1:
        raise UsageError("--timeout must be positive and --logprob-tolerance in (0, 1)")
    journal = args.journal
    if journal is None and args.report:
        slug = "".join(c if c.isalnum() else "-" for c in args.subject).strip("-")
        journal = str(Path(args.report) / f"serve-journal-{slug}-seed{args.seed}.jsonl")
    if args.resume and journal is None:
        raise UsageError("--resume needs the journal of the interrupted audit (--journal FILE or --report DIR)")
    settings = dict(level=args.level, seed=args.seed, alpha=args.alpha, worlds=args.world, max_samples=args.max_samples,
                    detect_tv=args.detect_tv, require=args.require, reference=args.reference, api=args.api,
                    model=args.model, reference_probabilities=args.reference_probabilities, length=args.length,
                    n_probs=args.n_probs, journal=journal, resume=args.resume, concurrency=args.concurrency,
                    timeout=args.timeout, logprob_tolerance=args.logprob_tolerance, progress=not args.quiet)
    if prompts:
        settings["prompts"] = tuple(prompts)
    if samplings:
        settings["samplings"] = tuple(samplings)
    return settings


def load(name: str) -> str:
    """The audited server's URL (a subject of this kind is where it listens)."""
    parsed = urllib.parse.urlparse(name)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"serve URL ({name!r}) must look like http://HOST:PORT")
    return name.rstrip("/")


def plan(subject, options: AuditOptions, **settings) -> AuditPlan:
    """The checks by name (the worlds are the prompts x the samplings; nothing is asked of the server)."""
    from exactcheck.serve.runner import DEFAULT_PROMPTS, DEFAULT_SAMPLINGS, serve_budget, serve_checks, serve_worlds
    prompts = settings.get("prompts") or DEFAULT_PROMPTS
    worlds = serve_worlds([() for _ in prompts], settings.get("samplings") or DEFAULT_SAMPLINGS, settings.get("length", 3))
    if options.worlds:
        worlds = [w for w in worlds if w.name in options.worlds]
    checks = serve_checks(worlds)
    return AuditPlan(options, tuple(checks), serve_budget(options.alpha, len(worlds)))


def run(subject, options: AuditOptions, *, subject_name=None, progress: bool = True, executor=None, **settings):
    from exactcheck.serve.runner import ServeSettings, run_serve_audit
    return run_serve_audit(subject, options=options, settings=ServeSettings(**settings), progress=progress,
                           subject_name=subject_name)
