"""The tree kinds' reproduce lines: ``exactcheck tree`` and ``exactcheck tree-loop``."""
from __future__ import annotations

from exactcheck.options import AuditOptions
from exactcheck.reproduce import Setting, device_settings, reproduce_line, required_settings, stated, when_set

__all__ = ["tree_audit_line", "tree_loop_line"]


def tree_audit_line(options: AuditOptions, subject: str, world: str, by_command: bool = True) -> str:
    """A tree audit's line for ``world``: level, seed and world, and what else changes what the
    world draws (budget, device) or how it is judged (alpha, categories required, call timeout),
    where it differs from the default. ``by_command``: the subject is named as the command takes it
    (else the line is the ``run_tree_audit`` call)."""
    settings = [stated(options, "level"), stated(options, "seed"), stated(options, "worlds", [world], f"worlds=[{world!r}]")]
    settings += when_set(options, "alpha", "detect_tv", "max_samples", "call_timeout")
    if options.tree_rule:
        settings.append(Setting(f"--rule {options.tree_rule}", f"tree_rule={options.tree_rule!r}"))
    settings += device_settings(options.device) + required_settings(options)
    return reproduce_line("tree", subject, settings, "run_tree_audit", by_command)

def tree_loop_line(options: AuditOptions, subject: str, world: str, generations: int, by_command: bool = True) -> str:
    """``exactcheck tree-loop``'s line for ``world``: seed, world and the generations drawn there
    (which the level only stands for), and alpha and the categories required where they differ
    from the default. ``by_command``: the subject is named as the command takes it (else the line
    is the ``run_tree_generation_audit`` call, ``subject`` then the Python name)."""
    settings = [stated(options, "seed"), stated(options, "worlds", [world], f"worlds=[{world!r}]"),
                stated(options, "generations", generations, f"trials={generations}")]
    settings += when_set(options, "alpha") + required_settings(options)
    return reproduce_line("tree-loop", subject, settings, "run_tree_generation_audit", by_command)
