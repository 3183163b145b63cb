"""The context toy LMs as transformers models with real cache objects, and a cache probe.

``ToyLMForCausalLM`` is a ``PreTrainedModel`` + ``GenerationMixin`` whose next-token row is the
row of a ``ToyLM`` at the rolling-hash state of the whole prefix. transformers' own ``generate``
(greedy, sampling, assisted generation, prompt lookup) runs on it unchanged, yet the law of every
continuation is still the enumerable ``ContextWorld.sequence_law``.

The model keeps no hidden state of its own: the prefix it conditions on is whatever its cache
holds followed by the ``input_ids`` of the call. The cache is a transformers ``DynamicCache``
whose single layer stores, per cached position, the token id and the position id it was given
(as keys; values mirror them). A generator that leaves a rejected token in the cache, skips or
repeats a position, or forgets to trim the draft's cache therefore gets wrong rows, exactly as a
real transformer with a stale KV cache would, and the recorded calls (``ForwardCall``) show
which invariant broke (``exactcheck.generation.cache_invariants``).
"""
from __future__ import annotations

from dataclasses import dataclass

import dataclasses
import functools

import torch
from torch import nn
from transformers import DynamicCache, GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from exactcheck.contracts.transformers_compat import causal_lm_output, given_cache

from toy_models.context_lm import ContextWorld, ToyLM, make_context_world

__all__ = ["ToyLMConfig", "ToyLMForCausalLM", "ForwardCall", "ModelWorld", "model_pair", "prompt_for_state",
           "model_worlds"]


class ToyLMConfig(PretrainedConfig):
    model_type = "exactcheck_toy_lm"

    def __init__(self, vocab_size: int = 3, num_states: int = 1, initial_state: int = 0, **kwargs):
        self.vocab_size = vocab_size
        self.num_states = num_states
        self.initial_state = initial_state
        self.num_hidden_layers = 1  # one cache layer: the (token, position) record
        self.use_cache = kwargs.pop("use_cache", True)
        super().__init__(**kwargs)


@dataclass(frozen=True)
class ForwardCall:
    """One forward call as the model saw it: the tokens and position ids its cache held before
    the call, the new ``input_ids`` and the position ids they were given (``None`` when the
    caller gave none and the model counted on from the cache length)."""

    role: str
    cached_tokens: tuple[int, ...]
    cached_positions: tuple[int, ...]
    input_tokens: tuple[int, ...]
    input_positions: tuple[int, ...] | None


class ToyLMForCausalLM(PreTrainedModel, GenerationMixin):
    """A ``ToyLM`` as a causal LM: logits ``log(table[state(prefix)])`` in float32."""

    config_class = ToyLMConfig
    config: ToyLMConfig
    main_input_name = "input_ids"
    _supports_cache_class = True

    def __init__(self, config: ToyLMConfig, table: torch.Tensor | None = None, role: str = "model"):
        super().__init__(config)
        if table is None:
            table = torch.full((config.num_states, config.vocab_size), 1.0 / config.vocab_size)
        self.register_buffer("table", table.to(torch.float32).clone(), persistent=True)
        # generate() wants a module with parameters for device/dtype; it takes no part in the rows
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)
        self.role = role
        self.calls: list[ForwardCall] | None = None  # set to [] to record every forward call
        self.post_init()

    def _init_weights(self, module):  # rows come from the ToyLM, nothing to initialise
        pass

    def get_input_embeddings(self):
        return None

    def token_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The token ids the call conditions on (a subclass reads them through its embedding)."""
        return input_ids

    def logits_at(self, states: torch.Tensor) -> torch.Tensor:
        """[B, T] states -> [B, T, V] logits (a subclass computes them with an LM head)."""
        return self.table[states].log()

    def record(self, enabled: bool = True) -> None:
        self.calls = [] if enabled else None

    def state_after(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """[B, T] tokens -> [B, T - start] rolling-hash states after each prefix longer than
        ``start`` tokens (int64; computed with Python integers, which give the same values as
        int64 tensors at a fraction of the cost of one tensor operation per position)."""
        vocab, states = self.config.vocab_size, self.config.num_states
        rows = []
        for row in tokens.tolist():
            s, after = self.config.initial_state, []
            for x in row:
                s = (s * vocab + x + 1) % states
                after.append(s)
            rows.append(after[start:])
        return torch.tensor(rows, dtype=torch.int64, device=tokens.device).reshape(tokens.shape[0],
                                                                                   tokens.shape[1] - start)

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask=None,
                position_ids: torch.LongTensor | None = None, cache=None, use_cache: bool | None = None,
                logits_to_keep: int | torch.Tensor = 0, past_key_values=None,
                **kwargs) -> CausalLMOutputWithPast:
        cache = given_cache(cache, past_key_values)  # the name differs across transformers releases
        if input_ids is None:
            raise ValueError("ToyLMForCausalLM takes input_ids only")
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        input_ids = self.token_ids(input_ids)
        batch, n = input_ids.shape
        if past:
            held = cache.layers[0].keys[:, 0].round().long()  # [B, past, 2]: (token, position)
            cached_tokens, cached_positions = held[..., 0], held[..., 1]
        else:
            cached_tokens = input_ids.new_zeros((batch, 0))
            cached_positions = input_ids.new_zeros((batch, 0))
        given = position_ids
        if position_ids is None:
            position_ids = torch.arange(past, past + n, device=input_ids.device)[None].expand(batch, n)
        if self.calls is not None:
            self.calls.append(ForwardCall(
                self.role, tuple(cached_tokens[0].tolist()), tuple(cached_positions[0].tolist()),
                tuple(input_ids[0].tolist()), None if given is None else tuple(given[0].tolist())))
        prefix = torch.cat([cached_tokens, input_ids], 1)
        states = self.state_after(prefix, past)
        logits = self.logits_at(states)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        if cache is not None and use_cache:
            record = torch.stack([input_ids.float(), position_ids.float()], -1)[:, None]  # [B,1,n,2]
            cache.update(record, record.clone(), 0)
        return causal_lm_output(logits, cache if use_cache else None)


def _model(toy: ToyLM, initial_state: int, role: str) -> ToyLMForCausalLM:
    config = ToyLMConfig(vocab_size=toy.vocab_size, num_states=toy.num_states,
                         initial_state=initial_state)
    model = ToyLMForCausalLM(config, toy.table, role=role).eval()
    # no EOS, no padding surprises, and no default top-k/top-p truncating the toy vocabulary
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0, bos_token_id=None,
                                               top_k=None, top_p=None)
    return model


def model_pair(world: ContextWorld, initial_state: int = 0) -> tuple[ToyLMForCausalLM, ToyLMForCausalLM]:
    """(target, draft) transformers models of ``world``'s two toy LMs, starting from
    ``initial_state`` before the prompt."""
    return _model(world.target, initial_state, "target"), _model(world.draft, initial_state, "draft")


def prompt_for_state(world: ContextWorld, length: int, seed: int, initial_state: int = 0) -> tuple[list[int], int]:
    """A random prompt of ``length`` tokens and the rolling-hash state it leads to."""
    g = torch.Generator().manual_seed(seed)
    allowed = world.prompt_tokens
    if allowed is None:
        prompt = torch.randint(world.vocab_size, (length,), generator=g).tolist()
    else:  # a world whose prompts avoid some tokens (a tokenizer world's special tokens)
        prompt = [allowed[i] for i in torch.randint(len(allowed), (length,), generator=g).tolist()]
    state = initial_state
    for x in prompt:
        state = int(world.next_state(state, x))
    return prompt, state


@dataclass(frozen=True)
class ModelWorld:
    """A ``ContextWorld`` presented as two transformers models and a prompt of real token ids:
    the world's ``prompt_state`` is the state the prompt leads to, so the enumerated sequence
    law is the law of the first ``length`` generated tokens. A world with its own ``policy``
    (``toy_models.grammar``) is always generated under it."""

    name: str
    world: ContextWorld
    prompt: tuple[int, ...]
    policy: object = None  # a DecodingPolicy the world must be generated under (a grammar's mask)
    validate: object = None  # outputs -> bool: every output must pass (a grammar's validity)
    max_new_tokens: int | None = None  # default: length (a stop-token world leaves room past the stop)
    # extra laws checked on outputs: (name, description, output tuple -> hashable cell)
    marginals: tuple = ()
    # what ``validate`` asks of an output, in the validity verdict's words
    validity: str = "every output parses as JSON of the schema and ends with the stop token"

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or self.world.length

    @property
    def description(self) -> str:
        return f"{self.world.description}; transformers models, prompt {list(self.prompt)}"

    @property
    def length(self) -> int:
        return self.world.length

    @property
    def vocab_size(self) -> int:
        return self.world.vocab_size

    def models(self) -> tuple[ToyLMForCausalLM, ToyLMForCausalLM]:
        return model_pair(self.world)

    @property
    def shared_vocabulary(self) -> bool:
        """Whether target and draft share one vocabulary (a tokenizer world's do not)."""
        return self.world.shared_vocabulary

    def generator_keywords(self) -> dict:
        """Keyword arguments every generator call in this world gets besides the contract's
        positional ones (a tokenizer world: ``target_tokenizer`` and ``draft_tokenizer``)."""
        return {}

    def prompt_ids(self) -> torch.Tensor:
        return torch.tensor([self.prompt], dtype=torch.int64)


def _model_world(name: str, vocab: int, num_states: int, length: int, draft_length: int,
                 agreement: float, seed: int, prompt_length: int) -> ModelWorld:
    world = make_context_world(name, vocab, num_states, length, draft_length, agreement, seed)
    prompt, state = prompt_for_state(world, prompt_length, seed)
    return ModelWorld(name, dataclasses.replace(world, prompt_state=state), tuple(prompt))


@functools.lru_cache(maxsize=1)
def model_worlds() -> tuple[ModelWorld, ...]:
    """The built-in end-to-end worlds: small enough that a few thousand generations through
    transformers' generate loop (about 8 ms each here) test the whole sequence law."""
    return (
        _model_world("hf_v3_l4_k3", vocab=3, num_states=13, length=4, draft_length=3, agreement=0.5,
                     seed=31, prompt_length=6),
        _model_world("hf_v4_l3_k2", vocab=4, num_states=17, length=3, draft_length=2, agreement=0.3,
                     seed=32, prompt_length=6),
    )
