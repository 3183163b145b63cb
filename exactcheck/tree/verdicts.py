"""The verdicts of a tree audit: one world's trials judged by its laws (``tree_verdicts``), before
Holm (``exactcheck.core.apply_holm``); the boundary-coin verdict is ``exactcheck.tree.properties``'.
"""
from __future__ import annotations

import numpy as np

from exactcheck.core import STATISTIC_NAME, deviating_cells, impossible_summary, plot_cells
from exactcheck.options import Category, CheckKind
from exactcheck.report.verdict import Evidence, LawEvidence, Outcome, TotalVariation, Verdict
from exactcheck.stats.goodness_of_fit import goodness_of_fit, tv_certificate
from exactcheck.stats.laws import LawComparison, LawPlan
from exactcheck.tree.drive import TreeSamples
from exactcheck.tree.laws import RULE_SIBLINGS, loop_sequence_law, lossy_tv, step_law
from exactcheck.tree.rules import tree_rule

__all__ = ["tree_verdicts"]


def _codes(sequences: np.ndarray, vocab: int) -> np.ndarray:
    codes = np.zeros(sequences.shape[0], dtype=np.int64)
    for j in range(sequences.shape[1]):
        codes = codes * vocab + sequences[:, j]
    return codes


def _law_verdict(name: str, law: str, condition: str, expected: np.ndarray, observed: np.ndarray, label, share: float,
                 alpha: float, base: dict, category: Category = Category.EXACTNESS, lossy: str = "") -> Verdict:
    # cells of probability 0 (a greedy world's law is one cell) are merged into one "other" cell, as
    # the end-to-end laws do, so the TV interval is not widened by thousands of empty cells
    support = np.flatnonzero(expected > 0)
    if support.size < expected.size:
        position = np.full(expected.size, support.size, dtype=np.int64)
        position[support] = np.arange(support.size)
        observed = position[observed]
        expected = np.concatenate([expected[support], [0.0]])
        old_label = label
        label = lambda i: old_label(int(support[i])) if i < support.size else "any outcome of probability 0"  # noqa: E731
    counts = np.bincount(observed, minlength=expected.size).astype(np.int64)
    gof = goodness_of_fit(counts, expected, share)
    comparison = LawComparison(LawPlan(law, condition, expected, label), counts)
    summary = (f"{impossible_summary(gof.impossible, 'trials')}; TV {gof.tv_estimate:.4f}"
               if gof.impossible else f"TV {gof.tv_estimate:.4f}, p = {gof.pvalue:.3g}")
    if lossy:
        summary = f"{lossy}; the subject follows its rule: {summary}"
    return Verdict(outcome=Outcome.LOSSY if lossy else Outcome.EXACT, summary=summary, check=f"{name}/{law}", law=law,
                   condition=condition,
                   samples=gof.samples, kind=CheckKind.LAW, category=category, **base, evidence=LawEvidence(
                       Evidence.DETERMINISTIC if gof.impossible else Evidence.FIXED_BUDGET,
                       statistic=None if gof.impossible else gof.statistic, statistic_name=STATISTIC_NAME, df=gof.df,
                       pvalue=gof.pvalue, tv=TotalVariation(gof.tv_estimate, gof.tv_interval, gof.detectable_tv),
                       certificate=tv_certificate(counts, expected, alpha),
                       cells=deviating_cells(comparison, gof.samples), law_cells=plot_cells(comparison, gof.samples)))


def tree_verdicts(samples: TreeSamples, rule: str | None, share: float, alpha: float, base: dict) -> list[Verdict]:
    """The law verdicts of one world's trials (before Holm)."""
    w = samples.world
    vocab, length = w.vocab_size, w.length
    seq = samples.sequences.numpy()
    # a subject that declares a lossy tree rule is judged against what its rule gives the user,
    # and each verdict says what that costs (the exact TV of the rule's law from the target's)
    # (a lossy rule whose law is the target's on this world, typical acceptance on a greedy target,
    # is judged as exact there)
    lossy = (rule is not None and not tree_rule(rule).exact and RULE_SIBLINGS[rule] == w.siblings
             and lossy_tv(w, rule) > 1e-12)
    law = loop_sequence_law(w, rule) if lossy else w.sequence_law()
    note = (f"lossy by design ({rule}): its output law on this world is TV {lossy_tv(w, rule):.4f} from the "
            "target's (exact)") if lossy else ""
    category = Category.CONFORMANCE if lossy else Category.EXACTNESS
    verdicts = [
        _law_verdict(w.name, "sequence", f"whole sequences of {length} tokens through the loop", law,
                     _codes(seq, vocab), lambda i: str([int(x) for x in np.unravel_index(i, (vocab,) * length)]),
                     share, alpha, base, category, note),
        _law_verdict(w.name, "first_token", "first token of every trial", law.reshape(vocab, -1).sum(1), seq[:, 0],
                     lambda i: f"token {i}", share, alpha, base, category, note)]
    if rule is not None and RULE_SIBLINGS[rule] == w.siblings:
        step = step_law(w, w.world.prompt_state, rule)
        outcomes = sorted(step)
        index = {o: i for i, o in enumerate(outcomes)}
        observed = np.array([index.get(o, len(outcomes)) for o in samples.first_steps], dtype=np.int64)
        verdicts.append(_law_verdict(
            w.name, f"step_law@{rule}", f"the first verify call's emitted tokens, rule {rule}",
            np.array([step[o] for o in outcomes] + [0.0]), observed,
            lambda i: str(list(outcomes[i])) if i < len(outcomes) else "any other", share, alpha, base,
            Category.CONFORMANCE))
    return verdicts


