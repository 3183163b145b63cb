"""Hybrid models (recurrent or conv state beside attention) and the state invariants read
through transformers' hybrid cache (``toy_models.hybrid_models``, ``exactcheck.e2e.recurrent_cache``;
docs/hybrid-models.md).

Default run (34 tests, 5 to 11 s on 2 shared cores, one torch thread): the core architectures build, the
state matters (a perturbed state moves the next-token law by the TV stated below), the checker
passes correct caches (another chunking, transformers' own crop where it keeps every state,
``generate`` alone) and flags every deliberately corrupted one with the layer, the part and the
size. ``long``: the benchmark on a few architectures, and every architecture of ``BUILDS_HERE``.
"""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
cache_utils = pytest.importorskip("transformers.cache_utils")
if not hasattr(cache_utils, "LinearAttentionLayer"):
    pytest.skip("this transformers has no hybrid cache (LinearAttentionLayer arrived with 5.x)", allow_module_level=True)

from exactcheck.e2e.recurrent_cache import (RECOMPUTE_NOISE, TOLERANCE, compare_states,  # noqa: E402
                                            final_state_breaches, recompute_noise)
from toy_models import hybrid_models as H  # noqa: E402

CORE = ("qwen3_next", "qwen3_5_text", "bamba", "jamba", "lfm2")
# the smallest TV (measured: seed 0, the sequence below) by which the next-token law moves when the
# state is perturbed, the knob on; measured values in brackets
STATE_MATTERS = {  # arch: (part, least TV)
    "qwen3_next": ("zero_state", 0.3),     # (0.76; stale by one token 0.47)
    "qwen3_5_text": ("zero_state", 0.3),   # (0.70; stale 0.59)
    "bamba": ("zero_state", 0.3),          # (0.52; stale 0.05)
    "jamba": ("zero_state", 0.3),          # (0.74; stale 0.49)
    "lfm2": ("zero_conv", 0.3),            # (0.73; conv state only)
}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared CPU run ~10x faster on one thread (no oversubscription)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models():
    return {name: H.hybrid_pair(name) for name in CORE}


def _sequence(length=14, seed=3):
    return torch.randint(256, (1, length), generator=torch.Generator().manual_seed(seed))


def _filled(model, ids, record=None):
    cache = H.new_hybrid_cache(model)
    if record is not None:
        cache.activate_past_recording(recurrent_states_to_keep=record)
    with torch.no_grad():
        model(input_ids=ids, cache=cache, use_cache=True,
              position_ids=torch.arange(ids.shape[-1])[None])
    return cache


@pytest.mark.parametrize("name", CORE)
def test_the_core_architectures_build_with_their_state_layers_where_stated(models, name):
    target, draft = models[name]
    states = H.recompute_states(target, _sequence(6))
    assert [sorted(s.parts()) for s in states[:2]] == [
        ["conv"] if name == "lfm2" else ["conv", "recurrent"], ["keys", "values"]]
    assert target.config.hidden_size == 64 and len(states) == 4
    assert any((a - b).abs().max() > 0 for a, b in zip(target.parameters(), draft.parameters()))


@pytest.mark.parametrize("name", CORE)
def test_the_state_matters(models, name):
    part, least = STATE_MATTERS[name]
    tv = H.state_sensitivity(models[name][0], _sequence(12))
    assert tv[part] >= least, tv


def test_exactchecks_own_greedy_decode_is_the_models_on_a_hybrid_model(models):
    """The reference of greedy identity (a plain incremental decode through a cache built without
    a config) equals ``generate`` and a no-cache recompute: the builder's pre-hook gives the cache
    the hybrid layout and the positions bamba does not compute itself."""
    from exactcheck.generation.greedy_identity import target_greedy
    target = models["bamba"][0]
    prompt = _sequence(6)[0]
    mine = target_greedy(target, prompt, 8)
    ids = prompt[None]
    theirs = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                             do_sample=False)[0, 6:].tolist()
    seq = prompt.tolist()
    with torch.no_grad():
        for _ in range(8):
            seq.append(int(target(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    assert mine == theirs == seq[6:]


@pytest.mark.parametrize("name", ("qwen3_next", "bamba", "lfm2"))
def test_recompute_noise_is_far_below_the_tolerance(models, name):
    noise = recompute_noise(models[name][0], _sequence(20), chunkings=(None, 3))
    assert max(noise.values()) <= RECOMPUTE_NOISE and RECOMPUTE_NOISE * 100 <= TOLERANCE, noise


@pytest.mark.parametrize("name", ("qwen3_next", "bamba", "lfm2"))
def test_correct_caches_pass(models, name):
    target = models[name][0]
    ids = _sequence(14)
    # another chunking of the same tokens
    assert compare_states(H.recompute_states(target, ids, 4), H.recompute_states(target, ids)) == []
    # transformers' own crop where every state it needs was recorded (keep >= the tokens fed)
    for keep, fed, removed in ((4, 4, 2), (4, 3, 3), (2, 1, 1), (3, 3, 0)):
        cache = _filled(target, ids[:, :8])
        cache.activate_past_recording(recurrent_states_to_keep=keep)
        with torch.no_grad():
            target(input_ids=ids[:, 8:8 + fed], cache=cache, use_cache=True,
                   position_ids=torch.arange(8, 8 + fed)[None])
        cache.crop(-removed)
        assert final_state_breaches(target, cache, ids[:, :8 + fed - removed]) == [], (keep, fed, removed)
        assert final_state_breaches(target, cache, ids[:, :8 + fed - removed + 1]) == []  # last token not fed
    # plain generate's returned cache
    out = target.generate(ids[:, :6], attention_mask=torch.ones(1, 6, dtype=torch.long), max_new_tokens=6,
                          min_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert final_state_breaches(target, out.cache, out.sequences) == []


def test_a_sliding_window_layer_is_compared_on_the_window_it_keeps():
    """lara_mini's layer 1 is sliding-window attention (window 8): it keeps its last 7 positions, so
    its length is not the cache's, and generate's own cache passes."""
    target = H.build_target("lara_mini")
    ids = _sequence(8)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                          do_sample=False, return_dict_in_generate=True)
    assert out.cache.layers[1].keys.shape[-2] < out.sequences.shape[-1] - 1
    assert final_state_breaches(target, out.cache, out.sequences) == []


def _mutant(target, ids, held, part):
    """A cache over ids[:held] with one part of layer 0 (and only it) corrupted as a faulty rollback
    leaves it: ``recurrent``/``conv``: the state of two tokens later (not rolled back);
    ``stale``: the recurrent state one token earlier (a rollback that restores one state too
    many); ``keys``: two rejected tokens' keys and values left in layer 1."""
    cache = _filled(target, ids[:, :held])
    if part in ("recurrent", "conv"):
        later = _filled(target, ids[:, :held + 2])
        name = "recurrent_states" if part == "recurrent" else "conv_states"
        getattr(cache.layers[0], name)[0] = getattr(later.layers[0], name)[0].clone()
    elif part == "stale":
        earlier = _filled(target, ids[:, :held - 1])
        cache.layers[0].recurrent_states[0] = earlier.layers[0].recurrent_states[0].clone()
    elif part == "keys":
        later = _filled(target, ids[:, :held + 2])
        cache.layers[1].keys, cache.layers[1].values = later.layers[1].keys, later.layers[1].values
    return cache


@pytest.mark.parametrize("name", ("qwen3_next", "bamba", "jamba"))
@pytest.mark.parametrize("part", ("recurrent", "stale", "conv", "keys"))
def test_corrupted_caches_are_flagged_with_layer_part_and_size(models, name, part):
    target = models[name][0]
    ids = _sequence(14)
    breaches = final_state_breaches(target, _mutant(target, ids, 10, part), ids[:, :10])
    assert breaches, part
    first = breaches[0]
    if part == "keys":
        assert (first.layer, first.part) == (1, "length") and "holds 12 tokens, the cache says 10" in first.describe()
    else:
        assert (first.layer, first.part) == (0, "recurrent" if part == "stale" else part)
        assert first.relative > 10 * TOLERANCE and f"layer 0 {first.part} state" in first.describe()


def test_lfm2_conv_rollback_mutant_is_flagged(models):
    target = models["lfm2"][0]
    ids = _sequence(14)
    breaches = final_state_breaches(target, _mutant(target, ids, 10, "conv"), ids[:, :10])
    assert (breaches[0].layer, breaches[0].part) == (0, "conv")


def test_the_checker_agrees_with_a_direct_comparison_on_transformers_rollback_of_every_draft(models):
    """transformers' verify forward feeds k + 1 tokens while the cache records the states of the
    last k (``activate_past_recording(recurrent_states_to_keep=num_drafting_tokens)``); rolling
    back all k drafts restores ``recurrent_states_history[-k]``. The checker's verdict equals a
    direct comparison of that state with a recompute (on 5.25.0 they differ: docs/hybrid-models.md)."""
    target = models["qwen3_next"][0]
    ids = _sequence(14)
    for k in (1, 2, 4):
        cache = _filled(target, ids[:, :6])
        cache.activate_past_recording(recurrent_states_to_keep=k)
        with torch.no_grad():
            target(input_ids=ids[:, 6:7 + k], cache=cache, use_cache=True, position_ids=torch.arange(6, 7 + k)[None])
        cache.crop(-k)
        reference = H.recompute_states(target, ids[:, :7])
        wrong = not torch.allclose(cache.layers[0].recurrent_states[0], reference[0].recurrent, rtol=0, atol=1e-5)
        breaches = final_state_breaches(target, cache, ids[:, :7])
        assert bool(breaches) == wrong
        if wrong:
            assert (breaches[0].layer, breaches[0].part) == (0, "recurrent")


def test_the_greedy_audit_takes_hybrid_models_and_checks_their_states():
    from exactcheck.adapters.hf_generate import AssistedGeneration
    from exactcheck.e2e.real_models import hybrid_model_names, run_greedy_audit
    assert hybrid_model_names()["tiny-qwen3-next"] == "qwen3_next"
    result = run_greedy_audit(AssistedGeneration(), "tiny-lfm2", prompts=2, new_tokens=6, draft_lengths=(1, 2),
                              progress=False)
    assert result.passed, [v.summary for v in result.verdicts]
    assert "conv, recurrent, key and value states" in result.verdicts[-1].summary


def test_a_copy_keeps_the_hook(models):
    """greedy identity classifies divergences with a float64 deep copy of the target."""
    target = copy.deepcopy(models["lfm2"][0]).double()
    assert H.recompute_states(target, _sequence(5))[0].conv.dtype == torch.float64


@pytest.mark.slow  # about 90 s on 2 cores: the slow run
def test_the_benchmark_on_the_core_architectures(tmp_path):
    """Small settings (about 90 s): the target alone passes everything on every architecture; on the
    short-convolution model (no recurrent state) assisted generation and prompt lookup pass too; on
    transformers 5.25.0 the gated-delta model's rollback of every draft is seen by greedy identity,
    the state invariants and the chain-rule law tests."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "hybrid_transformers.py"
    spec = importlib.util.spec_from_file_location("hybrid_transformers_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    benchmark.main(["--archs", "qwen3_next", "lfm2", "bamba", "--prompts", "4", "--new-tokens", "16", "--law-samples", "150",
          "--chain-samples", "12", "--out", str(tmp_path / "r")])
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {row["arch"]: row for row in report["architectures"]}
    for row in rows.values():
        control = row["greedy"]["target"]
        assert control["identical"] == control["runs"] and control["states"]["breached"] == 0
        assert row["laws"]["target"]["verdict"] == "pass"
    for mode in ("assisted", "prompt-lookup"):
        lfm2 = rows["lfm2"]["greedy"][mode]
        assert lfm2["identical"] == lfm2["runs"] and lfm2["states"]["breached"] == 0
    if transformers.__version__ == "5.25.0":
        qwen = rows["qwen3_next"]
        assert qwen["greedy"]["assisted"]["defects"] > 0 and qwen["greedy"]["assisted"]["states"]["breached"] > 0
        assert qwen["laws"]["assisted"]["verdict"] == "DEFECT"


@pytest.mark.long
@pytest.mark.parametrize("name", H.BUILDS_HERE)
def test_every_listed_architecture_builds_and_generates(name):
    target, draft = H.hybrid_pair(name)
    ids = _sequence(8)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, min_new_tokens=4,
                          do_sample=False, return_dict_in_generate=True)
    assert out.sequences.shape[-1] == 12
    assert final_state_breaches(target, out.cache, out.sequences) == []
    assert H.state_sensitivity(target, _sequence(12))  # some state exists and is read
