"""The step audit's reproduce line: which settings change what a world draws or how it is judged."""
from __future__ import annotations

from exactcheck.options import AuditOptions
from exactcheck.reproduce import Setting, device_settings, head_settings, reproduce_line, required_settings, when_set

__all__ = ["step_audit_line"]


def step_audit_line(options: AuditOptions, subject: str, world: str, by_command: bool | None = None) -> str:
    """A step audit's line for ``world``: every option that changes what the world draws (budget,
    call size, shards, device) or how it is judged (early stopping, categories required). A
    subject the command can name (``by_command``; default: given as MODULE:CALLABLE) is named on
    the command line; any other, in the call."""
    settings = head_settings(options, world)
    if options.rule is not None:
        settings.append(Setting(f"--rule {options.rule}", f"rule={options.rule!r}"))
    settings += when_set(options, "stop_early", "detect_tv", "max_samples")
    fitted = dict(options.trials or ()).get(world)
    if fitted is not None:  # a budget cut to fit --max-seconds, or trials named: the same trials
        settings.append(Setting(f"--trials {world}={fitted}", f"trials={{{world!r}: {fitted}}}"))
    if options.stop_early and not options.looks_from_one:  # --max-seconds: its batches, as drawn
        settings.append(Setting("--looks-from-share", "looks_from_one=False"))
    settings += when_set(options, "shards", "call_elements", "call_timeout")  # a slow call's verdict depends on it
    settings += device_settings(options.device) + required_settings(options)
    return reproduce_line("audit", subject, settings, "run_audit",
                          by_command=":" in subject if by_command is None else by_command)
