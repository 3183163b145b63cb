"""Streamed answers: a share of each world's requests asks its answer as a stream of events, and the
audit judges what a streaming user receives.

A stream is reassembled by its dialect (``Endpoint.read_stream``: every event's token ids, text and
probabilities joined in order). Each streamed request repeats the seed of one of the world's
non-streamed requests, so the two answers can be set side by side. The ``streamed`` check of a world:

- the law of the streamed answers (the world's continuation law, Pearson under Holm; an answer the
  law cannot produce, such as one a token short or a token long, is a deterministic finding);
- what must hold of every streamed answer whatever the sample: the completion tokens its usage counts
  are the tokens it carried (a world of exactly L tokens, no stop strings); its text holds no stop
  string (engines cut the text before the stop: a stream that runs past it shows text the answer
  does not have); where it carries the same token ids as the non-streamed answer of its seed, the
  same text (the text of the deltas is the text of the ids: vLLM #52469 dropped words from streamed
  text only). Each is a finding of probability 0 (exactness);
- where the server honours seeds, whether it carries the same ids as the non-streamed answer of its
  seed: said in the verdict, never a finding of its own (an exact server's batch arithmetic may
  legitimately change one sample; the same_seed check judges whether seeds reproduce).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from exactcheck.core import sample_law_verdict
from exactcheck.endpoints.continuation_law import ContinuationLaw
from exactcheck.endpoints.endpoint import Completion
from exactcheck.options import CheckKind
from exactcheck.report.verdict import Evidence, LawEvidence, Outcome, Verdict
from exactcheck.stats.laws import LawPlan

__all__ = ["streamed_verdict", "stream_problems"]


def stream_problems(plain: Sequence[Completion], streamed: Sequence[Completion], length: int,
                    stops: Sequence[str], exact_length: bool) -> list[str]:
    """What every streamed answer must keep, whatever its sample (``streamed[i]`` repeats the seed of
    ``plain[i]``): one line per broken rule, with how many answers break it and the first example."""
    found: dict[str, list[str]] = {}
    for i, (p, s) in enumerate(zip(plain, streamed)):
        if exact_length and s.usage_tokens is not None and s.usage_tokens != len(s.tokens):
            found.setdefault("usage", []).append(f"request {i}: the usage counts {s.usage_tokens} completion tokens, "
                                                 f"the stream carried {len(s.tokens)}")
        if s.text and any(stop in s.text for stop in stops):
            stop = next(stop for stop in stops if stop in s.text)
            found.setdefault("stop", []).append(f"request {i}: the streamed text {s.text!r} holds the stop string "
                                                f"{stop!r} (the answer ends before it)")
        if p.tokens == s.tokens and p.text is not None and s.text is not None and p.text != s.text:
            found.setdefault("text", []).append(f"request {i}: ids {list(s.tokens)[:8]}: the streamed text "
                                                f"{s.text!r}, the answer's {p.text!r}")
    words = {"usage": "streamed answers whose usage does not count the tokens they carried",
             "stop": "streamed answers whose text runs past a stop string",
             "text": "streamed answers whose text is not the text of their ids (the non-streamed answer of the same "
                     "seed carries the same ids and other text)"}
    return [f"{len(examples):,} {words[key]} (e.g. {examples[0]})" for key, examples in found.items()]


def streamed_verdict(law: ContinuationLaw, plain: Sequence[Completion], streamed: Sequence[Completion],
                     condition: str, share: float, alpha: float, base: dict, *, stops: Sequence[str] = (),
                     exact_length: bool = True, seeded: bool = True, cells=None) -> Verdict:
    """The ``streamed`` check of a world (see the module docstring). ``cells``: how an answer maps to
    the law's cells (``serve.verdicts.cell_indices``)."""
    problems = stream_problems(plain, streamed, law.length, stops, exact_length)
    carried = [n for s in streamed for n in (s.events or ())]
    how = (f"{len(streamed):,} streamed answers in {sum(len(s.events or ()) for s in streamed):,} events "
           f"(up to {max(carried, default=0)} token{'s' * (max(carried, default=0) != 1)} an event)")
    common = dict(check=f"{base['world']}/streamed", law="streamed", condition=f"streamed answers: {condition}",
                  kind=CheckKind.GENERATOR_LAW, **base)
    if problems:
        return Verdict(outcome=Outcome.DEFECT, samples=len(streamed), summary=f"{how}: " + "; ".join(problems),
                       evidence=LawEvidence(Evidence.DETERMINISTIC, pvalue=0.0), **common)
    indices = cells(law, streamed)
    counts = np.bincount(indices, minlength=law.expected.size).astype(np.int64)
    verdict = sample_law_verdict(LawPlan("streamed", common["condition"], law.expected, law.label), counts, share,
                                 alpha, base, CheckKind.GENERATOR_LAW, "streamed answers")
    differing = [i for i, (p, s) in enumerate(zip(plain, streamed)) if p.tokens != s.tokens] if seeded else []
    note = f"{how}; " + (f"{len(differing):,} carry other ids than the non-streamed answer of their seed (e.g. request "
                         f"{differing[0]}: {list(streamed[differing[0]].tokens)[:8]} against "
                         f"{list(plain[differing[0]].tokens)[:8]})" if differing else
                         "each the same ids and text as the non-streamed answer of its seed" if seeded else
                         "unseeded: not set beside the non-streamed answers")
    return replace(verdict, summary=f"{note}; {verdict.summary}")
