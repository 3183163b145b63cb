"""The reproduce lines of the end-to-end kinds: ``exactcheck e2e``, ``greedy`` and ``grammar``."""
from __future__ import annotations

from exactcheck.options import DEFAULT_ALPHA, AuditOptions
from exactcheck.reproduce import (Setting, device_settings, flag, head_settings, reproduce_line, required_settings,
                                 when_set)

__all__ = ["generator_audit_line", "greedy_audit_line", "grammar_audit_line"]


def generator_audit_line(options: AuditOptions, subject: str, world: str, policies=(), greedy: bool = True,
                         by_command: bool = True) -> str:
    """An end-to-end audit's line for ``world``: generations, device, categories required, and the
    decoding policies other than plain sampling (``exactcheck.contracts.policy.DecodingPolicy``; () for
    plain sampling; a policy the command line cannot state, such as a logit bias, makes the line the
    Python call) and whether greedy identity ran."""
    settings = head_settings(options, world) + when_set(options, "generations")
    settings += device_settings(options.device) + required_settings(options)
    if policies:
        specs = [policy.spec() for policy in policies]
        settings.append(Setting(" ".join(f"--policy {spec}" for spec in specs) if all(specs) else None,
                                f"policies=[{', '.join(policy.code() for policy in policies)}]"))
    if not greedy:
        settings.append(Setting("--no-greedy", "greedy=False"))
    return reproduce_line("e2e", subject, settings, "run_generator_audit", by_command)

def greedy_audit_line(subject: str, model: str, prompts: int, new_tokens: int, draft_lengths, per_prompt,
                      seed: int, device, by_command: bool = True) -> str:
    """``exactcheck greedy``'s line; the command states draft lengths 1..8 only."""
    settings = [Setting(f"--model {model}", repr(model)), Setting(f"--prompts {prompts}", f"prompts={prompts}"),
                Setting(f"--new-tokens {new_tokens}", f"new_tokens={new_tokens}"),
                Setting("" if tuple(draft_lengths) == tuple(range(1, 9)) else None,
                        f"draft_lengths={tuple(draft_lengths)!r}"),
                Setting(f"--per-prompt {per_prompt}" if per_prompt else "", f"per_prompt={per_prompt!r}"),
                Setting(flag("seed", seed), f"seed={seed}"), *device_settings(device, always=True)]
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
                Setting("" if alpha == DEFAULT_ALPHA else None, f"alpha={alpha!r}"), *device_settings(device, always=True)]
    return reproduce_line("grammar", subject, settings, "run_grammar_audit", by_command)
