"""EAGLE's multi-round tree verification as shipped (``eagle-llm`` 1.2.1 on PyPI, EAGLE-1:
``eagle.model.utils`` and the batched ``eagle.modelbsne1.utils``, ``evaluate_posterior``), through
the tree contract (``exactcheck.adapters.eagle_tree``).

Marked ``engines`` (the package is installed in the engines step's environment, .ci/engines). Each
finding is read against the line it names: the audit of EAGLE's module with that one line changed
(``EagleTree(fixed=...)``, ``FIXES``) no longer has it.

* ``model`` at temperature 1 draws the ``without_replacement`` rule's law on both without-
  replacement worlds; its coin test ``r <= p/q`` with ``random.random()`` (0.0 one time in 2^53)
  accepts a sibling the target forbids (``strict_coin``);
* ``model`` at temperature 0.7 draws the bonus after a fully accepted path without the temperature
  (``bonus_temperature``): a law finding on both worlds, of exact TV 0.068 and 0.055;
* ``modelbsne1`` compares the accepted length with ``candidates.shape[1]``, the number of paths, not
  the path length (``path_length``): a law finding where they differ (2x2: 4 paths of 3 columns),
  none where they agree (3x1: 3 paths of 3 columns);
* with the coin fixed, both copies crash on the p = q edge at coins within 1.5e-7 of 1: a float32
  ratio just under 1 rejects, the residual max(p - q, 0) is empty and ``gtp / gtp.sum()`` is NaN;
* greedy (temperature 0) keeps the greedy path.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

import torch
from engine_reports import write_engine_report

from exactcheck.adapters.eagle_tree import EagleGithubTree, EagleTree, eagle_available
from exactcheck.tree.laws import lossy_tv
from exactcheck.tree.rules import WithoutReplacement, tree_rule
from exactcheck.tree.runner import run_tree_audit
from toy_models.tree_worlds import tree_worlds

pytestmark = pytest.mark.engines
needs_eagle = pytest.mark.skipif(bool(eagle_available()), reason=str(eagle_available()))
GITHUB_UTILS = os.environ.get("EXACTCHECK_EAGLE_GITHUB_UTILS")
needs_github_head = pytest.mark.skipif(
    not GITHUB_UTILS, reason="by hand: EXACTCHECK_EAGLE_GITHUB_UTILS=<a SafeAILab/EAGLE checkout>/eagle/model/utils.py")

WORLDS = {w.name: w for w in tree_worlds()}
WOR = ("tree_wor_v4_3x1", "tree_wor_v3_2x2")
LAWS = ("sequence", "first_token", "step_law@without_replacement")


def _audit(subject, name, **settings):
    result = run_tree_audit(subject, subject_name=name, level="quick", max_samples=2000, progress=False, **settings)
    write_engine_report(result, name)
    return result


def _outcomes(result):
    return {(v.world, v.law): v.outcome.value for v in result.verdicts}


class _BonusAtTemperatureOne(WithoutReplacement):
    """The without-replacement rule with EAGLE 1.2.1's bonus: at a leaf, softmax of the logits
    without the temperature, p^T normalised where the logits are T log p."""

    temperature: float = 0.7

    def leaf_law(self, p):
        tempered = p ** self.temperature
        return tempered / tempered.sum()


@needs_eagle
def test_eagle_at_temperature_1_keeps_the_law_and_accepts_a_forbidden_sibling_at_coin_zero():
    result = _audit(EagleTree("model", 1.0), "EagleModelT1")
    outcomes = _outcomes(result)
    assert all(outcomes[(w, law)] == "exact" for w in WOR for law in LAWS), outcomes
    forbidden = next(v for v in result.verdicts if v.law == "tree_no_forbidden_token")
    assert forbidden.outcome.value == "defect" and "target probability 0" in forbidden.summary, forbidden.describe()
    assert forbidden.reachability.probability == pytest.approx(2.0 ** -53), forbidden.describe()
    assert outcomes[("properties", "tree_rule_decisions")] == "exact"
    assert outcomes[("properties", "tree_row_independence")] == "exact"
    # the strict coin fixes it; what the forcing reaches next is the empty residual's 0 / 0
    fixed = _audit(EagleTree("model", 1.0, fixed=("strict_coin",)), "EagleModelT1FixedCoin", worlds=["properties"])
    crash = next(v for v in fixed.verdicts if v.law == "tree_no_forbidden_token")
    assert crash.outcome.value == "crashed" and "empty residual" in crash.summary, crash.describe()
    assert 0 < crash.reachability.probability < 1e-6, crash.describe()


@needs_eagle
def test_eagle_draws_the_bonus_after_a_full_path_at_temperature_1():
    result = _audit(EagleTree("model", 0.7), "EagleModelT07")
    base = tree_rule("without_replacement")
    bug = _BonusAtTemperatureOne(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    for w in WOR:
        sequence = next(v for v in result.verdicts if v.world == w and v.law == "sequence")
        exact_tv = lossy_tv(WORLDS[w], bug)
        assert exact_tv > 0.05 and sequence.outcome.value == "defect", sequence.describe()
        assert sequence.tv.interval[0] <= exact_tv <= sequence.tv.interval[1], (exact_tv, sequence.tv)
        first = next(v for v in result.verdicts if v.world == w and v.law == "first_token")
        assert first.outcome.value == "exact"  # the first token is never a bonus on these depths
    fixed = _audit(EagleTree("model", 0.7, fixed=("strict_coin", "bonus_temperature")), "EagleModelT07Fixed")
    assert fixed.passed, [v.describe() for v in fixed.failed]


@needs_eagle
def test_eagle_batched_compares_the_accepted_length_with_the_number_of_paths():
    result = _audit(EagleTree("modelbsne1", 1.0), "EagleBatchedT1")
    outcomes = _outcomes(result)
    assert all(outcomes[("tree_wor_v4_3x1", law)] == "exact" for law in LAWS), outcomes  # 3 paths of 3 columns
    assert outcomes[("tree_wor_v3_2x2", "sequence")] == "defect", outcomes  # 4 paths of 3 columns
    assert outcomes[("tree_wor_v3_2x2", "step_law@without_replacement")] == "defect", outcomes
    fixed = _audit(EagleTree("modelbsne1", 1.0, fixed=("path_length",)), "EagleBatchedT1FixedLength",
                   worlds=list(WOR))
    assert fixed.passed, [v.describe() for v in fixed.failed]


@needs_eagle
def test_eagle_greedy_keeps_the_greedy_path():
    for module in ("model", "modelbsne1"):
        result = _audit(EagleTree(module, 0.0), f"EagleGreedy-{module}")
        assert result.passed, [v.describe() for v in result.failed]
        assert {v.world for v in result.verdicts if v.law == "sequence"} == {"tree_topk_greedy_v4_3x1",
                                                                              "tree_topk_greedy_v8_4x2x1"}


@needs_eagle
def test_a_fix_that_does_not_apply_is_refused():
    with pytest.raises(ValueError, match="unknown fixes"):
        EagleTree("model", 1.0, fixed=("no_such_fix",))
    with pytest.raises(ValueError, match="does not apply"):
        EagleTree("model", 1.0, fixed=("path_length",))(*_one_tree())


def _one_tree():
    p = torch.full((1, 2, 3), 1 / 3, dtype=torch.float64)
    return p, p.clone(), torch.tensor([[0, 1]]), torch.tensor([[-1, 0]]), torch.Generator().manual_seed(0)


def test_the_github_head_glue_builds_eagle_2s_retrieve_indices_for_a_ragged_tree():
    # a root with children 1, 2; node 1 with children 3, 4; node 3 with child 5 (leaves 2, 4, 5)
    parents = [-1, 0, 0, 1, 1, 3]
    sampled = EagleGithubTree("unused.py", 1.0).retrieve_indices(parents).tolist()
    assert sampled == [[0, 1, 3, 5], [0, 1, 4, -1], [0, 2, -1, -1]]  # sorted by path, -1 last
    greedy = EagleGithubTree("unused.py", 0.0).retrieve_indices(parents).tolist()
    assert greedy == [[0, 2, -1, -1], [0, 1, 4, -1], [0, 1, 3, 5]]  # leaves in node order


@needs_github_head
def test_eagle_github_head_keeps_the_deterministic_rules_law_on_every_top_k_world():
    """By hand, on a fetched checkout (EAGLE-2/3 are not on PyPI): ragged and dynamic trees
    included; the coin test ``r <= p(x)`` is still non-strict (2^-53 per coin)."""
    for temperature in (1.0, 0.7):
        result = _audit(EagleGithubTree(GITHUB_UTILS, temperature), f"EagleGithubHeadT{temperature:g}")
        laws = [v for v in result.verdicts if v.world != "properties"]
        assert {v.world for v in laws} >= {"tree_topk_ragged_v4_medusa7", "tree_topk_dynamic_v5_eagle2"}
        assert all(v.outcome.value == "exact" for v in laws), [v.describe() for v in laws if v.outcome.value != "exact"]
        forbidden = next(v for v in result.verdicts if v.law == "tree_no_forbidden_token")
        assert forbidden.outcome.value == "defect" and forbidden.reachability.probability == pytest.approx(2.0 ** -53)
        assert all(v.outcome.value == "exact" for v in result.verdicts
                   if v.law in ("tree_rule_decisions", "tree_row_independence"))
    greedy = _audit(EagleGithubTree(GITHUB_UTILS, 0.0), "EagleGithubHeadGreedy")
    assert greedy.passed, [v.describe() for v in greedy.failed]
