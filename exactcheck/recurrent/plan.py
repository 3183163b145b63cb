"""What a recurrent-state audit checks, per world: the sequence law and its first token (Holm at
alpha over the two laws of every world), the KV record's rollback, the recurrent state's rollback
(``exactcheck.recurrent.invariants``), and greedy identity."""
from __future__ import annotations

from exactcheck.options import AlphaBudget, AuditOptions, AuditPlan, Check, CheckKind, chosen_worlds

__all__ = ["CHECKS", "plan_recurrent_audit", "world_names"]

CHECKS = (("sequence", CheckKind.GENERATOR_LAW), ("first_token", CheckKind.GENERATOR_LAW),
          ("cache_rollback", CheckKind.CACHE_INVARIANT), ("state_rollback", CheckKind.CACHE_INVARIANT),
          ("greedy_identity", CheckKind.GREEDY_IDENTITY))


def world_names(options: AuditOptions) -> list[str]:
    from toy_models.recurrent_lm import recurrent_worlds
    return chosen_worlds(options.worlds, (w.name for w in recurrent_worlds()), "recurrent world")


def plan_recurrent_audit(options: AuditOptions, greedy: bool = True) -> AuditPlan:
    worlds = world_names(options)
    checks = tuple(Check(f"{w}/{law}", kind, w, law) for w in worlds for law, kind in CHECKS
                   if greedy or law != "greedy_identity")
    n = options.generations_per_world
    return AuditPlan(options, checks, AlphaBudget(options.alpha, 2 * len(worlds), stop_early=False),
                     samples=tuple((w, n) for w in worlds))
