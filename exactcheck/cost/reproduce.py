"""``exactcheck cost``'s reproduce lines, of a generator's cost and of a served system's."""
from __future__ import annotations

import shlex
from typing import Sequence

from exactcheck.reproduce import Setting, flag, reproduce_line

__all__ = ["cost_line", "served_cost_line"]


def cost_line(subject: str, model: str | None, world: str | None, draft_lengths: str, prompts: int, seed: int,
              new_tokens: int | None = None, policy: str | None = None) -> str:
    """``exactcheck cost``'s line (the command is the only way to name its settings)."""
    settings = [Setting(f"--model {model}" if model else f"--world {world}", ""),
                Setting(f"--draft-lengths {draft_lengths}", ""), Setting(f"--prompts {prompts}", ""),
                Setting(flag("seed", seed), ""), Setting(f"--new-tokens {new_tokens}" if new_tokens else "", ""),
                Setting(f"--policy '{policy}'" if policy else "", "")]
    return reproduce_line("cost", subject, settings)

def served_cost_line(url: str, reference: str, *, api: str = "auto", model: str | None = None, prompts=(),
                     samplings: Sequence[str] = (), requests: int = 8, new_tokens: int = 32, seed: int = 0,
                     timeout: float | None = None) -> str:
    """``exactcheck cost URL --reference URL2``'s line: the served cost (``prompts``: texts or id
    tuples as given, none for the defaults; ``samplings``: their specs, none for the defaults)."""
    settings = [Setting(f"--reference {shlex.quote(reference)}", "")]
    settings += [Setting(f"{flag} {shlex.quote(str(value))}", "") for flag, value in
                 (("--api", None if api == "auto" else api), ("--model", model)) if value]
    settings += [Setting(f"--prompt {shlex.quote(p)}" if isinstance(p, str)
                         else f"--prompt-ids {','.join(str(int(t)) for t in p)}", "") for p in prompts]
    settings += [Setting(f"--sampling {shlex.quote(s)}", "") for s in samplings]
    settings += [Setting(f"--prompts {int(requests)}", ""), Setting(f"--new-tokens {int(new_tokens)}", ""),
                 Setting(flag("seed", int(seed)), ""), Setting(f"--timeout {timeout:g}" if timeout else "", "")]
    return reproduce_line("cost", shlex.quote(url), settings)
