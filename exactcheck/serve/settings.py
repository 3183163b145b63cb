"""Every setting a serve audit takes besides ``AuditOptions``, declared once (hypothesis's
``settings.define_setting`` is the model): its name, default, what a valid value is and the words
for one that is not, its command-line flag and help. ``ServeSettings`` (what the runner reads), the
command line (``add_arguments``, ``from_args``), the gate's checks of a ``serve = "URL"`` entry
(``FIELDS``) and the registry row's list of settings (``NAMES``) are all read from ``SETTINGS``.
Light: no torch."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from exactcheck.endpoints.apis import APIS
from exactcheck.serve.chat import DEFAULT_CHAT, ChatPrompt
from exactcheck.serve.traffic import MIXED, TRAFFIC
from exactcheck.endpoints.requests import DEFAULT_PROMPTS, DEFAULT_SAMPLINGS, parse_prompts, parse_samplings

__all__ = ["parse_prompts", "parse_samplings", "Setting", "SETTINGS", "ServeSettings", "NAMES", "FIELDS", "DEFAULT_PROMPTS", "DEFAULT_SAMPLINGS",
           "DEFAULT_CHAT", "ChatPrompt", "add_arguments", "from_args"]



def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


@dataclass(frozen=True)
class Setting:
    name: str
    default: object
    help: str
    valid: Callable[[object], bool] | None = None  # None: the command line's own parsing checks it
    rule: str = ""  # what a valid value is, in words
    choices: tuple | None = None
    type: type | None = None  # the command line's type (None: a string, or a switch for a bool)
    metavar: str | None = None
    flag: bool = True  # False: the command line reads it its own way (--prompt, --prompt-ids, --sampling), or not
    public: bool = True  # the command line, the gate and the registry row name it (False: Python callers only)

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")


SETTINGS = (
    Setting("reference", None, "a server of the same model with speculation off (default: the audited server itself, "
            "through one-token requests, which llama.cpp serves from the target alone)",
            lambda v: isinstance(v, str) and v.startswith(("http://", "https://")), "a URL http://HOST:PORT",
            metavar="URL"),
    Setting("api", "auto", "llama.cpp's /completion, OpenAI's /v1/completions, mlx-lm's (text prompts) or SGLang's "
            "/generate (default auto: llama.cpp where the server answers its /props, mlx-lm where it is "
            "mlx_lm.server, SGLang where it answers /get_model_info, else OpenAI's)",
            lambda v: v in APIS, ", ".join(APIS[:-1]) + " or " + APIS[-1], choices=APIS),
    Setting("model", None, "the model asked of an OpenAI endpoint (default: the one /v1/models lists); for mlx-lm, "
            "the model directory the server loaded, whose tokenizer writes the prompts as text",
            lambda v: isinstance(v, str) and v != "", "a model name the server serves"),
    Setting("server_settings", (), "server settings the audit cannot read, declared by the operator as NAME=VALUE "
            "(--server-setting, repeatable; for every server of the audit): mlx-lm's prompt_cache=off (the servers run "
            "with --prompt-cache-size 0), which lets its penalties be judged; recorded in the report",
            lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) and "=" in x for x in v),
            "a list of NAME=VALUE strings", flag=False),
    Setting("reference_probabilities", None, "what an OpenAI reference's logprobs are: raw (vLLM's default) or "
            "post-sampling (vLLM --logprobs-mode processed_logprobs; llama.cpp); default: raw, llama.cpp post-sampling",
            lambda v: v in ("raw", "post-sampling"), "raw or post-sampling", choices=("raw", "post-sampling")),
    Setting("prompts", DEFAULT_PROMPTS, "texts (tokenized by the server), token-id tuples, or conversations "
            "(serve.chat.ChatPrompt: audited through /v1/chat/completions)", flag=False),
    Setting("chat_template_tokenizer", None, "a model directory whose tokenizer's chat template makes the chat "
            "worlds' prompt tokens (default: the server's own template: llama.cpp /apply-template, vLLM /tokenize "
            "with messages)", lambda v: isinstance(v, str) and v != "", "a model directory", metavar="DIR"),
    Setting("samplings", DEFAULT_SAMPLINGS, "the sampling settings of the worlds", flag=False),
    Setting("length", 3, "tokens of each continuation whose law is audited (default 3)", _positive_int,
            "a positive integer", type=int),
    Setting("samples_per_request", 2, "samples asked of one request (OpenAI's n, llama.cpp's n_cmpl) by each "
            "world's independent_samples check: are they independent draws of the law? (default 2; 1: not asked)",
            _positive_int, "a positive integer", type=int, metavar="K"),
    Setting("n_probs", 256, "next-token probabilities asked of the reference", _positive_int, "a positive integer",
            type=int),
    Setting("journal", None, "the journal of every request and answer (default: under --report, else none)",
            lambda v: isinstance(v, str), "a file path", metavar="FILE"),
    Setting("resume", False, "take the answers the journal holds (an interrupted audit with the same settings) "
            "instead of sending those requests again", lambda v: isinstance(v, bool), "true or false"),
    Setting("concurrency", 8, "requests in flight at most (default 8)", _positive_int, "a positive integer", type=int),
    Setting("stream_share", 0.25, "the share of each world's requests also sent streamed (stream: true), each with "
            "the seed of a non-streamed one, and judged as a streaming user receives it (default 0.25; 0: none)",
            lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]", type=float, metavar="F"),
    Setting("eos_ids", None, "the end-of-generation token ids of the model, for worlds whose answers may end on one "
            "(--sampling ...,ignore_eos=0), where the server does not name them (vLLM; llama.cpp's /props and /tokenize "
            "name its eos_token), e.g. 2 or 2,7", lambda v: isinstance(v, str) and bool(v.strip()) and all(
                p.strip().isdigit() for p in v.split(",")), "token ids like 2 or 2,7", metavar="ID,ID"),
    Setting("traffic", MIXED, "how the sampled requests go out: mixed (default: every world's interleaved in one "
            "stream, up to --concurrency in flight, so requests with different prompts, settings and seeds share the "
            "engine's batches, with one world of unseeded requests beside them) or sequential (one world after "
            "another, every request seeded: the older order)", lambda v: v in TRAFFIC, " or ".join(TRAFFIC),
            choices=TRAFFIC),
    Setting("timeout", 60.0, "seconds per request before it is retried", lambda v: _number(v) and v > 0,
            "a positive number", type=float),
    Setting("logprob_tolerance", 0.02, "largest difference in probability allowed between reported and reference "
            "probabilities (widened to 4x the reference's own measured noise where that is larger)",
            lambda v: _number(v) and 0 < v < 1, "a number in (0, 1)", type=float),
    Setting("probed", 32, "requests with n_probs at least (logprob fidelity reads them; speculation_ran plans more "
            "where drafts are rare)", _positive_int, "a positive integer", type=int, flag=False, public=False),
    Setting("seeds", 8, "seeded requests sent twice", _positive_int, "a positive integer", type=int, flag=False,
            public=False),
    Setting("greedy_tokens", 16, "tokens of each greedy request", _positive_int, "a positive integer", type=int,
            flag=False, public=False),
    Setting("load", 4, "greedy under load: each prompt this many times at once, beside the concurrency sweep's 2, 4, "
            "8, ... up to --concurrency", _positive_int, "a positive integer",
            type=int, flag=False, public=False),
)

ServeSettings = dataclasses.make_dataclass(
    "ServeSettings", [(s.name, object, dataclasses.field(default=s.default)) for s in SETTINGS], frozen=True,
    namespace={"__doc__": "What only a serve audit takes besides ``AuditOptions`` (``SETTINGS`` says each field).",
               "__module__": __name__})

NAMES = tuple(s.name for s in SETTINGS if s.public)
# how the gate checks a [[tool.exactcheck.subject]] serve = "URL" entry's own settings
FIELDS = {s.name: (s.valid, s.rule) for s in SETTINGS if s.valid is not None and s.name in NAMES}


def add_arguments(parser) -> None:
    """The command-line flag of every setting that has one, as the table declares it."""
    for s in SETTINGS:
        if not s.flag:
            continue
        if isinstance(s.default, bool):
            parser.add_argument(s.option, action="store_true", help=s.help)
            continue
        keywords = {k: v for k, v in (("choices", s.choices), ("type", s.type), ("metavar", s.metavar)) if v}
        parser.add_argument(s.option, default=s.default, help=s.help, **keywords)


def from_args(args) -> dict:
    """The flagged settings from the parsed command line, each checked by its rule (one line, exit 2)."""
    from exactcheck.errors import UsageError
    values = {}
    for s in SETTINGS:
        if not s.flag:
            continue
        value = getattr(args, s.name)
        if value is not None and s.valid is not None and not s.valid(value):
            raise UsageError(f"{s.option} ({value!r}) must be {s.rule}")
        values[s.name] = value
    return values
