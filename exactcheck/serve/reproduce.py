"""``exactcheck serve``'s reproduce line (the command is the only way to name a server)."""
from __future__ import annotations

import shlex

from exactcheck.options import AuditOptions
from exactcheck.reproduce import Setting, head_settings, reproduce_line, when_set

__all__ = ["serve_audit_line"]


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
    settings = ([Setting(f"--reference {shlex.quote(reference)}", "")] if reference else []) + head_settings(options, world)
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
    settings += when_set(options, "max_samples", "detect_tv")
    return reproduce_line("serve", shlex.quote(url), settings)
