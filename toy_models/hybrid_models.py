"""Tiny random HYBRID transformers models (recurrent or convolutional state plus attention), built
from configs with fixed seeds and no model hub, for auditing speculative decoding through
transformers' hybrid cache (``cache_utils.LinearAttentionLayer``: conv states and recurrent states
per linear-attention layer, keys and values per attention layer).

Every architecture is built with hidden size 64, vocabulary 256 and 4 decoder layers: state layers
0 and 2 (gated delta net, Mamba-1, Mamba-2, a short convolution), attention layers 1 and 3 (each
spec says where its architecture differs), dense MLPs or 4 small experts. The draft is the target with
relative Gaussian noise added to every weight (``toy_models.real_models._noisy_copy``).

**The state is made to matter.** A random initialisation forgets its recurrent state within a few
tokens: qwen3_next's default ``A_log`` is log U(0.01, 16), so a head decays by exp(-A softplus(a +
1)) per token, typically a factor below 0.1; a wrong state then moves the next-token law by a TV
of a few thousandths (measured at the default ``initializer_range`` 0.02: zeroing qwen3_next's
recurrent states moves it by 0.000), below any audit's reach. ``slow_decay`` (default on) sets, per
architecture:

- gated delta net and its relatives (qwen3_next, qwen3_5_text, qwen3_5_moe_text, lara_mini,
  olmo_hybrid; kimi_linear's and bailing_hybrid's forget gates): ``A_log = -2`` for every head, so A = 0.135 and the per-token decay is
  exp(-0.135 softplus(a + 1)) ~ 0.84: a state lives for ~6 tokens instead of ~1;
- Mamba-2 (bamba, falcon_h1, granitemoehybrid, nemotron_h, zamba2): ``A_log = -2`` and
  ``dt_bias = 0`` (dt = softplus(x + 0) ~ 0.7 instead of the 0.001..0.1 of the default
  inverse-softplus init, which scales the input written to the state by dt as well): decay
  exp(-0.135 * 0.7) ~ 0.91 per token;
- Mamba-1 (jamba, zamba): ``A_log = -2`` for every (channel, state) entry and the dt projection's
  bias 0, the same reasoning;
- short convolution (lfm2, lfm2_moe, lfm3): there is no recurrent state; the conv state (the last
  ``conv_L_cache`` inputs of the gated convolution) always matters; nothing is changed;
- compressed convolutional attention (zaya): a conv state and a one-token delayed value state, both
  always used; nothing is changed.

All models also use ``initializer_range = 0.2`` (as ``tiny_llama_pair``): with the default 0.02 the
logits are nearly flat and every state perturbation moves the law by less than 0.01 TV.

``state_sensitivity`` measures what the choice buys (the TV a perturbed state moves the next-token
law by); ``property_tests/e2e/test_hybrid_transformers.py`` states the numbers.

``recompute_states(model, ids)``: the per-layer states of a fresh forward over ``ids`` (no past
recording, the cache transformers builds from the model's config): the reference a generator's
final cache is compared with (``exactcheck.e2e.recurrent_cache``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HybridSpec", "ARCHITECTURES", "BUILDS_HERE", "NOT_BUILT", "build_target", "hybrid_pair",
           "LayerState", "cache_states", "recompute_states", "new_hybrid_cache", "slow_decay", "state_sensitivity",
           "next_token_law", "hybrid_prompts"]

HIDDEN = 64
LAYERS = 4
STATE_LAYERS = (0, 2)  # recurrent / conv layers; 1 and 3 are attention
A_LOG = -2.0

_COMMON = dict(vocab_size=256, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
               num_attention_heads=4, num_key_value_heads=2, bos_token_id=None, eos_token_id=None,
               pad_token_id=None, tie_word_embeddings=False, max_position_embeddings=512,
               initializer_range=0.2)
_GDN_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
_GDN = dict(layer_types=_GDN_TYPES, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
               mamba_expand=2, mamba_chunk_size=16)


@dataclass(frozen=True)
class HybridSpec:
    """One architecture: its ``model_type``, the config overrides that make it tiny, the kind of
    state mixer, and how ``slow_decay`` makes its state matter (``knob``, in words)."""

    name: str
    model_type: str
    config: dict
    mixer: str  # "gated-delta", "mamba2", "mamba1", "short-conv", "cca"
    knob: str


_PATTERN = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
_CONV_PATTERN = ["conv", "full_attention", "conv", "full_attention"]
_SMALL_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
_GDN_KNOB = "A_log = -2 for every head (decay exp(-0.135 softplus(a + dt_bias)) ~ 0.84/token; default log U(0.01, 16))"
_MAMBA2_KNOB = "A_log = -2, dt_bias = 0 (decay exp(-0.135 softplus(dt)) ~ 0.91/token; default A = 1..heads, dt 0.001..0.1)"

ARCHITECTURES: dict[str, HybridSpec] = {spec.name: spec for spec in (
    # gated delta nets
    HybridSpec("qwen3_next", "qwen3_next", dict(_GDN, mlp_only_layers=[0, 1, 2, 3], **_SMALL_MOE), "gated-delta",
               "Qwen3NextGatedDeltaNet." + _GDN_KNOB),
    HybridSpec("qwen3_5_text", "qwen3_5_text", dict(_GDN), "gated-delta", "Qwen3_5GatedDeltaNet." + _GDN_KNOB),
    HybridSpec("qwen3_5_moe_text", "qwen3_5_moe_text", dict(_GDN, **_SMALL_MOE), "gated-delta",
               "Qwen3_5MoeGatedDeltaNet." + _GDN_KNOB),
    HybridSpec("lara_mini", "lara_mini", dict(_GDN, layer_types=["linear_attention", "sliding_attention",
                                                                 "linear_attention", "full_attention"],
                                              sliding_window=8, **_SMALL_MOE), "gated-delta",
               "LaraMiniGatedDeltaNet." + _GDN_KNOB + "; layer 1 is sliding-window attention (window 8)"),
    HybridSpec("olmo_hybrid", "olmo_hybrid", dict(layer_types=_PATTERN, linear_num_key_heads=2, linear_num_value_heads=4,
                                                  linear_key_head_dim=16, linear_value_head_dim=16,
                                                  num_key_value_heads=4), "gated-delta",
               "OlmoHybridGatedDeltaNet." + _GDN_KNOB),
    HybridSpec("kimi_linear", "kimi_linear", dict(layer_types=_PATTERN, mlp_layer_types=["dense"] * 4, linear_head_dim=16,
                                                  linear_num_heads=4, linear_conv_kernel_dim=4, kv_lora_rank=16,
                                                  q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
                                                  v_head_dim=16, head_dim=16, num_key_value_heads=4,
                                                  moe_intermediate_size=32, num_experts=4, num_local_experts=4,
                                                  num_experts_per_token=2, num_experts_per_tok=2), "gated-delta",
               "KimiLinearForgetGate.A_log = -2 (Kimi delta attention's per-channel gate, as a gated delta net)"),
    HybridSpec("bailing_hybrid", "bailing_hybrid", dict(layer_types=_PATTERN, mlp_layer_types=["dense"] * 4,
                                                        linear_head_dim=16, linear_num_heads=4, head_dim=16,
                                                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                                        kv_lora_rank=16, num_key_value_heads=4, num_experts=4,
                                                        num_experts_per_token=2, moe_intermediate_size=32),
               "gated-delta", "BailingHybridForgetGate.A_log = -2 (its linear attention's decay gate)"),
    # Mamba-2
    HybridSpec("bamba", "bamba", dict(_MAMBA2, attn_layer_indices=[1, 3]), "mamba2", "BambaMixer." + _MAMBA2_KNOB),
    HybridSpec("falcon_h1", "falcon_h1", dict(_MAMBA2, mamba_d_ssm=128, head_dim=16), "mamba2",
               "FalconH1Mixer." + _MAMBA2_KNOB + "; every layer is attention AND Mamba-2 in parallel "
               "(LinearAttentionAndFullAttentionLayer: conv, recurrent, keys, values in each)"),
    HybridSpec("granitemoehybrid", "granitemoehybrid", dict(_MAMBA2, layer_types=_PATTERN, num_local_experts=0,
                                                            shared_intermediate_size=128), "mamba2",
               "GraniteMoeHybridMambaLayer." + _MAMBA2_KNOB),
    HybridSpec("nemotron_h", "nemotron_h", dict(layers_block_type=_PATTERN, num_hidden_layers=None, head_dim=16,
                                                ssm_state_size=16, mamba_num_heads=4, mamba_head_dim=32, n_groups=1,
                                                conv_kernel=4, expand=2, chunk_size=16, use_mamba_kernels=False),
               "mamba2", "NemotronHMamba2Mixer." + _MAMBA2_KNOB),
    HybridSpec("zamba2", "zamba2", dict(layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
                                        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=4,
                                        mamba_headdim=32, mamba_ngroups=1, chunk_size=16, use_mamba_kernels=False,
                                        num_mem_blocks=1, attention_head_dim=16, adapter_rank=8), "mamba2",
               "Zamba2MambaMixer." + _MAMBA2_KNOB + "; layers 1 and 3 are Mamba-2 plus the shared attention block"),
    # Mamba-1
    HybridSpec("jamba", "jamba", dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=100,
                                      expert_layer_offset=99, num_experts=1, num_experts_per_tok=1,
                                      use_mamba_kernels=False, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
                                      mamba_dt_rank=8), "mamba1",
               "JambaMambaMixer.A_log = -2, dt_proj.bias = 0 (decay exp(-0.135 softplus(dt)) ~ 0.91/token; "
               "default A = 1..d_state, dt 0.001..0.1)"),
    HybridSpec("zamba", "zamba", dict(attn_layer_period=2, attn_layer_offset=1, n_mamba_heads=2, mamba_d_state=8,
                                      mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8, use_mamba_kernels=False,
                                      attention_head_dim=16, num_key_value_heads=4), "mamba1",
               "ZambaMambaMixer.A_log = -2, dt_proj_bias = 0; its layer pattern comes from "
               "attn_layer_period/offset (layer 2 is Mamba plus the shared attention)"),
    # short convolutions
    HybridSpec("lfm2", "lfm2", dict(layer_types=_CONV_PATTERN, full_attn_idxs=[1, 3], conv_L_cache=3,
                                    block_auto_adjust_ff_dim=False), "short-conv",
               "none: Lfm2ShortConv keeps only a conv state (the last 3 inputs), which always matters"),
    HybridSpec("lfm2_moe", "lfm2_moe", dict(layer_types=_CONV_PATTERN, num_dense_layers=2, moe_intermediate_size=32,
                                            num_experts=4, num_experts_per_tok=2), "short-conv",
               "none: a conv state only (Lfm2MoeShortConv; layers 2 and 3 have 4 experts)"),
    HybridSpec("lfm3", "lfm3", dict(layer_types=_CONV_PATTERN, head_dim=16), "short-conv",
               "none: a conv state only (Lfm3ShortConv, kernel 7)"),
    # compressed convolutional attention
    HybridSpec("zaya", "zaya", dict(head_dim=16, num_experts=2, num_experts_per_tok=1), "cca",
               "none: ZayaCCAProjection keeps a conv state of q/k and a one-token delayed value state "
               "(its 'recurrent' state), both always matter"),
)}

def _spec(name: str) -> HybridSpec:
    if name not in ARCHITECTURES:
        raise KeyError(f"unknown hybrid architecture {name!r}; known: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def _config(spec: HybridSpec, **overrides):
    from transformers import AutoConfig
    kwargs = {**_COMMON, **spec.config, **overrides}
    if spec.model_type == "granitemoehybrid" and _transformers_major() < 5:
        # 4.x names granite's layer kinds "mamba" / "attention"
        kinds = {"linear_attention": "mamba", "full_attention": "attention"}
        kwargs["layer_types"] = [kinds.get(kind, kind) for kind in kwargs["layer_types"]]
    return AutoConfig.for_model(spec.model_type, **kwargs)


def slow_decay(model, mixer: str, a_log: float = A_LOG) -> int:
    """Make the recurrent state of ``model`` (whose state mixers are of kind ``mixer``) matter (see
    the module docstring): every ``A_log`` set to ``a_log``; Mamba-2 ``dt_bias`` and Mamba-1
    ``dt_proj.bias`` / ``dt_proj_bias`` set to 0. Returns how many mixers were changed (0 for a
    short-convolution or CCA model)."""
    changed = 0
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(getattr(module, "A_log", None), torch.nn.Parameter):
                continue
            module.A_log.fill_(a_log)
            if mixer == "mamba2":
                module.dt_bias.zero_()
            elif mixer == "mamba1":
                dt_proj = getattr(module, "dt_proj", None)
                bias = dt_proj.bias if isinstance(dt_proj, torch.nn.Linear) else getattr(module, "dt_proj_bias", None)
                if bias is not None:
                    bias.zero_()
            changed += 1
    return changed


def _transformers_major() -> int:
    import transformers
    return int(transformers.__version__.split(".")[0])


def build_target(name: str, seed: int = 0, state_matters: bool = True, **overrides):
    """The target model of architecture ``name`` (float32, eval mode, greedy generation config)."""
    from transformers import AutoModelForCausalLM

    from toy_models.real_models import _greedy_config
    spec = _spec(name)
    torch.manual_seed(seed)
    # eager experts: the grouped-matmul kernel takes no float64, and greedy identity classifies a
    # divergence with a float64 copy of the target
    # (4.x has no experts_implementation: its experts are eager loops)
    extra = {"experts_implementation": "eager"} if _transformers_major() >= 5 else {}
    model = AutoModelForCausalLM.from_config(_config(spec, **overrides), dtype=torch.float32, **extra).eval()
    if state_matters:
        slow_decay(model, spec.mixer)
    model.register_forward_pre_hook(_hybrid_layout, with_kwargs=True)
    return _greedy_config(model)


def _hybrid_layout(module, args, kwargs):
    """Forward pre-hook of every model built here (it changes no call that ``generate`` makes):

    - an empty cache built without a config (``DynamicCache()``, what
      ``exactcheck.contracts.transformers_compat.new_cache`` returns for exactcheck's plain
      incremental decode and final-cache recompute) gets the layer layout of ``module.config``, as
      ``DynamicCache(config=...)`` builds it (linear-attention layers where the model has them);
      a cache that already has layers (every cache ``generate`` builds) is left untouched;
    - a call without ``position_ids`` gets ``past + arange(n)`` (``past`` the cache's length):
      ``BambaModel.forward`` (modeling_bamba.py:1082-1083 in transformers 5.25.0) numbers the new
      tokens from 0 whatever the cache holds, so a cached call without ``position_ids`` rotates its
      keys at the wrong positions (logits off by ~1 here). ``generate`` always passes them; the other
      architectures compute the same numbers themselves (``cache.get_seq_length()``)."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if cache is not None and getattr(cache, "layers", None) == [] \
            and getattr(cache, "layer_class_to_replicate", None) is not None:
        cache.layers = new_hybrid_cache(module).layers
        cache.layer_class_to_replicate = None
    ids = kwargs.get("input_ids", args[0] if args else None)
    if kwargs.get("position_ids") is None and isinstance(ids, torch.Tensor) and ids.dim() == 2:
        past = int(cache.get_seq_length()) if cache is not None and getattr(cache, "layers", None) else 0
        kwargs["position_ids"] = torch.arange(past, past + ids.shape[-1], device=ids.device)[None]
        return args, kwargs
    return None


def hybrid_pair(name: str, seed: int = 0, draft_noise: float = 0.3, state_matters: bool = True, **overrides):
    """(target, draft) of architecture ``name``: the draft is the target with relative Gaussian
    noise ``draft_noise`` on every weight (0: identical)."""
    from toy_models.real_models import _noisy_copy
    target = build_target(name, seed, state_matters, **overrides)
    return target, _noisy_copy(target, draft_noise, seed + 1)


def hybrid_prompts(vocab_size: int = 256, count: int = 24, seed: int = 0) -> list[torch.Tensor]:
    """``count`` random prompts of 4..11 tokens (as ``toy_models.model_pairs.model_pair``)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab_size, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
            for _ in range(count)]


# ----------------------------------------------------------------------------------------------
# states


@dataclass
class LayerState:
    """One layer's cached state: ``conv`` and ``recurrent`` ([B, ...]; None where the layer has
    none) for a linear-attention layer, ``keys`` and ``values`` ([B, H, T, D]) for an attention
    layer; a hybrid layer (falcon_h1) can have all four."""

    index: int
    kind: str  # the cache layer's class name
    conv: torch.Tensor | None = None
    recurrent: torch.Tensor | None = None
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None

    def parts(self) -> dict[str, torch.Tensor]:
        return {name: value for name in ("conv", "recurrent", "keys", "values")
                if (value := getattr(self, name)) is not None}


def cache_states(cache) -> list[LayerState]:
    """Every layer's state in ``cache`` (a transformers ``Cache``), state 0 of each linear layer;
    conv states are returned as stored (past recording may leave them longer than the kernel)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    out = []
    for index, layer in enumerate(cache.layers):
        state = LayerState(index, type(layer).__name__)
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            if layer.is_conv_states_initialized.get(0):
                state.conv = layer.conv_states[0]
            if layer.is_recurrent_states_initialized.get(0):
                state.recurrent = layer.recurrent_states[0]
        keys = getattr(layer, "keys", None)
        if isinstance(keys, torch.Tensor) and keys.numel():
            state.keys, state.values = keys, layer.values
        out.append(state)
    return out


def new_hybrid_cache(model):
    """The cache ``generate`` builds for ``model``: ``DynamicCache(config=model.config)`` (with
    the config, linear-attention layers get ``LinearAttentionLayer``s)."""
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


def recompute_states(model, ids: torch.Tensor, chunks: int = 1) -> list[LayerState]:
    """Per-layer states of a fresh forward of ``model`` over ``ids`` ([1, T]), fed in ``chunks``
    consecutive pieces (1: one prefill; more: the recompute noise a different chunking gives)."""
    cache = new_hybrid_cache(model)
    bounds = torch.linspace(0, ids.shape[-1], chunks + 1).round().long().tolist()
    with torch.no_grad():
        for start, stop in zip(bounds, bounds[1:]):
            if stop > start:
                model(input_ids=ids[:, start:stop].to(model.device), cache=cache, use_cache=True,
                      position_ids=torch.arange(start, stop, device=model.device)[None])
    return cache_states(cache)


def next_token_law(model, cache, token: int) -> torch.Tensor:
    """softmax of ``model``'s logits after feeding ``token`` to ``cache`` (float64, [V])."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[token]], device=model.device), cache=cache, use_cache=True)
    return out.logits[0, -1].double().softmax(-1)


def state_sensitivity(model, ids: torch.Tensor) -> dict[str, float]:
    """How much the next-token law after ``ids`` ([1, T], T >= 3) depends on the state: TV between
    the law from a correct cache over ids[:-1] (then ids[-1] fed) and the law when every
    linear-attention layer's recurrent state is replaced by (a) zeros, (b) the state one token
    earlier (the state a rollback that keeps one token too few would leave); and when the conv
    states are (c) zeroed. Keys "zero_state", "stale_state", "zero_conv" (absent where a model has
    no such state)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin
    ids = ids.to(model.device)

    def cache_over(n):
        cache = new_hybrid_cache(model)
        with torch.no_grad():
            model(input_ids=ids[:, :n], cache=cache, use_cache=True)
        return cache

    last = int(ids[0, -1])
    base = next_token_law(model, cache_over(ids.shape[-1] - 1), last)
    out = {}
    linear = [layer for layer in cache_over(1).layers if isinstance(layer, LinearAttentionCacheLayerMixin)]
    if any(layer.is_recurrent_states_initialized.get(0) for layer in linear):
        zero = cache_over(ids.shape[-1] - 1)
        for layer in zero.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin) and layer.is_recurrent_states_initialized.get(0):
                layer.recurrent_states[0].zero_()
        out["zero_state"] = 0.5 * float((next_token_law(model, zero, last) - base).abs().sum())
        stale, earlier = cache_over(ids.shape[-1] - 1), cache_over(ids.shape[-1] - 2)
        for layer, old in zip(stale.layers, earlier.layers):
            if isinstance(layer, LinearAttentionCacheLayerMixin) and layer.is_recurrent_states_initialized.get(0):
                layer.recurrent_states[0].copy_(old.recurrent_states[0])
        out["stale_state"] = 0.5 * float((next_token_law(model, stale, last) - base).abs().sum())
    if any(layer.is_conv_states_initialized.get(0) for layer in linear):
        zero = cache_over(ids.shape[-1] - 1)
        for layer in zero.layers:
            if isinstance(layer, LinearAttentionCacheLayerMixin) and layer.is_conv_states_initialized.get(0):
                layer.conv_states[0].zero_()
        out["zero_conv"] = 0.5 * float((next_token_law(model, zero, last) - base).abs().sum())
    return out


# every architecture above builds, runs plain generate, assisted generation and prompt lookup on
# this CPU with transformers 5.25.0 (measured: reports/hybrid-transformers.json)
BUILDS_HERE: tuple[str, ...] = tuple(ARCHITECTURES)
# the other state-carrying model types of transformers 5.25.0, and why they are not built here
# (tried with the same tiny sizes; docs/hybrid-models.md)
NOT_BUILT: dict[str, str] = {
    "minimax": "builds and generates, but its lightning-attention cache is its own (not a croppable "
               "DynamicCache): generate(assistant_model=...) refuses with 'Assisted decoding requires a cache' "
               "(generation/utils.py:3984); nothing to audit",
    "glm5_next_text": "no AutoModelForCausalLM for the text config (only the multimodal Glm5Next model); its "
                      "DSA layers also require qk_rope_head_dim = 0",
    "qwen4_exp_text": "its indexed-attention layers need the indexer's token budget and compression ratio "
                      "(TypeError: None // None at build); not pursued",
    "inkling_text, inkling2_text, inkling2_loop_text": "plain generate fails in the embedding (IndexError: index "
                                                        "out of range) with a 256-token vocabulary; not pursued",
    "mamba, mamba2, falcon_mamba": "pure state-space models, not hybrids (no attention layer): out of scope; they "
                                   "share the rollback code path (get_recurrent_states_to_keep)",
}
