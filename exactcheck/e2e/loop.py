"""exactcheck's reference speculative loop over real model objects, and its cache-level mutants.

``ReferenceSpeculativeLoop`` is an end-to-end ``Generator`` (``exactcheck.contracts.generator``): it drives
a target and a draft causal LM (transformers-style ``forward(input_ids, position_ids, cache)``)
with one transformers ``DynamicCache`` each, and verifies with a step ``Verifier`` (the
reference verifier unless told otherwise). Each round:

1. the draft is fed the committed tokens its cache lacks, then samples ``draft_length`` tokens
   from the policy's law of its logits (greedy: argmax), feeding each back; ``q`` is the law it
   sampled from;
2. the target is fed the committed tokens its cache lacks plus the drafts, giving k + 1 rows
   ``p`` (policy law of its logits, float64);
3. the verifier emits the accepted drafts and one correction or bonus token; the loop commits
   them (at most ``max_new_tokens`` in all);
4. rollback: both caches are cropped to the committed sequence minus its last token (the only
   token no model has been fed yet); position ids always start at the cache's length.

The loop feeds each model the committed tokens from where it believes the cache ends (the
committed length minus one), as real loops do; a cache that was not cropped therefore shows the
model stale tokens instead of crashing the loop.

Invariant kept at the start of every round: each cache holds exactly ``sequence[:-1]`` (or less),
with positions 0, 1, 2, ... . One method per step, so each mutant below overrides exactly one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from exactcheck.contracts.transformers_compat import forward, new_cache
from exactcheck.contracts.generator import Capabilities, DecodingPolicy, DraftRecord, Generation
from exactcheck.contracts.policy import greedy_variant
from exactcheck.contracts.reference_verifier import ReferenceVerifier

__all__ = ["ReferenceSpeculativeLoop", "DilutedDraft", "NoCropAfterRejection", "CropOffByOne", "PositionsNotRewound",
           "DraftCacheNotTrimmed", "SoftmaxQGreedyDraft", "SoftmaxQTopKDraft", "LOOP_MUTANTS",
           "CACHE_MUTANTS", "POLICY_MUTANTS", "PolicyOnDraftOnly", "PolicyOnBonusOnly", "TemperatureTwice",
           "MaskOnDraftOnly", "MaskAfterAcceptance", "TokensAfterStop", "InlineRatioTest", "GreedyWhenSampling",
           "FORCED_DRAW_MUTANTS"]


@dataclass(frozen=True)
class ReferenceSpeculativeLoop:
    """An exact speculative generator with explicit cache rollback."""

    draft_length: int = 4
    name: str = "exactcheck reference speculative loop"
    # it keeps a cache and hands back the q of every draft (``Generation.drafts``)
    capabilities = Capabilities(cache=True, reports_draft_q=True)

    def __call__(self, target, draft, input_ids: torch.Tensor, policy: DecodingPolicy,
                 max_new_tokens: int, seed: int) -> Generation:
        device = target.device
        generator = torch.Generator(device=device).manual_seed(seed)
        records: list[DraftRecord] = []
        sequence = input_ids[0].to(device)
        prompt = sequence.numel()
        caches = {"target": new_cache(), "draft": new_cache()}
        # tokens ever fed per model (only PositionsNotRewound reads it), and how many committed
        # tokens the loop believes each cache holds (true when rollback crops correctly)
        counters = {"target": 0, "draft": 0, "known": 0}
        with torch.no_grad():
            counters["prompt"] = prompt
            while sequence.numel() - prompt < max_new_tokens:
                drafts, q = self.draft_tokens(draft, caches["draft"], counters, sequence, policy, generator)
                records += [DraftRecord(int(x), row.cpu()) for x, row in zip(drafts.tolist(), q)]
                p = self.target_rows(target, caches["target"], counters, sequence, drafts, policy)
                out = self.verify(p, q, drafts, generator)
                emitted = self.commit(out[out >= 0], sequence[prompt:], drafts, p, policy, generator)
                emitted = emitted[: max_new_tokens - (sequence.numel() - prompt)]
                keep, stop = self.stop_at(emitted, policy)
                sequence = torch.cat([sequence, emitted[:keep]])
                self.rollback(caches, sequence.numel() - 1)
                counters["known"] = sequence.numel() - 1
                if stop:
                    break
        return Generation(sequence[None], target_cache=caches["target"], draft_cache=caches["draft"],
                          drafts=tuple(records))

    # -- steps -------------------------------------------------------------------------------
    def verify(self, p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator) -> torch.Tensor:
        """The verifier's output row (accepted drafts, one more token, -1 padding) for target
        rows ``p`` [k+1, V], draft rows ``q`` [k, V] and ``drafts`` [k]."""
        return ReferenceVerifier()(p[None].float(), q[None].float(), drafts[None], generator)[0]

    def positions(self, cache, counters: dict, role: str, n: int, device) -> torch.Tensor:
        start = cache.get_seq_length()
        counters[role] += n
        return torch.arange(start, start + n, device=device)

    def forward(self, model, cache, counters, role, tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens``; the logits [n, V] at each fed position."""
        positions = self.positions(cache, counters, role, tokens.numel(), tokens.device)
        out = forward(model, tokens[None], cache, position_ids=positions[None], use_cache=True)
        return out.logits[0]

    def policy_rows(self, logits: torch.Tensor, policy: DecodingPolicy, prefixes, role: str) -> torch.Tensor:
        """The policy's law of each logit row (float64); ``prefixes[i]``: the generated tokens
        row i conditions on; ``role``: "draft" or "target" (policy mutants treat them apart)."""
        return policy.probabilities(logits, prefixes)

    def commit(self, emitted, generated, drafts, p, policy, generator) -> torch.Tensor:
        """The tokens to append, from the verifier's output."""
        return emitted

    def stop_at(self, emitted: torch.Tensor, policy: DecodingPolicy) -> tuple[int, bool]:
        return stop_at(emitted, policy)

    def draft_sample(self, q_row: torch.Tensor, logits: torch.Tensor, policy, generator) -> tuple[int, torch.Tensor]:
        """(token, the row it was sampled from)."""
        return int(torch.multinomial(q_row, 1, generator=generator)), q_row

    def draft_tokens(self, draft, cache, counters, sequence, policy, generator):
        # after a fully accepted round the draft has not been fed its own last draft yet
        feed = sequence[min(counters["known"], cache.get_seq_length()):]
        generated = tuple(sequence[counters["prompt"]:].tolist())
        tokens, rows = [], []
        for _ in range(self.draft_length):
            logits = self.forward(draft, cache, counters, "draft", feed)[-1]
            row = self.policy_rows(logits[None], policy, [generated + tuple(tokens)], "draft")[0]
            token, row = self.draft_sample(row, logits, policy, generator)
            tokens.append(token)
            rows.append(row)
            feed = torch.tensor([token], device=sequence.device)
        return torch.tensor(tokens, device=sequence.device), torch.stack(rows)

    def target_rows(self, target, cache, counters, sequence, drafts, policy) -> torch.Tensor:
        feed = torch.cat([sequence[min(counters["known"], cache.get_seq_length()):], drafts])
        logits = self.forward(target, cache, counters, "target", feed)[-(drafts.numel() + 1):]
        generated = tuple(sequence[counters["prompt"]:].tolist())
        prefixes = self.verified_prefixes(generated, drafts.tolist(), policy, counters)
        return self.policy_rows(logits, policy, prefixes, "target")

    def verified_prefixes(self, generated: tuple, drafts: list[int], policy, counters: dict) -> list[tuple]:
        """The generated prefix each of the k + 1 target rows conditions on (what a grammar mask
        reads): the committed tokens, then the drafts before the row."""
        return [generated + tuple(drafts[:j]) for j in range(len(drafts) + 1)]

    def rollback(self, caches: dict, keep: int) -> None:
        """Crop both caches to the first ``keep`` committed tokens."""
        for cache in caches.values():
            _crop_to(cache, keep)


def stop_at(emitted: torch.Tensor, policy: DecodingPolicy) -> tuple[int, bool]:
    """(how many of ``emitted`` to keep, whether generation stops): up to and including the
    first stop token, and stop there."""
    for i, token in enumerate(emitted.tolist()):
        if token in policy.stop_tokens:
            return i + 1, True
    return emitted.numel(), False


def _crop_to(cache, keep: int) -> None:
    extra = cache.get_seq_length() - keep
    if extra > 0:
        cache.crop(-extra)


# -- cache-level mutants (each breaks one step; see field-notes: transformers #30042, #30413,
#    #30312, PR #46936; lucidrains/speculative-decoding; transformers #32867, #47932) ----------

@dataclass(frozen=True)
class NoCropAfterRejection(ReferenceSpeculativeLoop):
    """The target cache keeps the rejected drafts' entries (no crop at all)."""

    name: str = "mutant: no_crop_after_rejection"

    def rollback(self, caches, keep):
        _crop_to(caches["draft"], keep)


@dataclass(frozen=True)
class CropOffByOne(ReferenceSpeculativeLoop):
    """The target cache is cropped to one entry too many (keeps the first rejected draft)."""

    name: str = "mutant: crop_off_by_one"

    def rollback(self, caches, keep):
        _crop_to(caches["target"], keep + 1)
        _crop_to(caches["draft"], keep)


@dataclass(frozen=True)
class PositionsNotRewound(ReferenceSpeculativeLoop):
    """Caches are cropped, but position ids continue from the count of tokens ever fed."""

    name: str = "mutant: positions_not_rewound"

    def positions(self, cache, counters, role, n, device):
        start = counters[role]
        counters[role] += n
        return torch.arange(start, start + n, device=device)


@dataclass(frozen=True)
class DraftCacheNotTrimmed(ReferenceSpeculativeLoop):
    """The draft's cache keeps its rejected tokens (the statement-without-assignment bug)."""

    name: str = "mutant: draft_cache_not_trimmed"

    def rollback(self, caches, keep):
        _crop_to(caches["target"], keep)


@dataclass(frozen=True)
class SoftmaxQGreedyDraft(ReferenceSpeculativeLoop):
    """The drafter picks its argmax but reports the plain softmax as q (transformers #32867)."""

    name: str = "mutant: softmax_q_greedy_draft"

    def draft_sample(self, q_row, logits, policy, generator):
        return int(q_row.argmax()), q_row


@dataclass(frozen=True)
class SoftmaxQTopKDraft(ReferenceSpeculativeLoop):
    """The drafter samples from its top-2 tokens but reports the plain softmax as q (#47932)."""

    name: str = "mutant: softmax_q_top_k_draft"

    def draft_sample(self, q_row, logits, policy, generator):
        top = q_row.topk(min(2, q_row.numel()))
        truncated = torch.zeros_like(q_row).scatter(0, top.indices, top.values)
        return int(torch.multinomial(truncated / truncated.sum(), 1, generator=generator)), q_row


@dataclass(frozen=True)
class DilutedDraft(ReferenceSpeculativeLoop):
    """A cost mutant, exact by construction: the drafter samples from its law mixed with the
    uniform law (weight ``uniform``) and reports that mixture as q, so every output still follows
    the target while fewer drafts are accepted. ``exactcheck cost`` shows it (accepted drafts per
    round below the world's exact expectation); the exactness audit passes it."""

    uniform: float = 0.9
    name: str = "cost mutant: diluted_draft"

    def draft_sample(self, q_row, logits, policy, generator):
        diluted = (1 - self.uniform) * q_row + self.uniform / q_row.numel()
        return int(torch.multinomial(diluted, 1, generator=generator)), diluted


# -- policy mutants (field notes: vLLM #9834, #42744; SGLang #10617; the guide's JSON exercise) ----

def _plain(policy: DecodingPolicy) -> DecodingPolicy:
    """The model's own law with the policy's stop tokens: "defaults on the target"."""
    return DecodingPolicy(temperature=1.0, stop_tokens=policy.stop_tokens)


@dataclass(frozen=True)
class PolicyOnDraftOnly(ReferenceSpeculativeLoop):
    """Temperature, top-k, top-p, min-p, bias and mask reach the drafter; the target rows
    used for verification are the plain softmax (vLLM #9834: top-p on the draft only)."""

    name: str = "mutant: policy_on_draft_only"

    def policy_rows(self, logits, policy, prefixes, role):
        return (policy if role == "draft" else _plain(policy)).probabilities(logits, prefixes)


@dataclass(frozen=True)
class PolicyOnBonusOnly(ReferenceSpeculativeLoop):
    """The target's transform is applied to the bonus row only; verified positions use the plain
    softmax (vLLM #42744, SGLang #10617: min-p and logit bias on the bonus token only)."""

    name: str = "mutant: policy_on_bonus_only"

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "draft":
            return policy.probabilities(logits, prefixes)
        plain = _plain(policy).probabilities(logits[:-1], prefixes[:-1])
        return torch.cat([plain, policy.probabilities(logits[-1:], prefixes[-1:])])


@dataclass(frozen=True)
class TemperatureTwice(ReferenceSpeculativeLoop):
    """The target's logits are divided by the temperature twice (T^2 in effect)."""

    name: str = "mutant: temperature_twice"

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "target" and not policy.greedy:
            policy = dataclasses.replace(policy, temperature=policy.temperature ** 2)
        return policy.probabilities(logits, prefixes)


@dataclass(frozen=True)
class MaskOnDraftOnly(ReferenceSpeculativeLoop):
    """The grammar mask is applied to the drafter only; verification uses the unmasked target."""

    name: str = "mutant: mask_on_draft_only"

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "target":
            policy = dataclasses.replace(policy, mask=None)
        return policy.probabilities(logits, prefixes)


@dataclass(frozen=True)
class MaskAfterAcceptance(ReferenceSpeculativeLoop):
    """Verification uses the unmasked target; afterwards the first emitted token the grammar
    forbids is replaced by a sample from the masked target row there, and the rest dropped.
    Every output is valid; the law is not the masked target's."""

    name: str = "mutant: mask_after_acceptance"

    def policy_rows(self, logits, policy, prefixes, role):
        if role == "target":
            policy = dataclasses.replace(policy, mask=None)
        return policy.probabilities(logits, prefixes)

    def commit(self, emitted, generated, drafts, p, policy, generator):
        if policy.mask is None:
            return emitted
        tokens = emitted.tolist()
        for j, token in enumerate(tokens):
            allowed = list(policy.mask(tuple(generated.tolist()) + tuple(tokens[:j])))
            if token not in allowed:
                row = torch.zeros_like(p[j])
                row[allowed] = p[j][allowed]
                if float(row.sum()) <= 0:
                    row[allowed] = 1.0
                fixed = int(torch.multinomial(row / row.sum(), 1, generator=generator))
                return torch.tensor(tokens[:j] + [fixed], device=emitted.device)
        return emitted


@dataclass(frozen=True)
class TokensAfterStop(ReferenceSpeculativeLoop):
    """Stop tokens do not end the generation: tokens are emitted after EOS."""

    name: str = "mutant: tokens_after_stop"

    def stop_at(self, emitted, policy):
        return emitted.numel(), False


# -- forced-draw and policy-level mutants (issue: an inline ``r > p/q`` in a generate loop; a
#    sampled request decoded greedily, SGLang #31214, TensorRT-LLM #19390) ----------------------

@dataclass(frozen=True)
class InlineRatioTest(ReferenceSpeculativeLoop):
    """Verification written inline in the loop, as a popular package does: reject draft i when
    ``r > p(x)/q(x)`` with float32 uniforms ``r``. At ``r = 0`` exactly (probability 2^-24 per
    draw) it accepts a draft the target gives probability 0; otherwise it is exact. Only forced
    draws inside generate find it."""

    name: str = "mutant: inline_ratio_test"

    def verify(self, p, q, drafts, generator):
        k = drafts.numel()
        ratio = (p[torch.arange(k), drafts] / q[torch.arange(k), drafts]).float()
        r = torch.rand(k, generator=generator, device=drafts.device)
        rejected = (r > ratio).nonzero()
        n = int(rejected[0, 0]) if rejected.numel() else k
        if n < k:
            residual = (p[n] - q[n]).clamp(min=0)
            row = residual / residual.sum() if float(residual.sum()) > 0 else p[n]
        else:
            row = p[k]
        extra = torch.multinomial(row, 1, generator=generator)
        out = torch.full((k + 1,), -1, dtype=torch.int64, device=drafts.device)
        out[:n] = drafts[:n]
        out[n] = extra[0]
        return out


@dataclass(frozen=True)
class GreedyWhenSampling(ReferenceSpeculativeLoop):
    """A sampled request decoded greedily: the policy's temperature is dropped and both models
    decode at temperature 0 (SGLang #31214, TensorRT-LLM #19390: a sampling setting silently
    ignored)."""

    name: str = "mutant: greedy_when_sampling"

    def policy_rows(self, logits, policy, prefixes, role):
        return greedy_variant(policy).probabilities(logits, prefixes)


FORCED_DRAW_MUTANTS = (InlineRatioTest(),)
CACHE_MUTANTS = (NoCropAfterRejection(), CropOffByOne(), PositionsNotRewound(), DraftCacheNotTrimmed())
POLICY_MUTANTS = (PolicyOnDraftOnly(), PolicyOnBonusOnly(), TemperatureTwice(), MaskOnDraftOnly(),
                  MaskAfterAcceptance(), TokensAfterStop())
LOOP_MUTANTS = (CACHE_MUTANTS + (SoftmaxQGreedyDraft(), SoftmaxQTopKDraft()) + POLICY_MUTANTS
                + FORCED_DRAW_MUTANTS + (GreedyWhenSampling(),))
