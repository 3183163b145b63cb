"""Tree verification: the contract, the exact step laws (against Monte Carlo and against the chain
rule's own law), the reference tree verifiers passing, every mutant found by the check expected,
SGLang's layout through the adapter, and the command."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from exactcheck.adapters.sglang_tree import SglangTreeTargetOnly, cuda_kernel_available, sglang_tree_layout
from exactcheck.cli import main
from exactcheck.errors import ContractViolation, Violation
from exactcheck.rules import rule_spec
from exactcheck.stats.goodness_of_fit import goodness_of_fit
from exactcheck.contracts.tree_verifier import children_table, validate_tree_output
from exactcheck.tree.drive import drive_tree
from exactcheck.tree.laws import RULE_SIBLINGS, first_token_law, step_law
from exactcheck.corpus.trees import TREE_CORPUS
from exactcheck.tree.mutants import BOUNDARY_TREE_MUTANTS, TREE_MUTANTS, first_branch_only
from exactcheck.tree.properties import TREE_PROPERTY, edge_trees, forbidden_emission, tree_boundary_verdict
from exactcheck.contracts.tree_reference import REFERENCE_TREE_VERIFIERS
from exactcheck.tree.runner import run_tree_audit
from toy_models.tree_worlds import tree_topology, tree_worlds

WORLDS = {w.name: w for w in tree_worlds()}


def test_topology_is_breadth_first_with_parents_before_children():
    parents, depths = tree_topology((2, 2))
    assert parents == (-1, 0, 0, 1, 1, 2, 2) and depths == (0, 1, 1, 2, 2, 2, 2)
    table = children_table(torch.tensor([parents]))
    assert table[0, 0].tolist() == [1, 2] and table[0, 1].tolist() == [3, 4] and table[0, 3].tolist() == [-1, -1]


def test_the_contract_names_a_path_that_is_not_in_the_tree():
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    tokens = torch.tensor([[-1, 5, 5, 1, 2]])  # duplicate siblings: both token 5
    validate_tree_output(torch.tensor([[5, 2, 7]]), tokens, parents, 8)  # through the second 5
    validate_tree_output(torch.tensor([[5, 1, 0]]), tokens, parents, 8)  # through the first
    with pytest.raises(ContractViolation) as caught:
        validate_tree_output(torch.tensor([[5, 3, 0]]), tokens, parents, 8)
    assert caught.value.violation is Violation.NOT_A_TREE_PATH
    with pytest.raises(ContractViolation) as caught:
        validate_tree_output(torch.tensor([[5, -1, 0]]), tokens, parents, 8)
    assert caught.value.violation is Violation.TOKEN_AFTER_PADDING
    with pytest.raises(ContractViolation) as caught:
        validate_tree_output(torch.tensor([[5, 1]]), tokens, parents, 8)
    assert caught.value.violation is Violation.WRONG_SHAPE


@pytest.mark.parametrize("world", sorted(WORLDS), ids=str)
def test_every_exact_step_law_sums_to_one_and_emits_the_target_first(world):
    w = WORLDS[world]
    from exactcheck.tree.rules import TREE_RULES
    for rule, siblings in RULE_SIBLINGS.items():
        if siblings != w.siblings:
            continue
        law = step_law(w, w.world.prompt_state, rule)
        if not TREE_RULES[rule].exact:  # lossy (typical): a law, not the target's first token
            assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
            continue
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        first = np.zeros(w.vocab_size)
        for outcome, prob in law.items():
            first[outcome[0]] += prob
        np.testing.assert_allclose(first, first_token_law(w, w.world.prompt_state), atol=1e-12)


def test_a_k1_tree_has_the_chain_law():
    """The K = 1 tree's step law (this module's recursion) equals the token-wise chain law computed
    by ``exactcheck.rules`` (another implementation) over every draft sequence."""
    w = WORLDS["tree_iid_k1_v3_1x1x1"]
    cw, vocab, k = w.world, w.vocab_size, w.depth
    p_rows, q_rows = cw.target.law(), cw.draft.law()
    tree = step_law(w, cw.prompt_state, "multi_round")
    chain: dict = {}
    token_wise = rule_spec("token-wise")
    for drafts in itertools.product(range(vocab), repeat=k):
        states = [cw.prompt_state]
        for x in drafts:
            states.append(int(cw.next_state(states[-1], x)))
        weight = float(np.prod([q_rows[states[i]][x] for i, x in enumerate(drafts)]))
        p = p_rows[states][None]
        q = q_rows[states[:-1]][None]
        accept, final = token_wise.rule.emission(p, q, np.array([drafts]), token_wise.values)
        for j in range(k + 1):
            for x in range(vocab):
                key = tuple(drafts[:j]) + (x,)
                chain[key] = chain.get(key, 0.0) + weight * accept[0, j] * final[0, j, x]
    chain = {o: v for o, v in chain.items() if v > 0}
    assert set(tree) == set(chain)
    for outcome in tree:
        assert tree[outcome] == pytest.approx(chain[outcome], abs=1e-12)


@pytest.mark.parametrize("rule", sorted(REFERENCE_TREE_VERIFIERS))
def test_the_enumerated_step_law_matches_monte_carlo(rule):
    """Each reference verifier's first-step emitted tuples against its enumerated law: a fixed
    seed and a chi-square at alpha 1e-4 (the reference is exact, so this fails 1 run in 10,000)."""
    siblings = RULE_SIBLINGS[rule]
    w = next(w for w in tree_worlds() if w.siblings == siblings and w.vocab_size <= 4 and w.depth == 2)
    law = step_law(w, w.world.prompt_state, rule)
    samples = drive_tree(REFERENCE_TREE_VERIFIERS[rule], w, 20_000, seed=11)
    outcomes = sorted(law)
    index = {o: i for i, o in enumerate(outcomes)}
    counts = np.bincount([index.get(o, len(outcomes)) for o in samples.first_steps], minlength=len(outcomes) + 1)
    gof = goodness_of_fit(counts, np.array([law[o] for o in outcomes] + [0.0]), 1e-4)
    assert gof.impossible == 0 and gof.pvalue > 1e-4, (rule, gof)


@pytest.mark.parametrize("name", sorted(REFERENCE_TREE_VERIFIERS))
def test_each_reference_tree_verifier_passes_a_quick_audit(name):
    result = run_tree_audit(REFERENCE_TREE_VERIFIERS[name], level="quick", seed=3, progress=False,
                            max_samples=10_000)  # the 50-seed figures at the full quick budget: docs/checks.md
    assert result.passed, [v.describe() for v in result.failed]
    laws = {v.law for v in result.verdicts}
    assert {"sequence", "first_token", f"step_law@{name}"} <= laws


EXPECTED = {  # mutant -> (a world it must fail on, the check that finds it)
    "residual_from_draft_q": ("tree_topk_v4_3x1", "sequence"),
    "duplicates_double_counted": ("tree_iid_dup_v2_3x2", "sequence"),
    "lone_child_greedy": ("tree_iid_k1_v3_1x1x1", "sequence"),
    "tree_read_as_chain": ("tree_iid_v3_3x1", "contract"),
    "mask_of_32_slots": ("tree_topk_wide_v40_36", "first_token"),
    "correction_ignores_residual": ("tree_iid_v3_3x1", "sequence"),
    "correction_from_parent_row": ("tree_iid_v3_3x1", "sequence"),
    "siblings_pruned_by_target": ("tree_iid_k1_v3_1x1x1", "sequence"),
}


@pytest.mark.parametrize("name", sorted(TREE_MUTANTS))
def test_each_tree_mutant_is_found_by_the_check_expected(name):
    world, law = EXPECTED[name]
    result = run_tree_audit(TREE_MUTANTS[name], level="quick", seed=4, progress=False, worlds=[world])
    verdict = {v.law: v for v in result.verdicts}[law]
    assert verdict.outcome.failed, verdict.describe()


def test_a_tree_verifier_that_ignores_siblings_is_exact_in_law_and_accepts_less():
    exact = run_tree_audit(first_branch_only, level="quick", seed=5, progress=False, worlds=["tree_iid_v3_3x1"])
    assert exact.passed
    w = WORLDS["tree_iid_v3_3x1"]
    wasteful = drive_tree(first_branch_only, w, 4000, seed=6)
    full = drive_tree(REFERENCE_TREE_VERIFIERS["multi_round"], w, 4000, seed=6)
    assert wasteful.accepted < full.accepted


def test_sglang_layout_of_a_tree():
    parents = torch.tensor([[-1, 0, 0, 1, 2]])
    tokens = torch.tensor([[-1, 4, 5, 6, 7]])
    candidates, index, next_token, next_sibling = sglang_tree_layout(tokens, parents, root_token=9)
    assert candidates.tolist() == [[9, 4, 5, 6, 7]]
    assert next_token.tolist() == [[1, 3, 4, -1, -1]]
    assert next_sibling.tolist() == [[-1, 2, -1, -1, -1]]
    assert index.tolist() == [[0, 1, 2, 3, 4]]


def test_sglang_target_only_walk_through_the_adapter_is_exact_and_conforms():
    result = run_tree_audit(SglangTreeTargetOnly("layout"), level="quick", seed=7, progress=False,
                            worlds=["tree_topk_v3_2x2"], max_samples=20_000)
    assert result.passed, [v.describe() for v in result.failed]
    assert {v.law for v in result.verdicts} == {"sequence", "first_token", "step_law@target_only"}


@pytest.mark.skipif(cuda_kernel_available() is not None, reason=str(cuda_kernel_available()))
def test_sglang_cuda_tree_kernel_through_the_adapter():  # run by benchmarks/gpu_session.sh where CUDA is
    result = run_tree_audit(SglangTreeTargetOnly("cuda"), level="quick", seed=8, progress=False)
    assert result.passed, [v.describe() for v in result.failed]


def test_the_tree_command_exits_1_on_a_mutant_and_2_on_a_missing_kernel(capsys):
    assert main(["tree", "tree-mutant:tree_read_as_chain", "--quiet", "--world", "tree_iid_v3_3x1"]) == 1
    out = capsys.readouterr().out
    assert "contract" in out and "exactcheck tree tree-mutant:tree_read_as_chain" in out
    if cuda_kernel_available() is not None:
        assert main(["tree", "sglang-tree-target-only-cuda", "--quiet"]) == 2
        assert "CUDA" in capsys.readouterr().err


def test_sglang_greedy_tree_walk_through_the_adapter_keeps_the_greedy_path():
    from exactcheck.adapters.sglang_tree import SglangTreeGreedy
    result = run_tree_audit(SglangTreeGreedy("layout"), level="quick", seed=9, progress=False, max_samples=1000)
    assert result.passed and {v.world for v in result.verdicts} == {"tree_topk_greedy_v4_3x1",
                                                                     "tree_topk_greedy_v8_4x2x1", "properties"}


def test_tensorrt_llm_dynamic_tree_walk_is_exact_up_to_32_siblings_and_not_past():
    """TensorRT-LLM's post-#15098 dynamic-tree rejection sampling, as read from its kernel and run in
    torch (``exactcheck.adapters.trtllm_tree``): exact on the top-k trees; on the 36-sibling tree
    its 32-entry tried-token list leaves rejected siblings 33..36 in the correction's residual."""
    from exactcheck.adapters.trtllm_tree import TrtllmDynamicTree, trtllm_tree_layout
    drafts, next_token, next_sibling = trtllm_tree_layout(torch.tensor([[-1, 4, 5, 6]]),
                                                          torch.tensor([[-1, 0, 0, 1]]))
    assert drafts.tolist() == [[4, 5, 6]] and next_token.tolist() == [[1, 3, -1, -1]]
    assert next_sibling.tolist() == [[-1, 2, -1, -1]]
    narrow = run_tree_audit(TrtllmDynamicTree(), level="quick", seed=10, progress=False, max_samples=10_000,
                            worlds=["tree_topk_v4_3x1", "tree_topk_v3_2x2", "tree_topk_greedy_v8_4x2x1"])
    assert narrow.passed, [v.describe() for v in narrow.failed]
    wide = run_tree_audit(TrtllmDynamicTree(), level="quick", seed=10, progress=False,
                          worlds=["tree_topk_wide_v40_36"])
    assert {v.law for v in wide.failed} >= {"first_token"}


# -- boundary coins (issue 45): every draw forced to 0 and 1 - ulp ---------------------------------

@pytest.mark.parametrize("name", sorted(REFERENCE_TREE_VERIFIERS) + sorted(TREE_CORPUS) + ["first_branch_only",
                                                                                         "sglang_target_only"])
def test_exact_tree_verifiers_keep_the_boundary_coin_property(name):
    """The references, the corpus written differently (float32 coins, 1 - u, log space, a scalar
    walk) and SGLang's walk: no forbidden token at any forced coin, on every edge tree."""
    subject = {**REFERENCE_TREE_VERIFIERS, **TREE_CORPUS, "first_branch_only": first_branch_only,
               "sglang_target_only": SglangTreeTargetOnly("layout")}[name]
    verdict = tree_boundary_verdict(subject, torch.device("cpu"), 0, "reproduce")
    assert verdict.outcome.value == "exact", verdict.summary


def test_the_edge_trees_are_valid_in_every_sibling_mode():
    for mode in ("iid", "without_replacement", "top_k"):
        for case in edge_trees(mode):
            table = children_table(case.parents)[0]
            for node in range(case.tokens.shape[1]):
                kids = [int(case.tokens[0, k]) for k in table[node].tolist() if k >= 0]
                q = case.draft_probs[0, node].double()
                assert all(q[x] > 0 for x in kids), (case.name, node)
                if mode != "iid":
                    assert len(set(kids)) == len(kids), case.name
                if mode == "top_k" and kids:
                    assert kids == torch.sort(q, descending=True, stable=True).indices[:len(kids)].tolist(), case.name
    case = edge_trees("iid")[0]
    assert forbidden_emission(case, torch.tensor([0, 1])) is not None
    assert forbidden_emission(case, torch.tensor([1, 2])) is None


def test_a_coin_at_or_below_the_ratio_is_found_at_quick_by_the_boundary_property_alone():
    """The non-strict float32 coin of TensorRT-LLM's walk on a multi-round verifier: its laws pass
    (2^-24 a coin is out of any sample's reach); the property finds it, reachable at 2^-24 a call."""
    result = run_tree_audit(BOUNDARY_TREE_MUTANTS["coin_at_or_below_ratio"], level="quick", seed=0, progress=False,
                            max_samples=10_000)
    failed = {v.check: v for v in result.failed}
    assert set(failed) == {f"properties/{TREE_PROPERTY}"}, sorted(failed)
    reach = failed[f"properties/{TREE_PROPERTY}"].evidence.reachability
    assert reach.kind == "interval" and reach.probability == pytest.approx(2.0 ** -24) and reach.dtype == "float32"


def test_tensorrt_llm_walk_accepts_a_forbidden_sibling_at_a_coin_of_zero():
    """The TensorRT-LLM walk as read (``u <= prob_acc``, float32 coins): a first sibling the target
    forbids is accepted when the coin is exactly 0 (prob_acc is then 0)."""
    from exactcheck.adapters.trtllm_tree import TrtllmDynamicTree
    verdict = tree_boundary_verdict(TrtllmDynamicTree(), torch.device("cpu"), 0, "reproduce")
    assert verdict.outcome.value == "defect" and "forced to zero" in verdict.summary
    assert verdict.evidence.reachability.probability == pytest.approx(2.0 ** -24)


def test_the_tree_command_takes_a_rule_and_names_it_in_reproduce_lines(capsys):
    """``--rule``: an exact but wasteful verifier judged by the multi-round rule fails conformance
    only; a rule for other siblings, or an unknown one, is a usage error."""
    assert main(["tree", "tree-corpus:first_branch_only", "--rule", "multi_round", "--quiet", "--world",
                 "tree_iid_v3_3x1", "--max-samples", "20000"]) == 1
    out = capsys.readouterr().out
    assert "step_law@multi_round" in out and "--rule multi_round" in out
    assert main(["tree", "tree-corpus:first_branch_only", "--rule", "target_only", "--quiet"]) == 2
    assert main(["tree", "tree-corpus:first_branch_only", "--rule", "nope", "--quiet"]) == 2


# ---- ragged and dynamic trees, the loop law, lossy tree rules (issue 45) ----

def test_every_exact_tree_rule_gives_the_target_law_through_the_loop_on_every_world():
    """The whole-generation law of every exact rule, composed step by step (``loop_sequence_law``),
    is the target's own law on every world: ragged and dynamic shapes included (exactness holds for
    any shape, proved by enumeration, not sampled)."""
    from exactcheck.tree.laws import loop_sequence_law
    from exactcheck.tree.rules import TREE_RULES
    for w in WORLDS.values():
        for name, rule in TREE_RULES.items():
            if rule.sibling_mode == w.siblings and rule.exact:
                np.testing.assert_allclose(loop_sequence_law(w, name), w.sequence_law(), atol=1e-12,
                                           err_msg=f"{name} on {w.name}")


def test_ragged_and_dynamic_worlds_have_leaves_at_several_depths_and_shapes_per_state():
    from exactcheck.contracts.tree_verifier import tree_depths
    ragged, dynamic = WORLDS["tree_topk_ragged_v4_medusa7"], WORLDS["tree_topk_dynamic_v5_eagle2"]
    parents, depths = ragged.topology
    leaves = {depths[i] for i in range(1, len(parents)) if i not in parents}
    assert leaves == {1, 2, 3}  # Medusa-style: leaves at three depths
    states = torch.arange(dynamic.world.num_states)
    _, _, tokens, parents, node_states = dynamic.draw_tree(states, torch.Generator().manual_seed(0))
    assert tokens.shape == (len(states), dynamic.nodes)
    assert len({tuple(row) for row in parents.tolist()}) > 3  # the shape is chosen per state
    assert set(tree_depths(parents).max(1).values.tolist()) >= {2, 3}
    q = dynamic.world.draft.law()
    for s in range(dynamic.world.num_states):  # the kept children of a node are its draft row's top ones
        toks, pars = dynamic.tree_at(s)
        for node in range(len(toks)):
            kids = [toks[i] for i in range(1, len(toks)) if pars[i] == node]
            if kids:
                row = q[int(node_states[s, node])]
                assert kids == [int(x) for x in np.argsort(-row, kind="stable")[:len(kids)]]


def test_a_lossy_tree_rule_is_judged_by_its_own_law_and_says_what_it_costs():
    """``typical`` follows its declared rule: lossy-by-design verdicts with the exact TV; judged by
    the other typical rule (argmax bonus), the same verifier is found: the check can fail."""
    from exactcheck.tree.laws import lossy_tv
    from exactcheck.contracts.tree_reference import typical
    worlds = ["tree_topk_v4_3x1", "tree_topk_ragged_v4_medusa7"]
    result = run_tree_audit(typical, level="quick", seed=5, progress=False, worlds=worlds, max_samples=5_000)
    assert result.passed, [v.describe() for v in result.failed]
    sequence = {v.world: v for v in result.verdicts if v.law == "sequence"}
    for name in worlds:
        assert sequence[name].outcome.value == "lossy-by-design"
        assert f"TV {lossy_tv(WORLDS[name], 'typical'):.4f}" in sequence[name].summary
    assert lossy_tv(WORLDS["tree_topk_v4_3x1"], "typical") > 0.5
    wrong = run_tree_audit(typical, level="quick", seed=5, progress=False, worlds=worlds, max_samples=5_000,
                           tree_rule="typical_medusa")
    assert not wrong.passed and {v.law for v in wrong.failed} >= {"sequence"}


def test_a_top_k_tree_pruned_by_reading_the_target_is_still_exact():
    """Point-mass siblings are exact whatever set is tried: dropping the siblings the target
    disfavours (a shape chosen by reading the target) is no finding on the top-k worlds, dynamic and
    ragged ones included, while the same pruning of i.i.d. siblings is (``siblings_pruned_by_target``)."""
    from exactcheck.tree.mutants import pruned_by_target_top_k
    worlds = ["tree_topk_dynamic_v5_eagle2", "tree_topk_ragged_v4_medusa7", "tree_topk_v4_3x1"]
    result = run_tree_audit(pruned_by_target_top_k, level="quick", seed=6, progress=False, worlds=worlds)
    assert result.passed, [v.describe() for v in result.failed]


def test_the_greedy_tree_rule_is_exact_on_greedy_targets_and_its_own_law_elsewhere():
    """``greedy`` (the argmax child, else the argmax): its walk follows its registered law on a
    sampled target (lossy, with the exact TV) and is exact on a greedy target."""
    from exactcheck.tree.laws import lossy_tv
    from exactcheck.contracts.tree_reference import greedy
    worlds = ["tree_topk_v4_3x1", "tree_topk_dynamic_v5_eagle2", "tree_topk_greedy_v8_4x2x1"]
    result = run_tree_audit(greedy, level="quick", seed=7, progress=False, worlds=worlds, max_samples=4_000)
    assert result.passed, [v.describe() for v in result.failed]
    outcome = {v.world: v.outcome.value for v in result.verdicts if v.law == "sequence"}
    assert outcome == {"tree_topk_v4_3x1": "lossy-by-design", "tree_topk_dynamic_v5_eagle2": "lossy-by-design",
                       "tree_topk_greedy_v8_4x2x1": "exact"}
    assert lossy_tv(WORLDS["tree_topk_greedy_v8_4x2x1"], "greedy") < 1e-12 < lossy_tv(WORLDS["tree_topk_v4_3x1"], "greedy")
