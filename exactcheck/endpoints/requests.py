"""What an audit or a measurement asks of a served system: prompts and sampling settings as the
command line gives them (``--prompt``, ``--prompt-ids``, ``--sampling``), and the defaults both the
serve audit and the served cost send."""
from __future__ import annotations

from exactcheck.endpoints.endpoint import Sampling

__all__ = ["DEFAULT_PROMPTS", "DEFAULT_SAMPLINGS", "parse_prompts", "parse_samplings", "check_url"]

DEFAULT_PROMPTS = ("The", "Once upon a time", "1, 2, 3,")
DEFAULT_SAMPLINGS = (Sampling(), Sampling(temperature=0.7, top_k=8), Sampling(top_p=0.9, min_p=0.05))


def parse_prompts(texts, id_specs) -> list:
    """``--prompt TEXT`` (kept as text) then ``--prompt-ids ID,ID,...`` (a tuple of ids each); a
    malformed id list is a one-line ``UsageError``."""
    from exactcheck.errors import UsageError
    prompts = list(texts or [])
    for spec in id_specs or []:
        try:
            prompts.append(tuple(int(t) for t in spec.split(",") if t.strip()))
        except ValueError:
            raise UsageError(f"--prompt-ids {spec!r}: expected integers like 1,2,3") from None
    return prompts


def parse_samplings(specs) -> list[Sampling]:
    """``--sampling SPEC`` each (``Sampling.parse``); a malformed one is a one-line ``UsageError``."""
    from exactcheck.errors import UsageError
    samplings = []
    for spec in specs or []:
        try:
            samplings.append(Sampling.parse(spec))
        except ValueError as exc:
            raise UsageError(f"--sampling {spec!r}: {exc}") from None
    return samplings


def check_url(name: str) -> str:
    """A served system's URL, checked to be one (a one-line ``UsageError`` if not), without its
    trailing slash."""
    import urllib.parse

    from exactcheck.errors import UsageError
    parsed = urllib.parse.urlparse(name)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"serve URL ({name!r}) must look like http://HOST:PORT")
    return name.rstrip("/")
