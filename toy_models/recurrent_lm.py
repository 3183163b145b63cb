"""Toy hybrid language models with a recurrent state, whose sequence law is enumerable exactly.

A hybrid model (Qwen3-Next and Qwen3.5 with Gated DeltaNet, NemotronH and Jamba with Mamba, LFM2
with short convolutions) carries, besides its attention KV cache, a state per linear-attention
layer that cannot be cropped: under speculative decoding the state after a rejected draft must be
restored from a snapshot, recomputed, or read from a per-position table. These worlds make that
state finite so the law stays exact:

- an **attention context**: the rolling hash of the whole prefix, ``s' = (s V + x + 1) mod S``,
  read from the KV cache's (token, position) record, as in ``toy_models.context_lm``;
- per linear-attention layer, one or more **mixers** (transformers' ``number_of_conv_states``),
  each with a **convolution window** (the last ``width`` tokens; stored as token + 1, 0 = empty)
  and a **gated recurrence** quantised to ``H`` states, ``h' = (gate[x] h + shift[x]) mod H``
  with ``H`` prime and every gate a unit, so two different states never merge: a state that went
  wrong stays wrong for the rest of the sequence (the state matters, as it does not in a random
  transformers initialisation, which forgets it within a few tokens).

The next-token logits are the float32 sum, in a fixed order, of the attention row, then each
mixer's conv row and recurrent row. ``RecurrentWorld.target.law()`` gives the float64 softmax of
exactly those float32 logits at every composite state, so ``exactcheck.stats.laws
.policy_sequence_law`` enumerates the law of every continuation in float64 (a composite state is
one integer, a mixed-radix code of the hash, the windows and the recurrent states).

``RecurrentLMForCausalLM`` is the same model as a transformers ``PreTrainedModel`` +
``GenerationMixin`` whose cache is transformers' hybrid ``DynamicCache(config=...)``: layer 0 a
full-attention layer (the (token, position) record), then ``LinearAttentionLayer``s holding
``conv_states`` and ``recurrent_states`` per mixer, updated through their own API
(``update_conv_state``, ``update_recurrent_state`` with the per-position states of a multi-token
call, so that ``activate_past_recording`` + ``crop`` can roll them back). transformers' own
``generate`` (assisted generation, prompt lookup) runs on it, as does any generator that follows
transformers' cache API. With ``record(log)`` every forward call is recorded with the state the
model read for each mixer of each row (``RecurrentForwardCall``), for the state invariants of
``exactcheck.recurrent.invariants``.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from toy_models.hf_toy_lm import ForwardCall, ModelWorld, ToyLMConfig, ToyLMForCausalLM

__all__ = ["Mixer", "RecurrentToyLM", "RecurrentWorld", "RecurrentModelWorld", "RecurrentLMConfig",
           "RecurrentLMForCausalLM", "RecurrentForwardCall", "MixerState", "make_recurrent_world", "recurrent_worlds",
           "fresh_states"]


@dataclass(frozen=True)
class Mixer:
    """One recurrent mixer: linear layer ``layer`` (1-based, as the cache numbers it), state index
    ``index`` within it, a conv window of ``width`` tokens and a recurrence over ``size`` states
    (prime) with per-token ``gate`` (units mod size) and ``shift``, starting from ``h0``."""

    layer: int
    index: int
    width: int
    size: int
    gate: tuple[int, ...]
    shift: tuple[int, ...]
    h0: int

    def step(self, h: int, token: int) -> int:
        return (self.gate[token] * h + self.shift[token]) % self.size

    def window_code(self, window: tuple[int, ...], vocab: int) -> int:
        """The code of a window of stored values (token + 1; 0 = empty), oldest first."""
        code = 0
        for value in window:
            code = code * (vocab + 1) + value
        return code

    def feed(self, window: list[int], h: int, tokens: list[int], vocab: int) -> tuple[list[int], list[int]]:
        """The window code and the recurrent state after each of ``tokens``, from ``window``
        (stored values, oldest first) and state ``h``."""
        codes, states = [], []
        window = tuple(window)
        for x in tokens:
            window, h = window[1:] + (x + 1,), self.step(h, x)
            codes.append(self.window_code(window, vocab))
            states.append(h)
        return codes, states


@dataclass(frozen=True)
class MixerState:
    """What one mixer holds: its window (stored values, oldest first) and its recurrent state."""

    window: tuple[int, ...]
    h: int


def fresh_states(mixers: tuple[Mixer, ...], tokens) -> tuple[MixerState, ...]:
    """Every mixer's state after ``tokens`` from the start (a fresh recurrence, nothing cached)."""
    out = []
    for m in mixers:
        window, h = (0,) * m.width, m.h0
        for x in tokens:
            window, h = window[1:] + (int(x) + 1,), m.step(h, int(x))
        out.append(MixerState(window, h))
    return tuple(out)


@dataclass(frozen=True, eq=False)
class RecurrentToyLM:
    """The logit tables of one hybrid toy model (float32): ``attention[S, V]``, and per mixer
    ``conv[(V+1)**width, V]`` and ``recurrent[size, V]``. Compared by identity."""

    attention: torch.Tensor
    conv: tuple[torch.Tensor, ...]
    recurrent: tuple[torch.Tensor, ...]
    mixers: tuple[Mixer, ...]

    @property
    def vocab_size(self) -> int:
        return self.attention.shape[1]

    @property
    def num_states(self) -> int:
        return self.attention.shape[0]

    def logits(self, s: int, states: tuple[MixerState, ...]) -> np.ndarray:
        """The float32 logits at hash ``s`` and mixer states, summed in the model's order."""
        vocab = self.vocab_size
        total = self.attention[s].numpy().astype(np.float32).copy()
        for m, state, conv, rec in zip(self.mixers, states, self.conv, self.recurrent):
            total = (total + conv[m.window_code(state.window, vocab)].numpy()).astype(np.float32)
            total = (total + rec[state.h].numpy()).astype(np.float32)
        return total

    def law(self) -> "_Rows":
        """Every composite state's float64 row (the softmax of the float32 logits), computed when
        asked (``policy_sequence_law`` indexes it by state)."""
        return _Rows(self)


class _Rows:
    def __init__(self, model: RecurrentToyLM):
        self.model = model
        self.codec = _Codec(model.mixers, model.vocab_size, model.num_states)
        self.cache: dict[int, np.ndarray] = {}

    def __getitem__(self, state) -> np.ndarray:
        state = int(state)
        row = self.cache.get(state)
        if row is None:
            s, states = self.codec.decode(state)
            logits = self.model.logits(s, states).astype(np.float64)
            row = np.exp(logits - logits.max())
            row = self.cache[state] = row / row.sum()
        return row


@dataclass(frozen=True)
class _Codec:
    """Composite state <-> one integer (mixed radix: the hash, then each mixer's window and state)."""

    mixers: tuple[Mixer, ...]
    vocab: int
    hashes: int

    def encode(self, s: int, states: tuple[MixerState, ...]) -> int:
        code = 0
        for m, state in reversed(list(zip(self.mixers, states))):
            code = (code * m.size + state.h) * (self.vocab + 1) ** m.width + m.window_code(state.window, self.vocab)
        return code * self.hashes + s

    def decode(self, code: int) -> tuple[int, tuple[MixerState, ...]]:
        s, code = code % self.hashes, code // self.hashes
        states = []
        for m in self.mixers:
            radix = (self.vocab + 1) ** m.width
            window_code, code = code % radix, code // radix
            h, code = code % m.size, code // m.size
            window = []
            for _ in range(m.width):
                window.append(window_code % (self.vocab + 1))
                window_code //= self.vocab + 1
            states.append(MixerState(tuple(reversed(window)), h))
        return s, tuple(states)


@dataclass(frozen=True)
class RecurrentWorld:
    """A target and a draft hybrid toy model (same mixers, different tables) from the composite
    state ``prompt_state`` (after the prompt) for ``length`` new tokens, drafting up to
    ``draft_length`` per round. Duck-compatible with ``ContextWorld`` where the laws read it."""

    name: str
    description: str
    target: RecurrentToyLM
    draft: RecurrentToyLM
    prompt_state: int
    length: int
    draft_length: int
    shared_vocabulary: bool = True
    prompt_tokens: tuple[int, ...] | None = None

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def mixers(self) -> tuple[Mixer, ...]:
        return self.target.mixers

    @property
    def codec(self) -> _Codec:
        return _Codec(self.mixers, self.vocab_size, self.target.num_states)

    def next_state(self, state, token):
        """The composite state after appending ``token`` (integers)."""
        s, states = self.codec.decode(int(state))
        token = int(token)
        s = (s * self.vocab_size + token + 1) % self.target.num_states
        states = tuple(MixerState(st.window[1:] + (token + 1,), m.step(st.h, token))
                       for m, st in zip(self.mixers, states))
        return self.codec.encode(s, states)

    def state_after(self, tokens, initial_hash: int = 0) -> int:
        s = initial_hash
        for x in tokens:
            s = (s * self.vocab_size + int(x) + 1) % self.target.num_states
        return self.codec.encode(s, fresh_states(self.mixers, tokens))


# --- the transformers model ---------------------------------------------------------------

class RecurrentLMConfig(ToyLMConfig):
    model_type = "exactcheck_recurrent_toy_lm"

    def __init__(self, vocab_size: int = 3, num_states: int = 1, initial_state: int = 0, linear_layers: int = 1,
                 number_of_conv_states: int = 1, mixers: list | None = None, **kwargs):
        super().__init__(vocab_size=vocab_size, num_states=num_states, initial_state=initial_state, **kwargs)
        self.linear_layers = linear_layers
        self.number_of_conv_states = number_of_conv_states
        self.mixers = mixers or []  # dataclasses.asdict of each Mixer
        self.num_hidden_layers = 1 + linear_layers
        self.layer_types = ["full_attention"] + ["linear_attention"] * linear_layers


@dataclass(frozen=True)
class RecurrentForwardCall(ForwardCall):
    """A ``ForwardCall`` with, per row of the batch, the tokens its KV record held and the state
    each mixer read (``states[row][mixer]``; None where the layer had no state yet: the start)."""

    row_tokens: tuple[tuple[int, ...], ...] = ()
    states: tuple[tuple[MixerState | None, ...], ...] = ()


class RecurrentLMForCausalLM(ToyLMForCausalLM):
    """A ``RecurrentToyLM`` as a causal LM over transformers' hybrid cache; see the module docstring."""

    config_class = RecurrentLMConfig

    def __init__(self, config: RecurrentLMConfig, toy: RecurrentToyLM | None = None, role: str = "model"):
        super().__init__(config, torch.ones(config.num_states, config.vocab_size), role=role)
        if toy is None:
            raise ValueError("RecurrentLMForCausalLM is built from a RecurrentToyLM (toy_models.recurrent_lm)")
        self.register_buffer("attention", toy.attention.clone(), persistent=True)
        self.conv_tables = nn.ParameterList([nn.Parameter(t.clone(), requires_grad=False) for t in toy.conv])
        self.recurrent_tables = nn.ParameterList([nn.Parameter(t.clone(), requires_grad=False) for t in toy.recurrent])
        self.mixers = toy.mixers
        self.toy = toy

    def new_cache(self):
        """An empty hybrid cache of this model (what ``generate`` makes from the config)."""
        from transformers import DynamicCache
        return DynamicCache(config=self.config)

    def _mixer_layer(self, cache, m: Mixer):
        from transformers.cache_utils import LinearAttentionLayer
        layer = cache.layers[m.layer] if len(cache.layers) > m.layer else None
        if not isinstance(layer, LinearAttentionLayer):
            raise TypeError(f"{type(self).__name__} keeps a recurrent state per linear-attention layer: it needs "
                            "transformers' hybrid cache, DynamicCache(config=model.config) (model.new_cache()), "
                            f"not {type(cache).__name__} with layers {[type(x).__name__ for x in cache.layers]}")
        return layer

    def _read(self, layer, m: Mixer, batch: int, device) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The window [B, width] (stored values) and state [B] the mixer continues from."""
        started = layer.has_previous_state[m.index] and layer.is_conv_states_initialized[m.index]
        if started:
            window = layer.conv_states[m.index][:, 0, -m.width:].round().long()
            if window.shape[1] < m.width:
                window = torch.nn.functional.pad(window, (m.width - window.shape[1], 0))
            h = layer.recurrent_states[m.index][:, 0].round().long()
        else:
            window = torch.zeros((batch, m.width), dtype=torch.int64, device=device)
            h = torch.full((batch,), m.h0, dtype=torch.int64, device=device)
        return window, h, started

    # -- what a generator over a stateful model may do with its cache (the toy's "kernels") ------
    def crop_kv(self, cache, keep: int) -> None:
        """Crop the attention layer's KV record to ``keep`` entries (the linear layers untouched:
        their states cannot be cropped; a generator restores, recomputes or selects them)."""
        extra = cache.layers[0].get_seq_length() - keep if cache.layers[0].is_initialized else 0
        if extra > 0:
            cache.layers[0].crop(-extra)

    def read_states(self, cache, batch: int = 1):
        """Every mixer's (window [B, width], h [B]) as the cache holds them now (copies)."""
        device = self.attention.device
        return [tuple(x.clone() for x in self._read(self._mixer_layer(cache, m), m, batch, device)[:2])
                for m in self.mixers]

    def write_states(self, cache, states) -> None:
        """Set every mixer's state (``read_states``' form) into the cache's linear layers."""
        for m, (window, h) in zip(self.mixers, states):
            layer = self._mixer_layer(cache, m)
            layer.conv_states[m.index] = window.float()[:, None, :].clone()
            layer.recurrent_states[m.index] = h.float()[:, None].clone()
            layer.is_conv_states_initialized[m.index] = layer.is_recurrent_states_initialized[m.index] = True
            layer.has_previous_state[m.index] = True
            layer.conv_kernel_size[m.index] = m.width
            if layer.device is None:
                layer.device, layer.dtype = window.device, torch.float32

    def state_table(self, states, tokens: torch.Tensor, gates: torch.Tensor | None = None):
        """The per-position state table of feeding ``tokens`` [B, n] from ``states``
        (``read_states``' form), as a speculative kernel writes it: column j = every mixer's state
        after ``tokens[:, :j+1]``. ``gates`` [B, n, mixers] replaces each position's gate (the
        caller gathers them, as vLLM's does; None: the token's own)."""
        device = tokens.device
        columns = []
        current = [(w.clone(), h.clone()) for w, h in states]
        for t in range(tokens.shape[1]):
            x = tokens[:, t]
            step = []
            for i, (m, (window, h)) in enumerate(zip(self.mixers, current)):
                gate = torch.tensor(m.gate, device=device)[x] if gates is None else gates[:, t, i]
                shift = torch.tensor(m.shift, device=device)[x]
                step.append((torch.cat([window[:, 1:], (x + 1)[:, None]], 1), (gate * h + shift) % m.size))
            current = step
            columns.append(step)
        return columns

    def gates_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] tokens -> [..., mixers] the gate of each mixer at each token."""
        return torch.stack([torch.tensor(m.gate, device=tokens.device)[tokens] for m in self.mixers], -1)

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask=None,
                position_ids: torch.LongTensor | None = None, cache=None, use_cache: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, past_key_values=None, **kwargs):
        from exactcheck.contracts.transformers_compat import causal_lm_output, given_cache
        cache = given_cache(cache, past_key_values)
        if input_ids is None:
            raise ValueError("RecurrentLMForCausalLM takes input_ids only")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None:
            cache = self.new_cache()  # a call without a cache still runs the recurrence from the start
            use_cache_given = use_cache
            use_cache = True
        else:
            use_cache_given = use_cache
        past = cache.get_seq_length()
        batch, n = input_ids.shape
        device = input_ids.device
        if past:
            held = cache.layers[0].keys[:, 0].round().long()
            cached_tokens, cached_positions = held[..., 0], held[..., 1]
        else:
            cached_tokens = cached_positions = input_ids.new_zeros((batch, 0))
        given = position_ids
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=device)[None].expand(batch, n)
        if not cache.layers:  # an empty DynamicCache() (made without the config) takes this model's layers
            cache.layers.extend(self.new_cache().layers)
        reads = [(m, self._mixer_layer(cache, m)) for m in self.mixers]
        read = [(m, layer, *self._read(layer, m, batch, device)) for m, layer in reads]
        now = [(window.tolist(), h.tolist()) for _, _, window, h, _ in read]  # each mixer's, as integers
        if self.calls is not None:
            rows = cached_tokens.tolist()
            states = tuple(tuple(MixerState(tuple(windows[b]), hs[b]) if started else None
                                 for (windows, hs), (*_, started) in zip(now, read)) for b in range(batch))
            self.calls.append(RecurrentForwardCall(
                self.role, tuple(rows[0]), tuple(cached_positions[0].tolist()),
                tuple(input_ids[0].tolist()), None if given is None else tuple(given[0].tolist()),
                row_tokens=tuple(map(tuple, rows)), states=states))
        prefix = torch.cat([cached_tokens, input_ids], 1)
        hashes = self.state_after(prefix, past)
        logits = self.attention[hashes]  # [B, n, V] float32
        vocab = self.config.vocab_size
        updates = []
        tokens = input_ids.tolist()
        for (m, layer, *_), (windows, starts), conv, rec in zip(read, now, self.conv_tables, self.recurrent_tables):
            fed = [m.feed(w, s, row, vocab) for w, s, row in zip(windows, starts, tokens)]
            codes = torch.tensor([c for c, _ in fed], dtype=torch.int64, device=device).reshape(batch, n)
            hs = torch.tensor([s for _, s in fed], dtype=torch.int64, device=device).reshape(batch, n)
            logits = logits + conv[codes]
            logits = logits + rec[hs]
            updates.append((m, layer, input_ids, hs.unbind(1)))
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        if use_cache:
            record = torch.stack([input_ids.float(), position_ids.float()], -1)[:, None]
            cache.update(record, record.clone(), 0)
            for m, layer, tokens, hs in updates:
                layer.update_conv_state((tokens + 1).float()[:, None, :], state_idx=m.index, conv_kernel_size=m.width)
                states = [x.float()[:, None] for x in hs]
                layer.update_recurrent_state(states if len(states) > 1 else states[0], state_idx=m.index)
        return causal_lm_output(logits, cache if use_cache_given else None)


def _model(toy: RecurrentToyLM, role: str) -> RecurrentLMForCausalLM:
    from transformers import GenerationConfig
    config = RecurrentLMConfig(vocab_size=toy.vocab_size, num_states=toy.num_states, initial_state=0,
                               linear_layers=max(m.layer for m in toy.mixers),
                               number_of_conv_states=max(m.index for m in toy.mixers) + 1,
                               mixers=[dataclasses.asdict(m) for m in toy.mixers])
    model = RecurrentLMForCausalLM(config, toy, role=role).eval()
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0, bos_token_id=None,
                                               top_k=None, top_p=None)
    return model


@dataclass(frozen=True)
class RecurrentModelWorld(ModelWorld):
    """A ``RecurrentWorld`` as two transformers models with hybrid caches and a prompt."""

    @property
    def description(self) -> str:
        return f"{self.world.description}; transformers models with a hybrid cache, prompt {list(self.prompt)}"

    @property
    def mixers(self) -> tuple[Mixer, ...]:
        return self.world.mixers

    def models(self):
        return _model(self.world.target, "target"), _model(self.world.draft, "draft")


def _mixers(rng, vocab: int, shape: tuple[tuple[int, int, int, int], ...]) -> tuple[Mixer, ...]:
    out = []
    for layer, index, width, size in shape:
        gate = tuple(int(g) for g in rng.integers(1, size, vocab))  # units: size is prime
        shift = tuple(int(b) for b in rng.integers(0, size, vocab))
        out.append(Mixer(layer, index, width, size, gate, shift, int(rng.integers(size))))
    return tuple(out)


def make_recurrent_world(name: str, vocab: int, hashes: int, mixers: tuple[tuple[int, int, int, int], ...],
                         length: int, draft_length: int, noise: float, seed: int, prompt_length: int,
                         scale: float = 1.0, recurrent_scale: float = 1.5) -> RecurrentModelWorld:
    """Random tables: attention logits N(0, scale), conv N(0, scale), recurrent N(0,
    recurrent_scale) (the state's weight in the law); the draft's tables are the target's plus
    N(0, noise). ``mixers``: (linear layer, state index, window width, prime state count)."""
    rng = np.random.default_rng(seed)
    shape = _mixers(rng, vocab, mixers)

    def tables(base=None):
        def draw(rows, sd):
            return rng.normal(0.0, sd, (rows, vocab))
        attention = draw(hashes, scale)
        conv = [draw((vocab + 1) ** m.width, scale) for m in shape]
        rec = [draw(m.size, recurrent_scale) for m in shape]
        if base is not None:
            attention = base[0] + noise * attention / scale
            conv = [b + noise * c / scale for b, c in zip(base[1], conv)]
            rec = [b + noise * r / recurrent_scale for b, r in zip(base[2], rec)]
        return attention, conv, rec

    def f32(t):
        return torch.tensor(t, dtype=torch.float32)

    target_tables = tables()
    draft_tables = tables(target_tables)
    target = RecurrentToyLM(f32(target_tables[0]), tuple(map(f32, target_tables[1])), tuple(map(f32, target_tables[2])),
                            shape)
    draft = RecurrentToyLM(f32(draft_tables[0]), tuple(map(f32, draft_tables[1])), tuple(map(f32, draft_tables[2])),
                           shape)
    prompt = tuple(int(x) for x in rng.integers(vocab, size=prompt_length))
    layers = max(m.layer for m in shape)
    states = max(m.index for m in shape) + 1
    description = (f"hybrid toy LM, V={vocab}, attention hash mod {hashes}, {layers} linear-attention layer(s) x "
                   f"{states} state(s) (conv widths {[m.width for m in shape]}, recurrent states "
                   f"{[m.size for m in shape]}), L={length}, k<={draft_length}, draft noise {noise}")
    world = RecurrentWorld(name, description, target, draft, 0, length, draft_length)
    world = dataclasses.replace(world, prompt_state=world.state_after(prompt))
    return RecurrentModelWorld(name, world, prompt)


@functools.lru_cache(maxsize=1)
def recurrent_worlds() -> tuple[RecurrentModelWorld, ...]:
    """The built-in recurrent-state worlds: two linear-attention layers of one state each (the
    Qwen3-Next / Mamba hybrid shape), and one layer of two states (transformers'
    ``number_of_conv_states`` = 2, the shape of its Inkling models)."""
    return (
        make_recurrent_world("rec_v3_l4_k3", vocab=3, hashes=13, mixers=((1, 0, 2, 5), (2, 0, 3, 7)), length=4,
                             draft_length=3, noise=0.6, seed=71, prompt_length=5),
        make_recurrent_world("rec2_v4_l3_k2", vocab=4, hashes=11, mixers=((1, 0, 2, 5), (1, 1, 2, 3)), length=3,
                             draft_length=2, noise=0.8, seed=72, prompt_length=5),
    )
