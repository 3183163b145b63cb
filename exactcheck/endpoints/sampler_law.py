"""The law a sampler chain gives, from a server's raw probabilities, where it is determinable.

A reference that reports only raw probabilities (vLLM's default ``logprobs_mode``: the model's
softmax before temperature and truncation), and only its top N, determines the law a request's
sampling settings give in some cases and not in others. This module says which, and never guesses:

- temperature 1, no truncation: the raw law itself (the unlisted tokens stay one cell);
- top-k (any temperature): the k most probable tokens, when the list holds them, reweighted by
  ``p ** (1 / T)``: every engine agrees on the set and on the weights;
- top-p or min-p at temperature 1: the nucleus (the fewest most probable tokens whose mass reaches
  top-p) or the tokens at least min-p times the most probable, when the list shows where the cut
  falls;
- greedy: the most probable token, unless the top two tie.

Not determinable, and said so (``NotDeterminable``): a temperature other than 1 with top-p or
min-p (llama.cpp truncates before it applies temperature, vLLM after), top-p together with min-p
(llama.cpp applies top-p first, vLLM min-p first), a temperature other than 1 without truncation
unless the reference listed the whole vocabulary, a cut the list does not reach, a tie at a cut.
These are engine conventions, not exactness: a reference that reports post-sampling
probabilities (llama.cpp's ``post_sampling_probs``; vLLM's ``--logprobs-mode processed_logprobs``)
gives the law for every setting.

Penalties (``with_output_penalties``): vLLM's presence and frequency penalties subtract from the
logits of the tokens its output holds, so they shift log-probabilities and a raw law with them
follows from the raw law without them (softmax does not see the logits' offset); its repetition
penalty divides a positive logit and multiplies a negative one, and log-softmax loses the sign, so
no raw law determines it.
"""
from __future__ import annotations

import math

from exactcheck.endpoints.continuation_law import NextTokenLaw

__all__ = ["NotDeterminable", "sampling_law_from_raw", "with_output_penalties"]


class NotDeterminable(ValueError):
    """The raw probabilities a reference listed do not determine the law of these settings."""


def sampling_law_from_raw(raw: NextTokenLaw, sampling) -> NextTokenLaw:
    """The law ``sampling`` (an ``exactcheck.endpoints.endpoint.Sampling``) gives from ``raw``: the
    listed raw probabilities and the mass of the unlisted tokens (each at most the least listed)."""
    order = sorted(raw.probabilities.items(), key=lambda kv: (-kv[1], kv[0]))
    if not order:
        return raw
    if raw.unlisted_at_most is not None and raw.other > 0 and raw.unlisted_at_most >= order[-1][1]:
        # not a top-N list: an unlisted token may outweigh listed ones (ids sharing one logprob string)
        t, k, top_p, min_p = sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
        if t == 1 and not k and top_p >= 1 and min_p <= 0:
            return raw
        raise NotDeterminable(f"ids that share a logprob string carry {raw.other:.3g} of the mass, and one may rank "
                              f"above a listed token: which tokens the settings keep (or, greedy, the top one) is "
                              f"not known")
    other = raw.other
    t, k, top_p, min_p = sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p
    if t <= 0:
        if len(order) > 1 and order[0][1] == order[1][1]:
            raise NotDeterminable("greedy: the reference's top two tokens tie (which one an engine takes is its "
                                  "convention)")
        return NextTokenLaw({order[0][0]: 1.0}, 0.0)
    if t != 1 and (top_p < 1 or min_p > 0):
        raise NotDeterminable(f"temperature {t:g} with top-p or min-p: engines apply temperature before (vLLM) or "
                              f"after (llama.cpp) truncating; a reference reporting post-sampling probabilities is "
                              f"needed")
    if top_p < 1 and min_p > 0:
        raise NotDeterminable("top-p with min-p: engines apply them in different orders (llama.cpp top-p first, "
                              "vLLM min-p first); a reference reporting post-sampling probabilities is needed")
    if k and (k < len(order) or other == 0):
        if k < len(order) and order[k - 1][1] == order[k][1]:
            raise NotDeterminable(f"top-k {k}: the {k}th and {k + 1}th tokens tie at the cut")
        order, other = order[:k], 0.0
    elif k and other > 0:
        raise NotDeterminable(f"top-k {k}: the reference listed only {len(order)} tokens; ask it for at least {k} "
                              f"(--n-probs)")
    total = sum(p for _, p in order) + other
    if top_p < 1:
        kept, mass = [], 0.0
        for token, p in order:
            kept.append((token, p))
            mass += p / total
            if mass >= top_p:
                break
        else:
            if other > 0:
                raise NotDeterminable(f"top-p {top_p:g}: the listed tokens hold {mass:.3f} of the mass; the cut "
                                      f"falls among the tokens the reference did not list (raise --n-probs)")
        order, other = kept, 0.0
    if min_p > 0:
        threshold = min_p * order[0][1]
        kept = [(token, p) for token, p in order if p >= threshold]
        if other > 0 and len(kept) == len(order):
            raise NotDeterminable(f"min-p {min_p:g}: every listed token passes the cut, so unlisted ones may too "
                                  f"(raise --n-probs)")
        order, other = kept, 0.0
    if t != 1:
        if other > 0:
            raise NotDeterminable(f"temperature {t:g} without truncation: the law needs every token's probability "
                                  f"(the reference listed {len(order)}; --n-probs at least the vocabulary)")
        weights = {token: p ** (1.0 / t) for token, p in order}
    else:
        weights = dict(order)
    total = sum(weights.values()) + other
    return NextTokenLaw({token: w / total for token, w in weights.items() if w > 0}, other / total)


def with_output_penalties(raw: NextTokenLaw, sampling, output: tuple[int, ...]) -> NextTokenLaw:
    """The raw law ``raw`` after vLLM's presence and frequency penalties over the output tokens
    ``output`` (``presence * (count > 0) + frequency * count`` off each one's logit, in float64, by
    ``exactcheck.contracts.policy.DecodingPolicy.penalize``, vLLM's convention), still a raw law for
    ``sampling_law_from_raw``. ``NotDeterminable``: a repetition penalty (sign-dependent); a
    penalised token the reference did not list (its mass is inside the unlisted cell); a penalised
    token pushed below the least listed one while truncation or greedy decoding needs the order of
    the unlisted tokens."""
    if sampling.repetition_penalty != 1.0:
        raise NotDeterminable(f"repetition penalty {sampling.repetition_penalty:g}: it divides a positive logit and "
                              f"multiplies a negative one, and the reference's log-probabilities (log-softmax) do not "
                              f"keep the logits' sign")
    if not (sampling.presence_penalty or sampling.frequency_penalty) or not output or not raw.probabilities:
        return raw
    import torch  # only a penalised world needs it

    from exactcheck.contracts.policy import DecodingPolicy
    unlisted = sorted(set(output) - set(raw.probabilities))
    if unlisted and raw.other > 0:
        raise NotDeterminable(f"presence/frequency penalty: the output token(s) {unlisted[:4]} are not among the "
                              f"{len(raw.probabilities)} the reference listed (raise --n-probs)")
    ids = sorted(raw.probabilities)
    x = torch.full((1, max(ids + list(output)) + 1), -math.inf, dtype=torch.float64)
    x[0, ids] = torch.log(torch.tensor([raw.probabilities[t] for t in ids], dtype=torch.float64))
    policy = DecodingPolicy(presence_penalty=float(sampling.presence_penalty),
                            frequency_penalty=float(sampling.frequency_penalty), penalty_convention="vllm")
    x = policy.penalize(x, [tuple(int(t) for t in output)])
    weights = {t: math.exp(float(x[0, t])) for t in ids}
    truncates = sampling.temperature <= 0 or sampling.temperature != 1 or sampling.top_k or sampling.top_p < 1 \
        or sampling.min_p > 0
    if raw.other > 0 and truncates and min(weights.values()) < min(raw.probabilities.values()):
        raise NotDeterminable("presence/frequency penalty: a penalised token fell below the least listed one, so "
                              "where it stands among the unlisted tokens is not known (raise --n-probs)")
    total = sum(weights.values()) + raw.other
    bound = None if raw.unlisted_at_most is None else raw.unlisted_at_most / total
    return NextTokenLaw({t: w / total for t, w in weights.items()}, raw.other / total, unlisted_at_most=bound)
