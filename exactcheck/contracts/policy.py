"""The decoding policy: the law a generator must sample from, computed exactly in float64.

``DecodingPolicy`` holds temperature (0 = greedy), top-k, top-p, min-p, a logit bias, banned
tokens, stop tokens and an optional state-dependent mask (``mask(prefix) -> allowed ids``, or a
bool tensor over the vocabulary, the prefix being the tokens generated so far). ``probabilities(logits, prefixes)`` turns logit rows
into the policy's law, in this order (transformers 5.x applies its processors in the same
order: processors, then your logits processors, then the sampling warpers):

0. penalties, on the model's logits, each reading the history its engine's convention reads
   (``penalty_convention``; the prompt comes from ``prompt``, which an audit binds per world with
   ``for_prompt``): the repetition penalty r divides a positive logit by r and multiplies a negative
   one by r for every token in its history (transformers' ``RepetitionPenaltyLogitsProcessor``,
   vLLM, llama.cpp); the presence and frequency penalties subtract ``presence * (count > 0) +
   frequency * count`` (OpenAI's definition, vLLM, llama.cpp). Histories:

   ============== ===================== ============================== ==========================
   convention     repetition reads      presence and frequency read    the engine
   ============== ===================== ============================== ==========================
   transformers   prompt and output     (none: transformers has none)  ``generate``
   vllm           prompt and output     output only                    vLLM's sampler
   llama.cpp      the last N tokens     the last N tokens              ``penalty_last_n`` = N
   ============== ===================== ============================== ==========================

1. logit bias added; banned tokens and tokens outside the mask set to -inf;
2. divided by the temperature;
3. top-k: tokens whose logit is below the k-th largest are removed (ties at the boundary are
   all kept, so more than k tokens can remain);
4. top-p: tokens sorted by probability, ascending (ties in token-id order); a token is removed
   when the cumulative probability up to and including it is <= 1 - top_p (at least one kept);
5. min-p: tokens with probability < min_p x the largest probability are removed;
6. softmax of what remains. Greedy: all mass on the largest remaining logit (ties: lowest id).

Stop tokens end a generation: the stop token is emitted and nothing after it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

__all__ = ["greedy_variant", "DecodingPolicy", "GREEDY", "SAMPLING", "PENALTY_CONVENTIONS"]

PENALTY_CONVENTIONS = ("transformers", "vllm", "llama.cpp")


@dataclass(frozen=True)
class DecodingPolicy:
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    banned_tokens: tuple[int, ...] = ()
    stop_tokens: tuple[int, ...] = ()
    mask: Callable[[tuple[int, ...]], Sequence[int]] | None = None
    name: str | None = None  # how checks are named (default: from the settings)
    repetition_penalty: float | None = None  # None or 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_convention: str = "transformers"  # which history each penalty reads: PENALTY_CONVENTIONS
    penalty_last_n: int = 64  # llama.cpp's window
    prompt: tuple[int, ...] = ()  # the prompt the penalties read (``for_prompt``)

    def __post_init__(self):
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be finite and >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None and not (self.repetition_penalty > 0
                                                        and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.penalty_convention not in PENALTY_CONVENTIONS:
            raise ValueError(f"penalty_convention {self.penalty_convention!r}: expected one of "
                             f"{', '.join(PENALTY_CONVENTIONS)}")
        if self.penalty_convention == "transformers" and (self.presence_penalty or self.frequency_penalty):
            raise ValueError("transformers has no presence or frequency penalty: give penalty_convention "
                             "'vllm' or 'llama.cpp'")
        if self.penalty_last_n < 1:
            raise ValueError(f"penalty_last_n must be >= 1, got {self.penalty_last_n}")

    @property
    def penalized(self) -> bool:
        """Whether a penalty is on (the law then reads each prefix's history)."""
        return (self.repetition_penalty not in (None, 1.0)) or bool(self.presence_penalty) or bool(self.frequency_penalty)

    def for_prompt(self, prompt) -> "DecodingPolicy":
        """This policy with the prompt its penalties read (unchanged without penalties)."""
        return dataclasses.replace(self, prompt=tuple(int(x) for x in prompt)) if self.penalized else self

    def histories(self, prefix: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(the tokens the repetition penalty reads, those presence and frequency read) after the
        generated ``prefix``, by the convention."""
        whole = tuple(self.prompt) + tuple(prefix)
        if self.penalty_convention == "llama.cpp":
            window = whole[-self.penalty_last_n:]
            return window, window
        return whole, tuple(prefix)  # transformers, vllm: repetition over prompt and output; the others output

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def plain(self) -> bool:
        """Sampling at temperature 1 with no transform: the model's own law."""
        return self == SAMPLING

    @property
    def transformed(self) -> bool:
        """Whether it truncates or reshapes the model's law beyond temperature: top-k, top-p,
        min-p, a logit bias, banned tokens or a penalty (a mask and stop tokens are stated apart)."""
        return (self.top_k is not None or self.top_p is not None or bool(self.min_p) or bool(self.logit_bias)
                or bool(self.banned_tokens) or self.penalized)

    def label(self) -> str:
        """A short name for check names (``sequence@<label>``)."""
        if self.name:
            return self.name
        parts = ["greedy" if self.greedy else f"t{self.temperature:g}"]
        for key, value in (("top_k", self.top_k), ("top_p", self.top_p), ("min_p", self.min_p)):
            if value is not None:
                parts.append(f"{key}{value:g}")
        if self.logit_bias:
            parts.append("bias")
        if self.banned_tokens:
            parts.append("banned")
        if self.stop_tokens:
            parts.append("stop")
        if self.mask is not None:
            parts.append("mask")
        for key, value in (("rep", self.repetition_penalty), ("pres", self.presence_penalty),
                           ("freq", self.frequency_penalty)):
            if value not in (None, 0.0, 1.0):
                parts.append(f"{key}{value:g}")
        if self.penalized and self.penalty_convention != "transformers":
            parts.append(self.penalty_convention.replace(".", "") + (f"{self.penalty_last_n}" if
                                                                       self.penalty_convention == "llama.cpp" else ""))
        return "_".join(parts)

    def spec(self) -> str | None:
        """The policy as ``exactcheck e2e --policy`` takes it ('temperature=0.7,top_k=2'), or None
        when it holds a setting the command line cannot state (bias, banned or stop tokens, a mask,
        a name)."""
        if self.logit_bias or self.banned_tokens or self.stop_tokens or self.mask is not None or self.name:
            return None
        parts = [f"temperature={self.temperature!r}"]
        parts += [f"{key}={value!r}" for key, value in (("top_k", self.top_k), ("top_p", self.top_p),
                                                      ("min_p", self.min_p)) if value is not None]
        if self.penalized:
            parts += [f"{key}={value!r}" for key, value in (
                ("repetition_penalty", self.repetition_penalty), ("presence_penalty", self.presence_penalty),
                ("frequency_penalty", self.frequency_penalty)) if value not in (None, 0.0, 1.0)]
            parts.append(f"penalty_convention={self.penalty_convention}")
            if self.penalty_convention == "llama.cpp":
                parts.append(f"penalty_last_n={self.penalty_last_n}")
        return ",".join(parts)

    @classmethod
    def parse(cls, spec: str) -> "DecodingPolicy":
        """'top_k=2,temperature=0.7' -> DecodingPolicy(temperature=0.7, top_k=2): what ``spec`` writes
        and every front end reads (``--policy``, a gate's ``policies``); ValueError naming the spec."""
        kinds = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float,
                 "presence_penalty": float, "frequency_penalty": float, "penalty_convention": str,
                 "penalty_last_n": int}
        settings = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key not in kinds:
                raise ValueError(f"policy {spec!r}: expected KEY=VALUE with KEY in {sorted(kinds)}")
            try:
                settings[key] = kinds[key](value)
            except ValueError as exc:
                raise ValueError(f"policy {spec!r}: {exc}") from None
        try:
            return cls(**settings)
        except ValueError as exc:
            raise ValueError(f"policy {spec!r}: {exc}") from None

    def code(self) -> str:
        """The Python expression that builds this policy (a mask is named by its function)."""
        fields = [f"temperature={self.temperature!r}"]
        for key in ("top_k", "top_p", "min_p", "name"):
            if getattr(self, key) is not None:
                fields.append(f"{key}={getattr(self, key)!r}")
        for key in ("logit_bias", "banned_tokens", "stop_tokens"):
            if getattr(self, key):
                fields.append(f"{key}={getattr(self, key)!r}")
        if self.mask is not None:
            fields.append(f"mask={getattr(self.mask, '__qualname__', type(self.mask).__name__)}")
        if self.penalized:
            for key in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
                if getattr(self, key) not in (None, 0.0, 1.0):
                    fields.append(f"{key}={getattr(self, key)!r}")
            fields.append(f"penalty_convention={self.penalty_convention!r}")
            if self.penalty_convention == "llama.cpp":
                fields.append(f"penalty_last_n={self.penalty_last_n!r}")
        return f"DecodingPolicy({', '.join(fields)})"

    def describe(self) -> str:
        if self.greedy and self.label() == "greedy":
            return "greedy"
        if self.plain:
            return "sampling, temperature 1"
        return "policy " + self.label()

    def probabilities(self, logits: torch.Tensor, prefixes: Sequence[tuple[int, ...]] | None = None) -> torch.Tensor:
        """The policy's law of each logit row ``[n, V]``, in float64. ``prefixes[i]`` is the
        generated prefix row i conditions on (needed only with a mask)."""
        x = self.scores(logits, prefixes)
        vocab = x.shape[-1]
        if self.greedy:
            return torch.nn.functional.one_hot(x.argmax(-1), vocab).to(torch.float64)
        x = x / self.temperature
        if self.top_k is not None and self.top_k < vocab:
            kth = x.topk(self.top_k, dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, -math.inf)
        if self.top_p is not None and self.top_p < 1:
            probs = torch.softmax(x, -1)
            order = torch.sort(probs, dim=-1, stable=True).indices  # ascending, ties by id
            cumulative = probs.gather(-1, order).cumsum(-1)
            remove_sorted = cumulative <= 1 - self.top_p
            remove_sorted[..., -1] = False
            remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
            x = x.masked_fill(remove, -math.inf)
        if self.min_p is not None and self.min_p > 0:
            probs = torch.softmax(x, -1)
            x = x.masked_fill(probs < self.min_p * probs.amax(-1, keepdim=True), -math.inf)
        return torch.softmax(x, -1)

    def penalize(self, x: torch.Tensor, prefixes: Sequence[tuple[int, ...]] | None) -> torch.Tensor:
        """Step 0: the penalties, per row by that row's history (float64 logits, in place)."""
        if prefixes is None:
            raise ValueError("a policy with penalties needs the prefix of every row")
        r = self.repetition_penalty
        for i, prefix in enumerate(prefixes):
            repeated, counted = self.histories(tuple(prefix))
            if r not in (None, 1.0) and repeated:
                ids = torch.tensor(sorted(set(repeated)), device=x.device)
                row = x[i, ids]
                x[i, ids] = torch.where(row > 0, row / r, row * r)
            if (self.presence_penalty or self.frequency_penalty) and counted:
                ids, counts = torch.unique(torch.tensor(counted, device=x.device), return_counts=True)
                x[i, ids] -= self.presence_penalty + self.frequency_penalty * counts.to(x.dtype)
        return x

    def scores(self, logits: torch.Tensor, prefixes: Sequence[tuple[int, ...]] | None = None) -> torch.Tensor:
        """Steps 0 and 1: the float64 logits penalised, the bias added and banned or masked tokens
        at -inf (what greedy decoding takes the argmax of)."""
        x = logits.to(torch.float64, copy=True)
        if self.penalized:
            x = self.penalize(x.reshape(-1, x.shape[-1]), prefixes).reshape(x.shape)
        for token, bias in self.logit_bias:
            x[..., token] += bias
        if self.banned_tokens:
            x[..., list(self.banned_tokens)] = -math.inf
        if self.mask is not None:
            if prefixes is None:
                raise ValueError("a masked policy needs the prefix of every row")
            allowed = torch.zeros_like(x, dtype=torch.bool)
            for i, prefix in enumerate(prefixes):
                ids = self.mask(tuple(prefix))
                if isinstance(ids, torch.Tensor) and ids.dtype == torch.bool:
                    allowed[i] = ids.to(allowed.device)
                else:
                    allowed[i, list(ids)] = True
            if not allowed.any(-1).all():
                raise ValueError("the mask allows no token after some prefix")
            x = x.masked_fill(~allowed, -math.inf)
        return x

    def transform(self, probs: np.ndarray, prefixes: Sequence[tuple[int, ...]] | None = None) -> np.ndarray:
        """The policy's law from model rows given as probabilities ``[n, V]`` (float64)."""
        with np.errstate(divide="ignore"):
            logits = torch.from_numpy(np.log(np.asarray(probs, dtype=np.float64)))
        shape = logits.shape
        out = self.probabilities(logits.reshape(-1, shape[-1]), prefixes)
        return out.reshape(shape).numpy()


GREEDY = DecodingPolicy(0.0)
SAMPLING = DecodingPolicy(1.0)


def greedy_variant(policy: "DecodingPolicy | None") -> "DecodingPolicy":
    """A world's own policy decoded greedily (its mask and stops kept), or ``GREEDY`` for none:
    what greedy identity and the greedy forced draws run under."""
    return GREEDY if policy is None else dataclasses.replace(policy, temperature=0.0)
