"""The real model pairs by name (``exactcheck greedy --model``, ``exactcheck cost --model``): the
random tiny Llama and GPT-2 pairs, SmolLM2 with its first layers as the draft
(``toy_models.real_models``), and the tiny hybrids (``toy_models.hybrid_models``), each with its
prompts as token ids."""
from __future__ import annotations

import torch

from toy_models.real_models import first_layers_draft, smollm2, tiny_gpt2_pair, tiny_llama_pair

__all__ = ["model_pair", "hybrid_model_names", "SMOLLM2_PROMPTS", "SMOLLM2_DRAFT_LAYERS"]

SMOLLM2_DRAFT_LAYERS = 4

SMOLLM2_PROMPTS = (
    "The capital of France is", "Water boils at a temperature of", "The three primary colours are",
    "Once upon a time, in a small village,", "def fibonacci(n):", "The main difference between a cat and a dog is",
    "To make a cup of tea, first", "The largest planet in the solar system is", "In 1969, the first person to",
    "A haiku about the sea:", "The square root of 144 is", "Photosynthesis is the process by which",
    "The best way to learn a new language is", "import numpy as np\n", "The opposite of hot is",
    "My favourite book is", "The speed of light is approximately", "Here is a list of fruits: apple,",
    "The French word for cat is", "Machine learning is", "The human heart has", "SELECT * FROM users WHERE",
    "The Great Wall of China was built", "Q: What is 7 times 8?\nA:",
)


def hybrid_model_names() -> dict[str, str]:
    """``tiny-<architecture>`` (underscores as dashes) -> architecture, for every hybrid
    architecture that builds here (``toy_models.hybrid_models.BUILDS_HERE``)."""
    from toy_models.hybrid_models import BUILDS_HERE
    return {"tiny-" + arch.replace("_", "-"): arch for arch in BUILDS_HERE}


def model_pair(name: str, seed: int = 0):
    """(target, draft, prompts as [P] id tensors) for a real model name: ``tiny-llama``, ``tiny-gpt2``,
    ``smollm2`` or a tiny hybrid ``tiny-<architecture>``; ``KeyError`` naming the known ones otherwise."""
    if name.startswith("tiny-") and name in hybrid_model_names():
        from toy_models import hybrid_models
        target, draft = hybrid_models.hybrid_pair(hybrid_model_names()[name], seed=seed)
        return target, draft, hybrid_models.hybrid_prompts(target.config.vocab_size, 24, seed)
    if name in ("tiny-llama", "tiny-gpt2"):
        make = tiny_llama_pair if name == "tiny-llama" else tiny_gpt2_pair
        target, draft = make(seed=seed)
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(target.config.vocab_size, (int(torch.randint(4, 12, (1,), generator=g)),),
                                 generator=g) for _ in range(24)]
        return target, draft, prompts
    if name == "smollm2":
        target, tokenizer = smollm2()
        draft = first_layers_draft(target, SMOLLM2_DRAFT_LAYERS)
        prompts = [tokenizer(text, return_tensors="pt").input_ids[0] for text in SMOLLM2_PROMPTS]
        return target, draft, prompts
    raise KeyError(f"unknown model {name!r}; known: {['tiny-llama', 'tiny-gpt2', 'smollm2'] + sorted(hybrid_model_names())}")
