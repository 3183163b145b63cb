"""The two tables of the rules registry: ``exactcheck rules`` (every rule: exact or lossy, its
parameters, the engine source it follows) and ``exactcheck lossy`` (the exact TV a configured
rule's output law is from the target's on every world: no subject, no sampling)."""
from __future__ import annotations

from exactcheck.rules import RULES, RuleSpec, output_tv

__all__ = ["rules_listing", "lossy_table", "lossy_worlds"]


def rules_listing() -> str:
    lines = []
    for rule in RULES.values():
        kind = "exact" if rule.exact else "lossy" + (" (exact at its defaults)" if rule.exact_at(
            {p.name: p.default for p in rule.parameters}) else "")
        lines.append(f"{rule.name:<17} {kind}: {rule.title}")
        lines.append(f"{'':<17}   {rule.formula}")
        for p in rule.parameters:
            default = "no default (required)" if p.default is None else f"default {p.default:g}"
            lines.append(f"{'':<17}   --param {p.name}=VALUE  {p.description} ({default})")
        lines.append(f"{'':<17}   source: {rule.source}")
    return "\n".join(lines)


def lossy_worlds(names: list[str] | None = None) -> list:
    """The worlds of the table: every step and context world of the step audit, and the toy LMs
    behind the end-to-end model worlds (when transformers is installed); ``names``: only these."""
    from exactcheck.suite import default_worlds
    worlds = list(default_worlds())
    try:
        from toy_models.hf_toy_lm import model_worlds
        worlds += [m.world for m in model_worlds()]
    except ImportError:  # no transformers: the model worlds' toy LMs are left out
        pass
    if names:
        unknown = set(names) - {w.name for w in worlds}
        if unknown:
            raise ValueError(f"unknown world(s) {sorted(unknown)}; known: {[w.name for w in worlds]}")
        worlds = [w for w in worlds if w.name in names]
    return worlds


def lossy_table(spec: RuleSpec, names: list[str] | None = None) -> str:
    """Per world, the exact TV between what ``spec`` makes the user receive and the target's own
    law (a context world's whole generation through the loop; a step world's output completed from
    the target), computed by enumeration in float64."""
    reference = "the greedy target" if spec.rule.greedy else "the target"
    lines = [f"{spec.label}: {'exact' if spec.exact else 'lossy'}; exact TV of the output law from {reference}'s "
             "(enumeration, float64)", f"{'world':<26} {'kind':<8} {'TV':>8}"]
    for world in lossy_worlds(names):
        kind = "context" if hasattr(world, "sequence_law") else "step"
        lines.append(f"{world.name:<26} {kind:<8} {output_tv(spec, world):>8.4f}")
    return "\n".join(lines)
