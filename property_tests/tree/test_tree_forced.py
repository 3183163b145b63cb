"""Forced-value properties of tree verifiers (issue 45): the judged rule's decisions at forced coins
(``tree_rule_decisions``) and row independence (``tree_row_independence``).

Known answers: each rule's oracle is its reference walk at forced coins, on random trees of every
sibling mode; the thresholds probed are the ones computed by hand on a small tree; every exact
verifier (the references, the lossy references by their own rule, the corpus written differently,
SGLang's walk) keeps both properties; each half-precision ratio mutant is found at quick by the
decisions alone, with the forced value named; a batch-dependent verifier breaks row independence.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from exactcheck.adapters.sglang_tree import SglangTreeTargetOnly
from exactcheck.corpus.trees import TREE_CORPUS
from exactcheck.options import AuditOptions
from exactcheck.forcing.randomness import controlled_randomness
from exactcheck.contracts.tree_verifier import call_tree_verifier
from exactcheck.tree.mutants import BOUNDARY_TREE_MUTANTS
from exactcheck.tree.plan import plan_tree_audit
from exactcheck.tree.properties import (DECISIONS_PROPERTY, PROBE_VALUES, ROW_PROPERTY, TREE_PROPERTY, TreeCase,
                                        decision_probes, tree_decisions_verdict, tree_row_verdict)
from exactcheck.contracts.tree_reference import LOSSY_TREE_VERIFIERS, REFERENCE_TREE_VERIFIERS, multi_round, target_only
from exactcheck.tree.rules import TREE_RULES
from exactcheck.tree.runner import run_tree_audit

CPU = torch.device("cpu")
RATIO_MUTANTS = ["ratio_in_float16", "ratio_in_bfloat16", "mirrored_coin_ratio_in_float16",
                 "mirrored_coin_ratio_in_bfloat16"]
EXACT = {**REFERENCE_TREE_VERIFIERS, **LOSSY_TREE_VERIFIERS, **TREE_CORPUS,
         "sglang_target_only": SglangTreeTargetOnly("layout")}


def _random_tree(rng: np.random.Generator, mode: str) -> TreeCase:
    """A random tree: random shape (each node's parent any earlier node), target rows with some
    zeros, siblings drawn as ``mode`` says (i.i.d. from q, without replacement, or the top-k of q)."""
    while True:
        vocab, nodes = int(rng.integers(3, 8)), int(rng.integers(2, 9))
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, nodes)]
        children = {node: [i for i in range(1, nodes) if parents[i] == node] for node in range(nodes)}
        if mode == "iid" or max(len(kids) for kids in children.values()) <= vocab:
            break
    p = rng.dirichlet(np.ones(vocab), size=nodes) * (rng.random((nodes, vocab)) > 0.25)
    p[:, 0] += 1e-3  # no empty row
    p /= p.sum(1, keepdims=True)
    q = rng.dirichlet(np.ones(vocab), size=nodes)
    tokens = [-1] * nodes
    for node, kids in children.items():
        if mode == "iid":
            drawn = rng.choice(vocab, size=len(kids), p=q[node])
        elif mode == "without_replacement":
            drawn = rng.choice(vocab, size=len(kids), replace=False, p=q[node])
        else:
            drawn = np.argsort(-q[node], kind="stable")[:len(kids)]
        for kid, token in zip(kids, drawn):
            tokens[kid] = int(token)
    return TreeCase("random", torch.tensor(p[None], dtype=torch.float32), torch.tensor(q[None], dtype=torch.float32),
                    torch.tensor([tokens], dtype=torch.int64), torch.tensor([parents], dtype=torch.int64))


@pytest.mark.parametrize("name", sorted({**REFERENCE_TREE_VERIFIERS, **LOSSY_TREE_VERIFIERS}))
def test_each_rule_oracle_is_its_reference_walk_at_forced_coins(name):
    """On random trees of the rule's sibling mode, every draw forced to c: the reference's accepted
    path is ``TREE_RULES[rule].oracle`` at u = the delivered c (no tie allowance needed)."""
    subject = {**REFERENCE_TREE_VERIFIERS, **LOSSY_TREE_VERIFIERS}[name]
    rule = TREE_RULES[subject.tree_rule]
    rng = np.random.default_rng(45)
    for _ in range(30):
        case = _random_tree(rng, rule.sibling_mode)
        p, q = case.target_probs[0].double().numpy(), case.draft_probs[0].double().numpy()
        for c in rng.random(6):
            generator = torch.Generator().manual_seed(0)
            with controlled_randomness(float(c), generators=(generator,)) as log:
                out = call_tree_verifier(subject, case.target_probs, case.draft_probs, case.tokens, case.parents,
                                         generator)
            path = [int(x) for x in out[0].tolist() if x >= 0][:-1]
            u = min(log.values()) if log.values() else float(c)
            decision = rule.oracle(p, q, case.tokens[0].tolist(), case.parents[0].tolist(), u)
            assert list(decision.tokens) == path, (name, case.tokens.tolist(), case.parents.tolist(), c)


def test_the_thresholds_probed_are_the_rules_own_computed_by_hand():
    """Two i.i.d. siblings x = 1 then y = 2 at the root: multi-round compares the coin with
    p(1)/q(1), then (after the residual update) with r(2)/q(2); deterministic with p(1), then
    p(2)/(1 - p(1)); target-only with p(1), then p(1) + p(2). Each is probed 2^-14 either side
    and at 1 minus those."""
    p = torch.tensor([[[0.4, 0.2, 0.3, 0.1], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    q = torch.tensor([[[0.1, 0.4, 0.25, 0.25], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    case = TreeCase("two siblings", p, q, torch.tensor([[-1, 1, 2]]), torch.tensor([[-1, 0, 0]]))
    # after rejecting 1: r = norm(max(p - q, 0)) = [0.3, 0, 0.05, 0] / 0.35
    expected = {"multi_round": [0.2 / 0.4, 0.05 / 0.35 / 0.25], "deterministic": [0.2, 0.3 / 0.8],
                "target_only": [0.2, 0.5]}
    for name, thresholds in expected.items():
        probes = decision_probes(TREE_RULES[name], case)
        assert [(probe.node, probe.child) for probe in probes] == [(0, 1), (0, 2)], name
        assert [probe.threshold for probe in probes] == pytest.approx(thresholds, rel=1e-6), name
        t = probes[0].threshold
        assert dict(probes[0].values) == pytest.approx(dict(zip(PROBE_VALUES, (
            t * (1 - 2 ** -14), t * (1 + 2 ** -14), 1 - t * (1 - 2 ** -14), 1 - t * (1 + 2 ** -14)))))


@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_tree_verifiers_keep_the_rule_decisions_and_row_independence(name):
    """The references (the lossy ones by their own rule), the corpus written differently (float32
    coins and ratios, 1 - u strict or not, log space, a scalar walk) and SGLang's walk."""
    subject = EXACT[name]
    decisions = tree_decisions_verdict(subject, CPU, 0, "reproduce")
    assert decisions.outcome.value == "exact", decisions.summary
    assert decisions.samples > 30
    rows = tree_row_verdict(subject, CPU, 0, "reproduce")
    assert rows.outcome.value == "exact", rows.summary


@pytest.mark.parametrize("name", RATIO_MUTANTS)
def test_a_half_precision_ratio_is_found_at_quick_by_the_rule_decisions_alone(name):
    """r/q rounded to float16 or bfloat16, the coin as drawn or mirrored: every law passes at quick;
    ``tree_rule_decisions`` names the forced value (2^-14 from a threshold) and the wrong uniforms
    (between the exact threshold and the rounded one) are a measured, reachable fraction."""
    result = run_tree_audit(BOUNDARY_TREE_MUTANTS[name], level="quick", seed=0, progress=False)
    failed = {v.check: v for v in result.failed}
    assert set(failed) == {f"properties/{DECISIONS_PROPERTY}"}, sorted(failed)
    verdict = failed[f"properties/{DECISIONS_PROPERTY}"]
    value = next(v for v in PROBE_VALUES if f"every draw forced to {v} = " in verdict.summary)
    assert value.startswith("mirrored_") == name.startswith("mirrored_"), verdict.summary
    reach = verdict.evidence.reachability
    assert reach.kind == "interval" and reach.reachable and 2.0 ** -20 < reach.probability < 2.0 ** -6
    assert reach.low <= reach.value <= reach.high
    passed = {v.check for v in result.verdicts if not v.outcome.failed}
    assert {f"properties/{TREE_PROPERTY}", f"properties/{ROW_PROPERTY}"} <= passed


def test_two_rules_with_one_law_are_told_apart_by_their_decisions():
    """Deterministic and target-only siblings give one law on a top-k tree, but one coin per sibling
    against r(x) is not one coin per node against the cumulative mass: each reference judged by the
    other's rule is found, at a forced value next to a threshold of the second sibling."""
    for subject, other in ((target_only, "deterministic"), (REFERENCE_TREE_VERIFIERS["deterministic"], "target_only")):
        verdict = tree_decisions_verdict(subject, CPU, 0, "reproduce", other)
        assert verdict.outcome.value == "defect" and "every draw forced to ratio_" in verdict.summary, verdict.summary


def _batch_mean_rows(target_probs, draft_probs, tokens, parents, generator):
    """Multi-round on the batch's mean target rows: a row's output depends on the others."""
    return multi_round(target_probs.mean(0, keepdim=True).expand_as(target_probs), draft_probs, tokens, parents,
                       generator)


_batch_mean_rows.tree_rule = "multi_round"


def test_a_verifier_that_reads_other_rows_breaks_row_independence():
    verdict = tree_row_verdict(_batch_mean_rows, CPU, 0, "reproduce")
    assert verdict.outcome.value == "defect" and "alone" in verdict.summary, verdict.summary
    assert verdict.evidence.reachability.kind == "structural"


def test_the_rule_decisions_are_planned_where_a_rule_is_judged_and_spend_no_alpha():
    options = AuditOptions.of(None, dict(level="quick"))
    declared, _ = plan_tree_audit(multi_round, options)
    undeclared, _ = plan_tree_audit(lambda *args: None, options)
    named, _ = plan_tree_audit(lambda *args: None, AuditOptions.of(None, dict(level="quick", tree_rule="multi_round")))
    properties = [f"properties/{name}" for name in (TREE_PROPERTY, ROW_PROPERTY, DECISIONS_PROPERTY)]
    assert [c for c in declared.names if c.startswith("properties/")] == properties
    assert [c for c in named.names if c.startswith("properties/")] == properties
    assert [c for c in undeclared.names if c.startswith("properties/")] == properties[:2]
    assert declared.budget.checks == len([c for c in declared.checks if c.world != "properties"])
