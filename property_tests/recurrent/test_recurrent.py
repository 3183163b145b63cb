"""The recurrent-state worlds, their state invariants, the three exact rollbacks and the mutants
of the field (``exactcheck recurrent``)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")
if not hasattr(cache_utils, "LinearAttentionLayer"):  # the hybrid cache API (transformers 5.x)
    pytest.skip("this transformers has no LinearAttentionLayer (hybrid caches)", allow_module_level=True)

from exactcheck.contracts.policy import SAMPLING  # noqa: E402
from exactcheck.recurrent.drive import drive_recurrent  # noqa: E402
from exactcheck.recurrent.invariants import check_state_calls  # noqa: E402
from exactcheck.recurrent.loops import RECURRENT_MUTANTS, REFERENCE_LOOPS  # noqa: E402
from exactcheck.generation.laws import policy_sequence_law  # noqa: E402
from toy_models.recurrent_lm import MixerState, fresh_states, recurrent_worlds  # noqa: E402

WORLDS = recurrent_worlds()


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: w.name)
def test_the_law_is_the_models_own_rows_enumerated(world):
    """Every row of the float64 law equals the softmax of the model's float32 logits on a full
    forward, at every position of random sequences; incremental calls through the hybrid cache
    give the full forward's logits bit for bit; the law sums to 1."""
    target, _ = world.models()
    rows = world.world.target.law()
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        sequence = list(world.prompt) + torch.randint(world.vocab_size, (4,), generator=g).tolist()
        full = target(input_ids=torch.tensor([sequence]), use_cache=False).logits[0]
        state = world.world.codec.encode(0, fresh_states(world.mixers, []))
        for i, token in enumerate(sequence):
            state = world.world.next_state(state, token)
            assert np.abs(rows[state] - torch.softmax(full[i].double(), -1).numpy()).max() < 1e-15
        cache = target.new_cache()
        head = target(input_ids=torch.tensor([sequence[:5]]), cache=cache, use_cache=True).logits[0]
        tail = [target(input_ids=torch.tensor([[x]]), cache=cache, use_cache=True).logits[0] for x in sequence[5:]]
        assert torch.equal(torch.cat([head, *tail]), full)
    law = policy_sequence_law(world.world, SAMPLING, world.length)
    assert len(law) == world.vocab_size ** world.length and abs(sum(law.values()) - 1) < 1e-12


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: w.name)
def test_the_state_matters(world):
    """A recurrent state one step stale moves the next token's law by a TV far above what an audit
    at quick resolves (the worlds are built so; a random transformers initialisation forgets its
    state within a few tokens)."""
    rows = world.world.target.law()
    codec = world.world.codec
    s, states = codec.decode(world.world.prompt_state)
    tvs = []
    for i, m in enumerate(world.mixers):
        for part in ("h", "window"):
            wrong = list(states)
            if part == "h":
                wrong[i] = MixerState(states[i].window, (states[i].h + 1) % m.size)
            else:
                wrong[i] = MixerState(states[i].window[1:] + (1 + (states[i].window[-1] % world.vocab_size),),
                                      states[i].h)
            tvs.append(0.5 * np.abs(rows[world.world.prompt_state] - rows[codec.encode(s, tuple(wrong))]).sum())
    assert min(tvs) > 0.02 and max(tvs) > 0.1, tvs


def test_a_stale_state_is_named_and_a_clean_one_passes():
    world = WORLDS[0]
    target, draft = world.models()
    log: list = []
    target.calls = log
    cache = target.new_cache()
    prompt = torch.tensor([list(world.prompt)])
    target(input_ids=prompt, cache=cache, use_cache=True)
    target(input_ids=torch.tensor([[1, 2]]), cache=cache, use_cache=True)
    assert check_state_calls(log, world.mixers) == []
    target.crop_kv(cache, prompt.shape[1])  # the KV record rolled back, the recurrent layers not
    target(input_ids=torch.tensor([[0]]), cache=cache, use_cache=True)
    breaches = check_state_calls(log, world.mixers)
    assert {b.part for b in breaches} == {"conv window", "recurrent state"}
    assert {(b.layer, b.index) for b in breaches} == {(1, 0), (2, 0)} and all(b.call == 2 for b in breaches)
    assert "layer 1 state 0" in breaches[0].describe() and "5 tokens its KV record holds" in breaches[0].describe()


@pytest.mark.parametrize("name", list(REFERENCE_LOOPS))
def test_each_reference_loop_keeps_every_state_and_the_law(name):
    """A small run of each exact loop on each world: no state or KV breach at any forward call or
    final cache (the laws are the quick audit's, in the long tests and the false-alarm benchmark)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # toy tensors: threads only cost
    try:
        for world in WORLDS:
            loop = dataclasses.replace(REFERENCE_LOOPS[name], draft_length=world.world.draft_length)
            run = drive_recurrent(loop, world, 100, 5, SAMPLING)
            assert run.state_breaches == () and run.samples.breaches == ()
            assert run.final_states_checked == 200 and run.state_calls > 600
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", ["rejected_drafts_left_in_state", "no_draft_step_reads_column_zero",
                                  "recurrent_restored_conv_not", "batch_rows_read_row_zero"])
def test_a_mutant_breaks_the_state_invariant_within_a_few_generations(name):
    """The state invariant is deterministic: a mutant breaks it in the first generations, and the
    breach names the layer, the state part and the round."""
    world = WORLDS[0]
    loop = dataclasses.replace(RECURRENT_MUTANTS[name], draft_length=world.world.draft_length)
    run = drive_recurrent(loop, world, 40, 5, SAMPLING)
    assert run.state_breaches, name
    first = run.state_breaches[0][1]
    assert first.part in ("conv window", "recurrent state") and first.layer in (1, 2)


def test_transformers_assisted_generation_restores_one_state_from_anothers_history():
    """transformers 5.25 (``cache_utils.LinearAttentionCacheLayerMixin.activate_past_recording``):
    ``dict.fromkeys(range(number_of_states), [])`` gives every state of a linear-attention layer
    ONE history list, so on a layer with two recurrent states ``crop`` restores state 0 from state
    1's history. Greedy assisted generation then differs from the target's own greedy output on
    the two-state world, and not on the one-state world. (No architecture shipped in 5.25 writes
    recurrent states at two indices of a layer: the bug is latent there; docs/recurrent.md.)"""
    LinearAttention = cache_utils.LinearAttentionCacheLayerMixin
    layer = cache_utils.LinearAttentionLayer(number_of_states=2)
    layer.activate_past_recording()
    shared = layer.recurrent_states_history[0] is layer.recurrent_states_history[1]
    mismatches = {}
    for world in WORLDS:
        target, draft = world.models()
        bad = 0
        for seed in range(8):
            prompt = torch.randint(world.vocab_size, (1, 6), generator=torch.Generator().manual_seed(seed))
            alone = target.generate(prompt, max_new_tokens=6, do_sample=False)
            assisted = target.generate(prompt, max_new_tokens=6, do_sample=False, assistant_model=draft)
            bad += not torch.equal(alone, assisted)
        mismatches[world.name] = bad
    assert mismatches[WORLDS[0].name] == 0
    if shared:  # the release this test runs on has the shared list
        assert mismatches[WORLDS[1].name] > 0 and LinearAttention is not None
    else:
        assert mismatches[WORLDS[1].name] == 0


# each quick audit of a recurrent loop is about a minute on 2 cores: one reference loop and two mutants
# (a state and a conv/recurrent rollback) in the long run (.ci/run), every one in the slow run
CI_LOOPS = {"snapshot"}
CI_MUTANTS = {"rejected_drafts_left_in_state", "conv_restored_recurrent_not"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long if n in CI_LOOPS else pytest.mark.slow)
                                  for n in REFERENCE_LOOPS])
def test_each_reference_loop_passes_the_quick_audit(name):
    from exactcheck.audit_kinds import audit_subject
    result = audit_subject("recurrent", f"recurrent-{name}", level="quick", seed=0, progress=False)
    assert result.passed, [v.summary for v in result.failed]


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.long if n in CI_MUTANTS else pytest.mark.slow)
                                  for n in RECURRENT_MUTANTS])
def test_each_mutant_is_found_at_quick(name):
    from exactcheck.audit_kinds import audit_subject
    result = audit_subject("recurrent", f"recurrent-mutant:{name}", level="quick", seed=0, progress=False)
    assert not result.passed


def test_a_state_breach_leads_every_report_ahead_of_the_law_it_bends():
    """A mutant that restores the conv window and not the recurrent state puts its sequence law
    off (p ~ 1e-24) and breaks the state invariant. The breach names what to fix (layer, state,
    forward call, what it held and what it should have): the terminal's headline, its first
    finding, the Markdown's leading finding and the HTML's first finding are the breach, and its
    summary starts with the breach itself."""
    import json
    import re

    from exactcheck.audit_kinds import audit_subject
    from exactcheck.report.html import render_audit_html
    from exactcheck.report.json_md import audit_to_json, render_audit_markdown
    from exactcheck.report.terminal import audit_summary
    result = audit_subject("recurrent", "recurrent-mutant:conv_restored_recurrent_not", level="quick", seed=0,
                           progress=False, worlds=["rec2_v4_l3_k2"], generations=300, greedy=False)
    failed = {v.law: v for v in result.failed}
    assert set(failed) == {"sequence", "state_rollback"} and failed["sequence"].adjusted_pvalue < 1e-10
    breach = failed["state_rollback"]
    assert [v.law for v in result.ranked_failures()] == ["state_rollback", "sequence"]
    assert re.match(r"layer \d state \d: the (conv window|recurrent state) at forward call \d+ \(target, row \d\) is "
                    r".+, the recurrence over the \d+ tokens its KV record holds gives .+ \(in generation \d+; the "
                    r"first of [\d,]+ states not rolled back: ", breach.summary), breach.summary
    lines = audit_summary(result).splitlines()
    assert "FAILED on rec2_v4_l3_k2/state_rollback (defect)" in lines[0]
    assert lines[2].startswith("state_rollback law in world rec2_v4_l3_k2: defect — layer ")
    data = json.loads(json.dumps(audit_to_json(result)))
    md = render_audit_markdown(data)
    assert "**Leading finding**: `rec2_v4_l3_k2/state_rollback` (defect) — layer " in md
    assert md.index("### rec2_v4_l3_k2/state_rollback") < md.index("### rec2_v4_l3_k2/sequence")
    page = render_audit_html(data)
    findings = page.split("Findings</h2>", 1)[1]
    assert findings.index("<h3>rec2_v4_l3_k2/state_rollback") < findings.index("<h3>rec2_v4_l3_k2/sequence")
    assert '<p id="leading-finding"><b>Leading finding</b>: <code>rec2_v4_l3_k2/state_rollback</code>' in page
