"""The reference tree loop on a tiny random Llama (issue 45, real-model part): every tree node's
logits from the cached tree forward (4D float tree mask, ``DynamicCache`` compacted after each
verify) equal a cache-free forward on that node's path; each tree-cache mutant does not.

Models are built locally from a ``LlamaConfig`` with fixed seeds (``toy_models.tree_llama``); the
tree shapes are two built-in tree worlds whose vocabulary the models take (8: the 4 x 2 x 1 top-k
tree; 4: the 3 x 1 tree with siblings drawn without replacement).
"""
import pytest
import torch

pytest.importorskip("transformers")

from exactcheck.tree.cache_checks import check_tree_calls  # noqa: E402
from exactcheck.tree.cached_loop import TREE_CACHE_MUTANTS, ReferenceTreeLoop  # noqa: E402
from toy_models.tree_llama import HFTreeModel, path_mismatches, tiny_llama  # noqa: E402
from toy_models.tree_worlds import tree_worlds  # noqa: E402

WORLDS = {w.name: w for w in tree_worlds()}
PROMPT = [1, 2, 3]


def _run(loop, world_name, new_tokens=8):
    w = WORLDS[world_name]
    target = HFTreeModel(tiny_llama(w.vocab_size, seed=0), "target")
    draft = HFTreeModel(tiny_llama(w.vocab_size, seed=1), "draft")
    log = target.record()
    draft.record(log)
    out = loop(target, draft, PROMPT, new_tokens, w, torch.Generator().manual_seed(0))
    breaches = check_tree_calls(log, PROMPT, out, w, (target.cached_tokens, target.cached_positions))
    return out, path_mismatches(target, w.topology[0], atol=1e-5), breaches, target


@pytest.mark.parametrize("world", ["tree_topk_greedy_v8_4x2x1", "tree_wor_v4_3x1"])
def test_the_reference_tree_loop_gives_every_node_its_paths_logits_on_a_tiny_llama(world):
    out, mismatches, breaches, target = _run(ReferenceTreeLoop(), world)
    assert len(out) == 8 and len(target.forwards) >= 2  # more than one verify: compaction was exercised
    assert mismatches == []
    assert breaches == []


@pytest.mark.parametrize("mutant", sorted(TREE_CACHE_MUTANTS))
def test_each_tree_cache_mutant_gives_some_node_other_logits_than_its_path(mutant):
    out, mismatches, breaches, _ = _run(TREE_CACHE_MUTANTS[mutant], "tree_topk_greedy_v8_4x2x1")
    assert mismatches, "the mutant's tree logits all matched a fresh forward"
    call, node, gap = mismatches[0]
    assert node > 0 or mutant == "rejected_branch_kept"  # a kept branch spoils the next root too
    assert gap > 1e-5
    assert breaches


def test_the_sibling_visible_mask_changes_a_second_siblings_logits_in_the_first_verify():
    _, mismatches, breaches, _ = _run(TREE_CACHE_MUTANTS["sibling_visible"], "tree_topk_greedy_v8_4x2x1")
    first_call = [node for call, node, _ in mismatches if call == 0]
    assert 2 in first_call and 1 not in first_call  # node 1 has no earlier sibling; node 2 sees node 1
    assert {b.invariant for b in breaches} >= {"tree_mask"}
