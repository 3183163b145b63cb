"""Worlds where the draft and the target share no vocabulary: two tokenizers over one alphabet.

Each world has two BPE tokenizers built locally with the ``tokenizers`` library (wrapped as
transformers' ``PreTrainedTokenizerFast``; nothing is downloaded) and a context LM on each side:

- shared tokens whose ids differ between the vocabularies ("a" is target 2, draft 0);
- draft-only tokens ("bb") and target-only tokens ("ca", "abc");
- merges that spell one string two ways ("ab" is one token or "a" + "b"; plain target sampling
  produces the non-canonical spelling too, so the law is over target *token* sequences);
- ids assigned out of alphabetical order, and ``get_vocab()`` iterating in alphabetical order, not
  id order (a real fast tokenizer's ``get_vocab()`` iterates in its hash map's order, a new one on
  every call; a fixed order other than id order is one of those orders, and keeps every verdict
  reproducible: an implementation that depends on the order then sees the same one every call);
- special-token sets that differ (the target's ``<|t_end|>``, the draft's ``<|d_end|>``; the stop
  world's ``<eos>`` is in both at different ids).

The exact law is the target's law of ``length`` target tokens from the prompt, enumerated in float64
(``exactcheck.generation.laws.policy_sequence_law``); the draft never enters it. Each world also has a
``text`` marginal: the law of the text those tokens spell, the law a string-level algorithm is
judged by (several token sequences spell one text). The draft LM conditions
on its own token ids (its own rolling-hash state), so an implementation must translate the
context to drive it; whatever the draft is shown, an exact implementation's output law is the
target's.

The models are ``SpelledToyLM``: a ``ToyLMForCausalLM`` whose input ids pass through an
``nn.Embedding`` (the id as its value) and whose logits come from an ``nn.Linear`` LM head over a
one-hot state, so transformers' universal speculative decoding can prune and re-index them in place
(``assistant_prune_lm_head``) as it does a real model's, and the rows stay exactly the table's.

``generator_keywords()`` builds a fresh tokenizer pair with each call: a generator call in this
world gets ``target_tokenizer=`` and ``draft_tokenizer=`` (``exactcheck.contracts.generator``).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from toy_models.context_lm import ContextWorld, ToyLM
from toy_models.hf_toy_lm import ModelWorld, ToyLMConfig, ToyLMForCausalLM

__all__ = ["Vocabulary", "SpelledToyLM", "TokenizerWorld", "tokenizer_worlds", "build_tokenizer", "spelled_text"]


@dataclass(frozen=True)
class Vocabulary:
    """A BPE vocabulary: ``tokens[i]`` is id i's string; ``merges`` in priority order; ``special``
    the tokens that are special (skipped when decoding with ``skip_special_tokens``); ``eos`` the
    tokenizer's end-of-sequence token, if any."""

    tokens: tuple[str, ...]
    merges: tuple[tuple[str, str], ...]
    special: tuple[str, ...] = ()
    eos: str | None = None

    @property
    def size(self) -> int:
        return len(self.tokens)

    def id(self, token: str) -> int:
        return self.tokens.index(token)


def build_tokenizer(vocabulary: Vocabulary):
    """A transformers ``PreTrainedTokenizerFast`` over ``vocabulary`` (a new object each call) whose
    ``get_vocab()`` iterates in alphabetical order."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    class AlphabeticalVocabTokenizer(PreTrainedTokenizerFast):
        def get_vocab(self):
            vocab = super().get_vocab()
            return {token: vocab[token] for token in sorted(vocab)}

    model = models.BPE(vocab={t: i for i, t in enumerate(vocabulary.tokens)}, merges=list(vocabulary.merges))
    backend = Tokenizer(model)
    backend.decoder = decoders.Fuse()  # tokens are joined as they are spelled
    backend.add_special_tokens(list(vocabulary.special))
    extra = {"eos_token": vocabulary.eos} if vocabulary.eos else {}
    others = [t for t in vocabulary.special if t != vocabulary.eos]
    if others:  # the name both transformers 4.57 and 5 take
        extra["additional_special_tokens"] = others
    tokenizer = AlphabeticalVocabTokenizer(tokenizer_object=backend, clean_up_tokenization_spaces=False, **extra)
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


class SpelledToyLM(ToyLMForCausalLM):
    """A ``ToyLM`` as a causal LM with an input embedding (``embed``: id -> its own value) and a
    bias-free LM head (``lm_head``: one-hot state -> ``log table[state]``), both replaceable
    through ``set_input_embeddings`` / ``set_output_embeddings`` as on a real model."""

    def __init__(self, config: ToyLMConfig, table: torch.Tensor | None = None, role: str = "model"):
        super().__init__(config, table, role)
        self.embed = nn.Embedding(config.vocab_size, 1)
        self.lm_head = nn.Linear(config.num_states, config.vocab_size, bias=False)
        with torch.no_grad():
            self.embed.weight.copy_(torch.arange(config.vocab_size, dtype=torch.float32)[:, None])
            self.lm_head.weight.copy_(self.table.log().T)
        self.embed.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def token_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = self.embed(input_ids)[..., 0].round().long()
        if ids.shape != input_ids.shape:
            raise ValueError(f"the input embedding returned {tuple(ids.shape)} ids for {tuple(input_ids.shape)} "
                             "input ids")
        return ids

    def logits_at(self, states: torch.Tensor) -> torch.Tensor:
        if type(self.lm_head) is nn.Linear:  # its own head: the same rows as the product, by indexing
            return self.lm_head.weight.T[states]
        hot = torch.nn.functional.one_hot(states, self.config.num_states).to(self.table.dtype)
        return self.lm_head(hot)  # a head put in its place (pruned, re-indexed) is called as it is


def _spelled_model(toy: ToyLM, role: str, eos: int | None) -> SpelledToyLM:
    from transformers import GenerationConfig
    config = ToyLMConfig(vocab_size=toy.vocab_size, num_states=toy.num_states, initial_state=0,
                         tie_word_embeddings=False)
    model = SpelledToyLM(config, toy.table, role=role).eval()
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0 if eos is None else eos,
                                               bos_token_id=None, top_k=None, top_p=None)
    return model


@dataclass(frozen=True)
class TokenizerWorld(ModelWorld):
    """A ``ModelWorld`` whose draft has its own vocabulary and tokenizer: ``world`` holds the
    target ``ToyLM`` (its law) and the draft ``ToyLM`` over ``draft_vocabulary``."""

    target_vocabulary: Vocabulary = None
    draft_vocabulary: Vocabulary = None
    features: str = ""

    @property
    def description(self) -> str:
        return (f"two tokenizers: target V={self.target_vocabulary.size}, draft V={self.draft_vocabulary.size}, "
                f"{len(self.shared_tokens())} shared strings; {self.features}; context LMs, L={self.length}, "
                f"k={self.world.draft_length}; prompt {list(self.prompt)} ({self.prompt_text()!r})")

    def models(self) -> tuple[SpelledToyLM, SpelledToyLM]:
        eos_t = self.target_vocabulary.id(self.target_vocabulary.eos) if self.target_vocabulary.eos else None
        eos_d = self.draft_vocabulary.id(self.draft_vocabulary.eos) if self.draft_vocabulary.eos else None
        return (_spelled_model(self.world.target, "target", eos_t),
                _spelled_model(self.world.draft, "draft", eos_d))

    def tokenizers(self):
        """(target tokenizer, draft tokenizer), new objects each call."""
        return build_tokenizer(self.target_vocabulary), build_tokenizer(self.draft_vocabulary)

    def generator_keywords(self) -> dict:
        target_tokenizer, draft_tokenizer = self.tokenizers()
        return dict(target_tokenizer=target_tokenizer, draft_tokenizer=draft_tokenizer)

    def shared_tokens(self) -> dict[int, int]:
        """Draft id -> target id of every string both vocabularies have."""
        target = {t: i for i, t in enumerate(self.target_vocabulary.tokens)}
        return {i: target[t] for i, t in enumerate(self.draft_vocabulary.tokens) if t in target}

    def prompt_text(self) -> str:
        return "".join(self.target_vocabulary.tokens[i] for i in self.prompt)


def spelled_text(tokens: tuple[str, ...], output: tuple[int, ...]) -> str:
    """The text an output of target ids spells (special tokens by their names): the cell of the
    ``text`` law, the law a string-level algorithm is judged by."""
    return "".join(tokens[i] for i in output)


def _rows(rng, states: int, vocabulary: Vocabulary, concentration: float, special_mass: dict[str, float]) -> np.ndarray:
    """Dirichlet rows; a special token gets ``special_mass`` of every row (1e-6 when not named)."""
    rows = rng.dirichlet(np.full(vocabulary.size, concentration), size=states)
    for token in vocabulary.special:
        i = vocabulary.id(token)
        rest = rows.sum(1) - rows[:, i]
        mass = special_mass.get(token, 1e-6)
        rows[:, i] = mass * rest / (1 - mass)
    return rows / rows.sum(1, keepdims=True)


def _world(name: str, target: Vocabulary, draft: Vocabulary, target_states: int, draft_states: int, length: int,
           draft_length: int, seed: int, prompt: tuple[str, ...], features: str, stop: bool = False) -> TokenizerWorld:
    from exactcheck.contracts.policy import DecodingPolicy
    rng = np.random.default_rng(seed)
    special_mass = {target.eos: 0.12} if stop and target.eos else {}
    p = _rows(rng, target_states, target, 0.6, special_mass)
    q = _rows(rng, draft_states, draft, 0.6, {draft.eos: 0.12} if stop and draft.eos else {})

    def f32(rows):
        return torch.tensor(rows, dtype=torch.float32)

    prompt_ids = tuple(target.id(t) for t in prompt)
    plain = tuple(i for i, t in enumerate(target.tokens) if t not in target.special)  # prompts are text
    context = ContextWorld(name, "", ToyLM(f32(p)), ToyLM(f32(q)), prompt_state=0, length=length,
                           draft_length=draft_length, shared_vocabulary=False, prompt_tokens=plain)
    state = 0
    for x in prompt_ids:
        state = int(context.next_state(state, x))
    context = dataclasses.replace(context, prompt_state=state)
    policy = None
    if stop:
        policy = DecodingPolicy(stop_tokens=(target.id(target.eos),), name="stop_at_eos")
    text = ("text", "decoded text of whole outputs (a special token spelled by its name)",
            functools.partial(spelled_text, target.tokens))
    world = TokenizerWorld(name, context, prompt_ids, policy=policy, target_vocabulary=target, draft_vocabulary=draft,
                           features=features, marginals=(text,))
    return dataclasses.replace(world, world=dataclasses.replace(context, description=world.description))


@functools.lru_cache(maxsize=1)
def tokenizer_worlds() -> tuple[TokenizerWorld, ...]:
    """The built-in two-tokenizer worlds, in audit order."""
    abc_target = Vocabulary(("b", "<|t_end|>", "a", "c", "ab", "ca", "abc"),
                            (("a", "b"), ("c", "a"), ("ab", "c")), special=("<|t_end|>",))
    abc_draft = Vocabulary(("a", "c", "b", "ab", "bb", "<|d_end|>"), (("a", "b"), ("b", "b")),
                           special=("<|d_end|>",))
    abcd_target = Vocabulary(("d", "a", "<eos>", "c", "b", "ad", "da", "bc", "abc"),
                             (("a", "d"), ("d", "a"), ("b", "c"), ("a", "bc")), special=("<eos>",), eos="<eos>")
    abcd_draft = Vocabulary(("<s>", "c", "a", "d", "b", "bc", "cd", "dd", "<eos>", "ab"),
                            (("b", "c"), ("c", "d"), ("d", "d"), ("a", "b")), special=("<s>", "<eos>"), eos="<eos>")
    return (
        _world("tok_abc_l4", abc_target, abc_draft, target_states=29, draft_states=23, length=4, draft_length=3,
               seed=41, prompt=("a", "b", "ca"),
               features="shared ids permuted, draft-only bb, target-only ca and abc, ab spelled two ways, "
                        "special tokens differ"),
        _world("tok_abcd_stop", abcd_target, abcd_draft, target_states=31, draft_states=37, length=3, draft_length=2,
               seed=42, prompt=("d", "a", "bc"), stop=True,
               features="<eos> a stop token in both at different ids, draft-only <s>, cd, dd, ab, target-only ad, "
                        "da, abc"),
    )
