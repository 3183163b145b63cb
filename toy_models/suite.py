"""The built-in suites of worlds: the step and context worlds every step audit drives, the large
worlds audited when named (``exactcheck.step.plan`` plans them), and the model worlds of the
end-to-end audit (``exactcheck.e2e.plan``), which the cost measurement also runs on."""
from __future__ import annotations

from toy_models import ContextWorld, StepWorld, context_worlds, step_worlds

__all__ = ["default_worlds", "large_worlds", "all_model_worlds", "rule_worlds"]


def default_worlds() -> list[StepWorld | ContextWorld]:
    """Every built-in world, step worlds first."""
    return [*step_worlds(), *context_worlds()]


def large_worlds():
    """Worlds audited only when named (``--world``): their laws are never enumerated and they
    are checked by the chain-rule tests (``exactcheck.stats.chain_rule``); V = 50,000 costs minutes."""
    from toy_models.zipf_world import zipf_world
    return [zipf_world()]


def all_model_worlds(different_tokenizers: bool = False) -> list:
    """The toy model worlds, then the grammar worlds (each generated under its own policy: the
    JSON world, the choice world and the reasoning-boundary world of ``toy_models.structured``);
    for a generator that drafts in another vocabulary, the tokenizer worlds
    (``toy_models.tokenizer_worlds``)."""
    if different_tokenizers:
        from toy_models.tokenizer_worlds import tokenizer_worlds
        return list(tokenizer_worlds())
    from toy_models.grammar import grammar_world
    from toy_models.hf_toy_lm import model_worlds
    from toy_models.structured import structured_worlds
    return [*model_worlds(), grammar_world(), *structured_worlds()]


def rule_worlds(names: list[str] | None = None) -> list:
    """The worlds a rule's exact TV is tabled on (``exactcheck lossy``): every step and context world of the
    step audit, and the toy LMs
    behind the end-to-end model worlds (when transformers is installed); ``names``: only these."""
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
