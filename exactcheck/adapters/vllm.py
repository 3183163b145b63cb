"""vLLM's V1 rejection sampler as a step verifier subject, and vLLM's ``LLM.generate`` as a
batched end-to-end generator.

**The rejection sampler.** ``VllmRejectionSampler`` hands exactcheck's verify call to the installed
vLLM's ``vllm.v1.sample.rejection_sampler.rejection_sample`` in the layout vLLM's model runner
uses: draft tokens flattened over requests (``[num_tokens]``, int32), ``num_draft_tokens`` and
``cu_num_draft_tokens`` (k per request), target and draft probabilities flattened to
``[num_tokens, V]`` float32, one bonus token per request, and the sampling metadata it reads
(``all_greedy``, ``all_random``, ``temperature`` per request, ``top_k``/``top_p`` unset,
``generators``: request index -> ``torch.Generator``). exactcheck's subject generator becomes
every request's generator; a check that hands ``row_generators`` (vLLM's per-request seeds) gets
exactly those, and a request without one draws from torch's global generator, as in vLLM.

What is exactcheck's and not vLLM's: the bonus token. vLLM samples it with its main sampler
outside ``rejection_sample`` (or inside ``RejectionSampler.forward`` in newer releases, through
the same sampler); the adapter draws it from the target's last row by inverse CDF in float64 with
the request's generator, which is exact, so a defect found is in vLLM's part.

``temperature=T`` also runs vLLM's ``compute_probs``: the adapter hands it logits ``T * log p``
(and ``T * log q`` for the draft rows, as vLLM's drafters compute theirs the same way), so vLLM's
temperature scaling and softmax must give back ``p`` and ``q``. ``greedy=True`` runs the greedy
path (``all_greedy``): the emitted tokens are the target's argmax up to the first mismatch.

``exactcheck.step.engines.audit_rejection_sampler()`` is the one call a vLLM developer puts in a test.
Without vLLM it
raises ``MissingEngine`` naming what is missing; ``module=`` takes any module with the same
functions (our tests pass a pure-torch stand-in with vLLM's semantics, because vLLM's Triton
kernels need a full vLLM install and, in practice, a GPU).

**LLM.generate.** ``VllmGenerate`` wraps an ``LLM`` built with a speculative config as a batched
generator (``exactcheck.contracts.generator.BatchedGenerator``): one ``generate`` call for many
prompts, each request with its own seed and the policy's temperature, top-k, top-p and min-p.
vLLM holds its own models, so the audit's target and draft arguments are not used by it.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from exactcheck.adapters import triton_interpreter
from exactcheck.errors import UsageError
from exactcheck.contracts.verifier import PADDING
from exactcheck.contracts.sampling import inverse_cdf

__all__ = ["MissingEngine", "VllmRejectionSampler", "VllmV2RejectionSampler", "SamplingMetadataView", "top_k_decoys",
           "VllmGenerate", "REJECTION_SAMPLER_MODULE", "V2_REJECTION_MODULE"]

REJECTION_SAMPLER_MODULE = "vllm.v1.sample.rejection_sampler"
GREEDY_RULE = "relaxed:topk=1,delta=0"  # greedy decoding as a rule (exactcheck.rules): the argmax


class MissingEngine(UsageError):
    """The serving engine an adapter wraps is not installed (one line, exit 2 from the CLI)."""


def load_module(name: str, what: str, hint: str):
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise MissingEngine(f"{what} needs {name} ({exc}); {hint}") from exc


@dataclass
class SamplingMetadataView:
    """The fields of vLLM's ``SamplingMetadata`` that ``rejection_sample`` and ``compute_probs``
    read (the full class has many more, which change between releases)."""

    temperature: torch.Tensor
    all_greedy: bool
    all_random: bool
    generators: dict[int, torch.Generator]
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None


def _engine_module(module, name: str, what: str, hint: str):
    """The module to drive: vLLM's own (``name``) by default, an importable name, or a module; under
    Triton's interpreter, with what the interpreter lacks filled in (``triton_interpreter``)."""
    if module is None or isinstance(module, str):
        triton_interpreter.check_environment()
        module = load_module(module or name, what, hint if module is None else "pass module= an importable module")
    triton_interpreter.prepare_vllm(module)
    return module


def _rejection_module(module):
    return _engine_module(module, REJECTION_SAMPLER_MODULE, "exactcheck.adapters.vllm",
                          "install vLLM (pip install vllm) or pass module= a module with the same functions")


@dataclass
class VllmRejectionSampler:
    """A step ``Verifier`` backed by vLLM V1's ``rejection_sample`` (see the module docstring).

    It follows the installed release: vLLM 0.33 takes ``target_logits`` (it applies the softmax
    itself, float32) and processes temperature and top-k/top-p with ``apply_sampling_constraints``
    (what ``RejectionSampler.forward`` calls first); earlier V1 releases take ``target_probs``
    made by ``compute_probs``. ``temperature``: the target's logits are handed as ``T * log p``
    so the release's own temperature scaling must give back p; ``top_k=True``: every request
    gets top-k with k = the largest support among its rows, and the rows whose support has that
    size carry finite decoy logits (below every supported one) that vLLM's top-k must remove;
    ``greedy=True``: the greedy path (the release's ``GREEDY_TEMPERATURE``). The draft rows are
    handed as vLLM's drafters make them: a float32 softmax of the draft's logits (normalised)."""

    module: Any = None
    temperature: float | None = None
    greedy: bool = False
    top_k: bool = False
    name: str = field(default="vllm rejection_sample", init=False)
    acceptance_rule: str = field(default="token-wise", init=False)

    def __post_init__(self):
        self.module = _rejection_module(self.module)
        parameters = inspect.signature(self.module.rejection_sample).parameters
        self.takes_logits = "target_logits" in parameters
        if not self.takes_logits and "target_probs" not in parameters:
            raise UsageError("this vLLM's rejection_sample takes neither target_probs (vLLM <= 0.2x) nor "
                             "target_logits (vLLM 0.33); exactcheck.adapters.vllm cannot drive it")
        unknown = set(parameters) - set(_ARGUMENTS)
        required = {n for n in unknown if parameters[n].default is inspect.Parameter.empty}
        if required:
            raise UsageError(f"this vLLM's rejection_sample takes {sorted(required)}, which "
                             f"exactcheck.adapters.vllm does not know how to fill (it knows {sorted(_ARGUMENTS)})")
        self._parameters = [n for n in parameters if n in _ARGUMENTS]
        processing = "apply_sampling_constraints" if self.takes_logits else "compute_probs"
        self._process = getattr(self.module, processing, None)
        if (self.temperature is not None or self.top_k) and not self.greedy and self._process is None:
            raise UsageError(f"this vLLM's rejection sampler module has no {processing}, which the "
                             f"{'target_logits' if self.takes_logits else 'target_probs'} API needs for "
                             "temperature and top-k; exactcheck.adapters.vllm cannot drive that path")
        self.greedy_temperature = float(getattr(self.module, "GREEDY_TEMPERATURE", -1))
        if self.temperature is not None:
            self.name += f" (temperature {self.temperature:g})"
        if self.top_k:
            self.name += " (top-k)"
        if self.greedy:
            self.name += " (greedy path)"
            # greedy decoding, judged against the target's argmax: the relaxed rule at top-1 with no
            # slack accepts exactly the argmax and emits it at the first mismatch and as the bonus
            self.acceptance_rule = GREEDY_RULE

    def __call__(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, draft_tokens: torch.Tensor,
                 generator: torch.Generator, row_generators: list[torch.Generator | None] | None = None
                 ) -> torch.Tensor:
        batch, k = draft_tokens.shape
        vocab = target_probs.shape[-1]
        device = target_probs.device
        if row_generators is None:
            generators = {i: generator for i in range(batch)}
        else:
            generators = {i: g for i, g in enumerate(row_generators) if g is not None}
        bonus = self._bonus_tokens(target_probs[:, k], generator, row_generators)
        temperature = self.temperature or 1.0
        metadata = SamplingMetadataView(
            temperature=torch.full((batch,), self.greedy_temperature if self.greedy else temperature,
                                   dtype=torch.float32, device=device),
            all_greedy=self.greedy, all_random=not self.greedy, generators=generators)
        cu = torch.arange(1, batch + 1, dtype=torch.int32, device=device) * k
        rows = target_probs[:, :k].reshape(batch * k, vocab)
        logits = _logits(rows) * temperature
        if self.top_k and not self.greedy:
            logits, metadata.top_k = top_k_decoys(logits, batch, k)
        # the draft rows as vLLM's drafters make them: a float32 softmax of their logits
        draft = torch.softmax(_logits(draft_probs.reshape(batch * k, vocab)), dim=-1)
        processed = self.temperature is not None or self.top_k
        if self.takes_logits:
            target = self._process(logits.contiguous(), cu, metadata) if processed and not self.greedy else logits
        elif processed and not self.greedy:
            target = self._process(logits.contiguous(), cu, metadata)
        else:  # the probabilities vLLM's model runner makes from the logits: a float32 softmax
            target = torch.softmax(logits, dim=-1)
        arguments = {
            "draft_token_ids": draft_tokens.reshape(-1).to(torch.int32).contiguous(),
            "num_draft_tokens": [k] * batch,
            "max_spec_len": k,
            "cu_num_draft_tokens": cu,
            "draft_probs": draft.contiguous(),
            "target_probs": target.contiguous(),
            "target_logits": target.contiguous(),
            "bonus_token_ids": bonus.to(torch.int32)[:, None].contiguous(),
            "sampling_metadata": metadata,
        }
        out = self.module.rejection_sample(**{n: arguments[n] for n in self._parameters})
        out = out[:, :k + 1].to(torch.int64)
        placeholder = getattr(self.module, "PLACEHOLDER_TOKEN_ID", -1)
        return torch.where(out == placeholder, torch.full_like(out, PADDING), out)

    def _bonus_tokens(self, rows: torch.Tensor, generator, row_generators) -> torch.Tensor:
        """The bonus token of each request (exactcheck's part): argmax on the greedy path, else
        inverse CDF in float64 with the request's generator."""
        if self.greedy:
            return rows.argmax(-1)
        u = torch.rand(rows.shape[0], dtype=torch.float64, generator=generator, device=rows.device)
        for i, g in enumerate(row_generators or ()):
            if g is not None:
                u[i] = torch.rand((), dtype=torch.float64, generator=g, device=rows.device)
        cdf = rows.double().cumsum(-1)
        return inverse_cdf(cdf, u * cdf[:, -1])


_ARGUMENTS = ("draft_token_ids", "num_draft_tokens", "max_spec_len", "cu_num_draft_tokens", "draft_probs",
              "target_probs", "target_logits", "bonus_token_ids", "sampling_metadata")


def _logits(rows: torch.Tensor) -> torch.Tensor:
    """float32 log-probabilities, -inf where a row gives 0 (a model's logits up to a constant)."""
    rows = rows.float()
    return torch.where(rows > 0, rows.clamp(min=torch.finfo(torch.float32).tiny).log(),
                       torch.full_like(rows, -torch.inf))


def top_k_decoys(logits: torch.Tensor, batch: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits for vLLM's top-k path whose top-k law is the rows' own: each request's k is the
    largest support among its rows, and a row whose support has that size gets finite decoy
    logits (one unit below its smallest supported logit) on its unsupported tokens, which top-k
    must remove. Rows with a smaller support keep -inf there (top-k is a no-op on them)."""
    vocab = logits.shape[-1]
    finite = torch.isfinite(logits)
    support = finite.sum(-1).view(batch, k)
    top = support.max(1).values  # [batch]
    full = (support == top[:, None]).reshape(-1) & (top.repeat_interleave(k) < vocab)
    floor = torch.where(finite, logits, torch.full_like(logits, torch.inf)).min(-1, keepdim=True).values - 1.0
    decoyed = torch.where(finite | ~full[:, None], logits, floor.expand_as(logits))
    return decoyed, top.to(torch.int32)


V2_REJECTION_MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
_V2_METHODS = {"standard": "token-wise", "block": "block", "synthetic": "synthetic", "fly": "fly"}


@dataclass
class VllmV2RejectionSampler:
    """A step ``Verifier`` backed by vLLM 0.33's model-runner-V2 ``rejection_sample``
    (``rejection_sampler_utils``), with ``method`` "standard", "block", "synthetic" or "fly"
    (``SpeculativeConfig.rejection_sample_method``) and ``draft`` "probabilistic" (draft logits
    handed over) or "greedy" (one-hot drafts, ``draft_logits=None``). The subject declares the rule
    its method follows, so the audit checks that rule's conformance laws; synthetic (conditional
    acceptance ``synthetic_rate`` at every draft, ``synthetic_conditional_rates``) and FLy
    (``fly_window``: 0 for vLLM's default min(6, k - 1); ``fly_entropy_threshold``,
    ``fly_entropy_top_k``) are lossy rules of ``exactcheck.rules``: their exactness verdicts measure
    the TV they cost, never call them exact.

    The layout the V2 model runner uses: target logits packed per request (k draft rows and the
    bonus row; here ``log p`` at temperature 1), draft logits [B, k, V] (``log q``), the drafts in
    ``draft_sampled`` shifted by one row, ``cu_num_logits``, absolute positions ``pos`` and one
    seed per request. vLLM draws its uniforms inside the kernel from (seed, position): the seeds
    are drawn from the generator the audit hands over, so a seed gives the same output; forced
    uniforms cannot reach vLLM's Philox stream on a real install (exactcheck's stand-in draws
    through torch)."""

    module: Any = None
    method: str = "standard"
    draft: str = "probabilistic"
    synthetic_rate: float = 0.5
    fly_window: int = 0
    fly_entropy_threshold: float = 0.3
    fly_entropy_top_k: int = 3
    name: str = field(default="vllm v2 rejection_sample", init=False)
    acceptance_rule: str = field(default="token-wise", init=False)
    # what the forced-value properties say instead of judging (``exactcheck.step.properties``)
    random_numbers_from_seeds: str = field(
        default="vLLM V2 draws Philox uniforms (tl.rand) and murmur3 Gumbel noise inside its kernels from each "
                "request's seed and position; the adapter draws the seeds from the audit's generator",
        init=False)

    def __post_init__(self):
        if self.method not in _V2_METHODS:
            raise UsageError(f"method ({self.method!r}) must be one of {sorted(_V2_METHODS)}")
        if self.draft not in ("probabilistic", "greedy"):
            raise UsageError(f"draft ({self.draft!r}) must be probabilistic or greedy")
        self.module = _engine_module(self.module, V2_REJECTION_MODULE, "exactcheck.adapters.vllm (V2)",
                                     "install vLLM >= 0.33 or pass module= a module with the same function")
        self.acceptance_rule = _V2_METHODS[self.method]
        if self.method == "synthetic":
            self.acceptance_rule = f"synthetic:rate={self.synthetic_rate!r}"
        elif self.method == "fly":
            self.acceptance_rule = (f"fly:window={int(self.fly_window)},entropy_threshold={self.fly_entropy_threshold!r},"
                                    f"top_k={int(self.fly_entropy_top_k)}")
        self.name = f"vllm v2 rejection_sample ({self.method}, {self.draft} draft)"

    def __call__(self, target_probs, draft_probs, draft_tokens, generator):
        batch, k = draft_tokens.shape
        vocab = target_probs.shape[-1]
        device = target_probs.device
        logp = torch.where(target_probs > 0, target_probs.float().log(), torch.full_like(target_probs.float(), -torch.inf))
        logq = torch.where(draft_probs > 0, draft_probs.float().log(), torch.full_like(draft_probs.float(), -torch.inf))
        drafts = torch.cat([torch.zeros(batch, 1, dtype=torch.int64, device=device), draft_tokens], 1).reshape(-1)
        index = torch.arange(batch, dtype=torch.int32, device=device)
        cu_num_logits = torch.arange(batch + 1, dtype=torch.int32, device=device) * (k + 1)
        local = torch.arange(k + 1, dtype=torch.int32, device=device).repeat(batch)  # also each row's position
        seed = torch.randint(0, 1 << 62, (batch,), generator=generator, device=device)  # one per request
        sampled, num_sampled = self.module.rejection_sample(
            logp.reshape(batch * (k + 1), vocab).contiguous(), logq.contiguous() if self.draft == "probabilistic" else None,
            drafts, cu_num_logits, local.to(torch.int64), index, index.repeat_interleave(k + 1), local,
            torch.ones(batch, device=device), seed, k, **self._method_arguments(k, device))
        keep = torch.arange(k + 1, device=device)[None] < num_sampled.to(device)[:, None].to(torch.int64)
        return torch.where(keep, sampled.to(device), torch.full_like(sampled, PADDING))


    def _method_arguments(self, k: int, device) -> dict:
        """What ``RejectionSampler.__init__`` passes ``rejection_sample`` for the method."""
        if self.method == "block":
            return {"use_block_verification": True}
        if self.method == "synthetic":
            return {"synthetic_conditional_rates": torch.full((k,), self.synthetic_rate, dtype=torch.float32,
                                                              device=device)}
        if self.method == "fly":
            window = int(self.fly_window) or min(6, k - 1)  # vLLM's default; it needs W < k
            return {"fly_window_size": window if 0 < window < k else 0,
                    "fly_entropy_threshold": self.fly_entropy_threshold, "fly_entropy_top_k": int(self.fly_entropy_top_k)}
        return {}


@dataclass
class VllmGenerate:
    """vLLM's ``LLM.generate`` as a batched end-to-end generator. ``llm``: an ``LLM`` built with
    ``speculative_config``; ``sampling_params``: the ``SamplingParams`` class (vLLM's by default)."""

    llm: Any
    sampling_params: Any = None
    name: str = "vllm LLM.generate"

    def __post_init__(self):
        if self.sampling_params is None:
            self.sampling_params = load_module("vllm", "exactcheck.adapters.vllm.VllmGenerate",
                                               "install vLLM or pass sampling_params=").SamplingParams

    def params(self, policy, max_new_tokens: int, seed: int):
        """One request's ``SamplingParams`` for ``policy`` (temperature 0 is vLLM's greedy)."""
        settings = dict(max_tokens=max_new_tokens, seed=seed, temperature=0.0 if policy.greedy else policy.temperature,
                        ignore_eos=True, stop_token_ids=list(policy.stop_tokens) or None)
        if policy.top_k:
            settings["top_k"] = policy.top_k
        if policy.top_p is not None and policy.top_p < 1:
            settings["top_p"] = policy.top_p
        if policy.min_p:
            settings["min_p"] = policy.min_p
        if policy.mask is not None or policy.logit_bias or policy.banned_tokens:
            raise UsageError("VllmGenerate passes temperature, top-k, top-p, min-p and stop tokens; "
                             "not a grammar mask, a logit bias or banned tokens")
        return self.sampling_params(**settings)

    def generate_batch(self, target, draft, prompts: list[torch.Tensor], policy, max_new_tokens: int,
                       seeds: list[int]) -> list[torch.Tensor]:
        requests = [{"prompt_token_ids": p.reshape(-1).tolist()} for p in prompts]
        params = [self.params(policy, max_new_tokens, s) for s in seeds]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [torch.tensor(list(o.outputs[0].token_ids), dtype=torch.int64) for o in outputs]

    def __call__(self, target, draft, input_ids: torch.Tensor, policy, max_new_tokens: int, seed: int):
        return self.generate_batch(target, draft, [input_ids[0]], policy, max_new_tokens, [seed])[0]
