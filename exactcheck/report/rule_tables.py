"""The two tables of the rules registry: ``exactcheck rules`` (every rule: exact or lossy, its
parameters, the engine source it follows) and ``exactcheck lossy`` (the exact TV a configured
rule's output law is from the target's on every world: no subject, no sampling)."""
from __future__ import annotations

from exactcheck.rules import RULES, RuleSpec, output_tv

__all__ = ["rules_listing", "lossy_table"]


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


def lossy_table(spec: RuleSpec, worlds) -> str:
    """Per world of ``worlds`` (``toy_models.suite.rule_worlds``), the exact TV between what ``spec``
    makes the user receive and the target's own law (a context world's whole generation through the
    loop; a step world's output completed from the target), computed by enumeration in float64."""
    reference = "the greedy target" if spec.rule.greedy else "the target"
    lines = [f"{spec.label}: {'exact' if spec.exact else 'lossy'}; exact TV of the output law from {reference}'s "
             "(enumeration, float64)", f"{'world':<26} {'kind':<8} {'TV':>8}"]
    for world in worlds:
        kind = "context" if hasattr(world, "sequence_law") else "step"
        lines.append(f"{world.name:<26} {kind:<8} {output_tv(spec, world):>8.4f}")
    return "\n".join(lines)
