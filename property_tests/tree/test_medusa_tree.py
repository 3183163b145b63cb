"""Medusa's tree verification as shipped (``medusa-llm`` 0.1 on PyPI: ``medusa.model.utils.
evaluate_posterior``), through the tree contract (``exactcheck.adapters.medusa_tree``).

Marked ``engines`` (the package is installed in the engines step's environment, .ci/engines):

* typical acceptance (temperature 1, thresholds 0.09 / 0.3) conforms to the registered lossy rule
  ``typical_medusa`` on every top-k tree world, ragged and dynamic ones included: lossy-by-design,
  each verdict with the rule's exact TV;
* greedy (temperature 0) keeps the greedy path on the greedy worlds (exact);
* the GitHub head's padding of shorter candidate paths (``generate_medusa_buffers``: index -1, so
  token 0 and the tree's last node's logits) emits a phantom token 0 on the ragged world: the
  contract (not a tree path) and the boundary property find it.
"""
from __future__ import annotations

import pytest
from engine_reports import write_engine_report

from exactcheck.adapters.medusa_tree import MedusaTree, medusa_available

pytestmark = pytest.mark.engines

if medusa_available():
    pytest.skip(medusa_available(), allow_module_level=True)

from exactcheck.tree.laws import lossy_tv  # noqa: E402
from exactcheck.tree.runner import run_tree_audit  # noqa: E402
from toy_models.tree_worlds import tree_worlds  # noqa: E402

WORLDS = {w.name: w for w in tree_worlds()}


def test_medusa_typical_acceptance_follows_the_typical_medusa_rule_on_every_top_k_world():
    result = run_tree_audit(MedusaTree("typical"), subject_name="medusa-typical", level="quick", max_samples=2000,
                            progress=False)
    write_engine_report(result, "MedusaTypical")
    assert result.passed, [v.describe() for v in result.failed]
    sequence = [v for v in result.verdicts if v.law == "sequence"]
    assert {v.world for v in sequence} >= {"tree_topk_ragged_v4_medusa7", "tree_topk_dynamic_v5_eagle2"}
    for v in sequence:
        tv = lossy_tv(WORLDS[v.world], "typical_medusa")
        if tv > 1e-12:  # lossy: its verdict says what it costs
            assert v.outcome.value == "lossy-by-design" and f"TV {tv:.4f}" in v.summary
        else:  # a greedy target: the rule's law is the target's, judged as exact
            assert v.outcome.value == "exact" and WORLDS[v.world].greedy


def test_medusa_greedy_keeps_the_greedy_path():
    result = run_tree_audit(MedusaTree("greedy"), subject_name="medusa-greedy", level="quick", max_samples=2000,
                            progress=False)
    write_engine_report(result, "MedusaGreedy")
    assert result.passed, [v.describe() for v in result.failed]
    assert {v.world for v in result.verdicts if v.law == "sequence"} == {"tree_topk_greedy_v4_3x1",
                                                                          "tree_topk_greedy_v8_4x2x1"}


def test_medusa_github_padding_emits_a_phantom_token_on_a_ragged_tree():
    result = run_tree_audit(MedusaTree("typical", padding="medusa"), subject_name="medusa-typical-github-padding",
                            level="quick", max_samples=2000, progress=False, worlds=["tree_topk_ragged_v4_medusa7"])
    write_engine_report(result, "MedusaGithubPadding")
    failed = {v.law: v for v in result.failed}
    assert "contract" in failed and "token 0" in failed["contract"].summary, [v.describe() for v in result.verdicts]
