"""The verdicts of a serve audit, one function per check: the continuation law of a (prompt,
sampling) world, several samples of one request, greedy identity with speculation on vs off,
logprob fidelity, whether speculation ran, and seed reproducibility. ``exactcheck.serve.runner`` decides when each is made;
``exactcheck.core.apply_holm`` decides the statistical ones."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from exactcheck.core import sample_law_verdict
from exactcheck.options import Category, CheckKind, PseudoWorld
from exactcheck.reachability import observed_in
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, TotalVariation, Verdict
from exactcheck.endpoints.continuation_law import ContinuationLaw
from exactcheck.endpoints.draft_counts import DraftTally
from exactcheck.endpoints.endpoint import Completion
from exactcheck.stats.laws import LawPlan
from exactcheck.stats.pairs import same_cell_after, same_cell_pairs
from exactcheck.stats.rates import RateComparison, fewer_positives_pvalue
from exactcheck.stats.two_sample import two_sample_test
from exactcheck.serve.check_kinds import DECLARED_SETTINGS, LOGPROB_FIDELITY, SEED_REPRODUCIBILITY, SPECULATION

__all__ = ["continuation_law_verdict", "two_sample_verdict", "independent_samples_verdict", "concurrent_requests_verdict", "greedy_verdict",
           "logprob_verdict",
           "speculation_verdict", "seed_verdict", "settings_verdict", "LOSSY_SETTINGS", "NEAR_TIE", "NOISE_MARGIN",
           "cell_indices"]

# greedy identity: a first divergence where the reference's top two tokens are closer than this
# (in probability) is a numerical near-tie (batch-shape arithmetic), not a defect; the runner
# widens it to NOISE_MARGIN times the reference's own arithmetic noise where it measured more
NEAR_TIE = 1e-3
# logprob fidelity and near-ties: how far past the reference's own largest prefill-vs-decode gap an
# exact server's numbers may fall (its kernels, batch shapes and dtype are not the reference's)
NOISE_MARGIN = 4.0


def cell_indices(law: ContinuationLaw, completions: list[Completion]) -> np.ndarray:
    return np.array([law.cell_of(c.tokens) for c in completions], dtype=np.int64)


def continuation_law_verdict(law: ContinuationLaw, completions: list[Completion], condition: str, share: float,
                             alpha: float, base: dict, cause: str | None = None) -> Verdict:
    """The law of the first ``law.length`` tokens of the audited server's answers against the law
    the reference's next-token laws give (``exactcheck.endpoints.continuation_law``); ``cause``: words
    the caller knows for what went wrong (answers ending where no stop string is), else read from
    the counts."""
    indices = cell_indices(law, completions)
    counts = np.bincount(indices, minlength=law.expected.size).astype(np.int64)
    plan = LawPlan("continuation", condition, law.expected, law.label)
    verdict = sample_law_verdict(plan, counts, share, alpha, base, CheckKind.GENERATOR_LAW, "requests",
                                 cause or _cause(law, indices, completions))
    return replace(verdict, summary=f"{verdict.summary}; {law.note}") if law.note else verdict


def two_sample_verdict(audited: list[Completion], reference: list[Completion], condition: str, share: float,
                       base: dict, why: str) -> Verdict:
    """A world whose law the audit cannot compute (``why``: a constraint with no local engine, a JSON
    schema): the audited server's answers against the reference server's answers to the same
    requests, speculation off there, each answer one outcome (its tokens, its end included): the
    permutation test of ``exactcheck.stats.two_sample`` at ``share`` (through Holm like any law). Stated
    as such: it says the two servers' laws differ, not which is the target's."""
    test = two_sample_test([tuple(a.tokens) for a in audited], [tuple(r.tokens) for r in reference], share,
                           seed=base["seed"])
    m, n = test.samples
    low, high = test.tv_interval
    summary = (f"two-sample test against the reference server's answers to the same requests, speculation off "
               f"there ({why}: the law is not computed here): {m:,} audited and {n:,} reference answers, TV "
               f"{test.tv_estimate:.4f} (95% interval {low:.4f} to {high:.4f}), p = {test.pvalue:.3g} over "
               f"{test.splits:,} random splits")
    if test.only_first:
        summary += (f"; {test.only_first:,} audited answers fell on outcomes the reference never gave (the commonest: "
                    f"{list(test.example)})")
    return Verdict(outcome=Outcome.EXACT, summary=summary, check=f"{base['world']}/continuation", law="continuation",
                   condition=condition, samples=m, kind=CheckKind.GENERATOR_LAW, **base, evidence=LawEvidence(
                       Evidence.FIXED_BUDGET, statistic=test.statistic,
                       statistic_name=f"Pearson X^2 of the two samples (permutation p-value, {test.splits:,} splits)",
                       df=test.df, pvalue=test.pvalue,
                       tv=TotalVariation(test.tv_estimate, test.tv_interval, test.detectable_tv)))


def independent_samples_verdict(law: ContinuationLaw, groups: list[list[Completion]], condition: str, share: float,
                                alpha: float, base: dict) -> Verdict:
    """Several samples of one request (``groups``: each request's answers, as the server ordered
    them) against the law: every sample pooled into the continuation test, and the disjoint pairs
    within a request counted where both fall in one cell (``exactcheck.stats.pairs``: independent
    draws make that Binomial(pairs, sum p**2)). One p-value: Bonferroni over the two, each at half
    the check's share (a law test on samples that are not independent is still valid where they
    are: the null is independent draws of the law)."""
    cells = [cell_indices(law, group) for group in groups]
    flat = np.concatenate(cells) if cells else np.zeros(0, dtype=np.int64)
    counts = np.bincount(flat, minlength=law.expected.size).astype(np.int64)
    plan = LawPlan("independent_samples", condition, law.expected, law.label)
    pooled = sample_law_verdict(plan, counts, share / 2, alpha, base, CheckKind.GENERATOR_LAW, "samples")
    pairs = same_cell_pairs(cells, law.expected)
    words = (f"pairs of one request in one cell: {pairs.same:,} of {pairs.pairs:,} (independent draws: about "
             f"{pairs.expected:,.1f}, p = {pairs.pvalue:.3g})")
    e = pooled.evidence
    if e.basis is not Evidence.FIXED_BUDGET:  # samples on outcomes of probability 0: deterministic
        return replace(pooled, summary=f"{pooled.summary}; {words}")
    pvalue = min(1.0, 2 * min(e.pvalue, pairs.pvalue))
    summary = (f"{len(flat):,} samples from {len(groups):,} requests of {max(map(len, groups), default=0)}: pooled "
               f"law TV {e.tv.estimate:.4f}, p = {e.pvalue:.3g}; {words}; Bonferroni p = {pvalue:.3g}")
    if pairs.pvalue <= min(share, e.pvalue):  # the pair count is the evidence, and more than chance
        summary += ("; the samples of one request repeat each other: they share their random numbers (every "
                    "sample of a request seeded alike, or one draw copied)" if pairs.same > pairs.expected else
                    "; the samples of one request differ more often than independent draws do (made to differ)")
    return replace(pooled, summary=summary, evidence=replace(
        e, pvalue=pvalue, statistic_name="Pearson X^2 (pooled; the p-value: Bonferroni with the same-cell pair count)"))


def concurrent_requests_verdict(law: ContinuationLaw, completions: list[Completion], pairs: list[tuple[int, int]],
                                condition: str, share: float, alpha: float, base: dict, concurrency: int) -> Verdict:
    """Requests in flight together are independent draws of the law: ``pairs`` (disjoint pairs of
    this world's requests that were in flight at the same time, ``serve.traffic.concurrent_pairs``: the
    first sent, then the next one sent before the first was answered) fall in one cell as often as
    independent draws do. Which requests pair up depends on how long the first one's answer took (a
    longer answer stays in flight longer), so the test is conditional on the first one's cell: the
    second falls in it with probability p[cell], and the count is Poisson-binomial exactly
    (``exactcheck.stats.pairs.same_cell_after``; Binomial(pairs, sum p**2) would be biased wherever
    answers' lengths differ, as they do where answers end early). Requests sharing one random stream (unseeded requests of a batch
    handed the same random numbers, TensorRT-LLM #19487; a seed taken from a batch mate) repeat each
    other and push the count up. Inconclusive where no two were in flight together."""
    check = dict(check=f"{base['world']}/concurrent_requests", law="concurrent_requests",
                 condition=f"pairs of requests in flight together (up to {concurrency} at once): {condition}",
                 kind=CheckKind.GENERATOR_LAW, **base)
    if not pairs:
        return Verdict(outcome=Outcome.INCONCLUSIVE, samples=0, evidence=LawEvidence(Evidence.NONE), summary=(
            "not judged: no two of this world's requests were in flight together (--concurrency 1, or answers "
            "from the journal)"), **check)
    cells = cell_indices(law, completions)
    count = same_cell_after([(int(cells[i]), int(cells[j])) for i, j in pairs], law.expected)
    words = (f"pairs of concurrent requests in one cell: {count.same:,} of {count.pairs:,} (independent draws: about "
             f"{count.expected:,.1f}), p = {count.pvalue:.3g}")
    if count.pvalue <= share:
        words += ("; requests in flight together repeat each other: they share their random numbers (one random "
                  "stream for a batch, or a batch mate's seed)" if count.same > count.expected else
                  "; requests in flight together differ more often than independent draws do")
    return Verdict(outcome=Outcome.EXACT, samples=2 * count.pairs, summary=words, **check, evidence=LawEvidence(
        Evidence.FIXED_BUDGET, statistic=float(count.same),
        statistic_name="pairs in one cell (exact Poisson-binomial test, given the first's cell)",
        pvalue=count.pvalue))


def _cause(law: ContinuationLaw, indices: np.ndarray, completions: list[Completion]) -> str | None:
    """Words for what a law deviation looks like (the test decides the verdict): every answer the
    same, or answers less (more) likely than the law says on average (sampled hotter or colder)."""
    p = law.expected
    distinct = len({c.tokens for c in completions})
    expected_distinct = float(np.sum(1.0 - (1.0 - p) ** len(completions)))
    if len(completions) > 1 and distinct < 0.5 * expected_distinct:
        return (f"far fewer distinct answers than the law gives ({distinct:,} in {len(completions):,} requests, where "
                f"about {expected_distinct:,.0f} are expected): answers repeated across seeds (a response cache keyed "
                f"without the seed, a seed ignored, or greedy decoding)")
    # the surprisal of one continuation, over the cells that are one continuation each: a pooled cell
    # (the tokens the reference did not list, merged; an unexpanded prefix) has the probability of many
    # answers, so landing in it says nothing of how likely the answer was (a hotter server lands there
    # more often and would look colder); the comparison is conditional on a single-continuation cell
    single = np.zeros(p.size, dtype=bool)
    single[:len(law.cells)] = [kind in ("full", "stopped") for _, kind in law.cells][:p.size]
    live = single & (p > 0)
    if not live.any():
        return None
    weight = np.where(live, p, 0.0) / float(np.sum(p[live]))
    surprisal = -np.log(np.where(live, p, 1.0))
    mean, var = float(np.sum(weight * surprisal)), float(np.sum(weight * surprisal ** 2))
    seen = surprisal[indices][live[indices]]
    if seen.size < 2:
        return None
    se = np.sqrt(max(var - mean ** 2, 0.0) / seen.size)
    shift = float(seen.mean()) - mean
    if se == 0 or abs(shift) < 4 * se:
        return None
    how = ("hotter than the settings (a higher temperature, or a truncation not applied)" if shift > 0
           else "colder than the settings (a lower temperature, or a truncation the settings do not ask for)")
    return (f"the answers are {'less' if shift > 0 else 'more'} likely than the law says (mean surprisal "
            f"{seen.mean():.3f} against {mean:.3f} expected): sampled {how}")


def greedy_verdict(pairs: list[tuple[list[int], tuple[int, ...], tuple[int, ...]]], margins: dict, base: dict,
                   law: str = "greedy_identity", condition: str | None = None, near_tie: float = NEAR_TIE) -> Verdict:
    """Greedy output of two paths, token for token, per prompt (by default speculation on, the
    audited server, against off, the reference; ``greedy_under_load``: alone against under
    concurrent load); each divergence classified by the reference's margin between its top two
    tokens at the first differing position (``margins``: pair index -> (position, margin))."""
    diverged = [(i, a, r) for i, (_, a, r) in enumerate(pairs) if a != r]
    common = dict(base, check=f"{base['world']}/{law}", law=law, kind=CheckKind.GREEDY_IDENTITY,
                  condition=condition or f"temperature 0, {len(pairs)} prompts, speculation on vs off", samples=len(pairs))
    if not diverged:
        return Verdict(outcome=Outcome.EXACT, summary=f"identical on all {len(pairs)} pairs", **common)
    # a margin of None: the reference could not be asked there (a text-prompt server), so no near-tie is ruled out
    real = [(i, a, r) for i, a, r in diverged if (margins.get(i, (0, 1.0))[1] or 0.0) >= near_tie
            and margins.get(i, (0, 1.0))[1] is not None]
    i, a, r = (real or diverged)[0]
    position, margin = margins.get(i, (None, None))
    where = f"prompt {i}: first difference at token {position}: speculation on gave {a[position] if position is not None and position < len(a) else 'the end'}, off gave {r[position] if position is not None and position < len(r) else 'the end'}"
    if not real:
        unknown = sum(margins.get(j, (0, 1.0))[1] is None for j, _, _ in diverged)
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"{len(diverged)} of {len(pairs)} prompts differ, each at a numerical near-tie (the reference's top two "
            f"tokens within {near_tie:g}: batch-shape arithmetic, not a defect)"
            + (f" or where the reference's top two cannot be read ({unknown}: a prefix a text-prompt server cannot be "
               f"sent, or ids sharing a logprob string)" if unknown else "")
            + f"; {where}, margin " + ("not known" if margin is None else f"{margin:.2e}")), **common)
    return Verdict(outcome=Outcome.DEFECT, summary=(
        f"{len(real)} of {len(pairs)} prompts diverge where the reference's top token leads by at least {near_tie:g}: "
        f"{where}, the reference's margin {margin:.3f}"), **common, evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(len(real), len(pairs), "prompts diverging:")))


def logprob_verdict(rows: list[tuple[int, int, float, float]], tolerance: float, requests: int, base: dict,
                    noise: float | None = None) -> Verdict:
    """The probabilities the audited server reported for its own tokens against the reference's
    for the same token after the same prefix (``rows``: request, position, reported, reference).
    No chance enters (an exact engine reports a function of the prefix); arithmetic does, so the
    tolerance is ``tolerance`` or ``NOISE_MARGIN`` times ``noise``, the reference's own largest gap
    between the probabilities it reports while decoding and those of a one-token request, whichever
    is larger (None: not measured, the reference being the audited server)."""
    if noise is not None:
        tolerance = max(tolerance, NOISE_MARGIN * noise)
    measured = ("the reference's own decode-vs-prefill noise not measured (no separate reference)" if noise is None
                else f"the reference's own decode-vs-prefill noise {noise:.1e}")
    common = dict(base, check=f"{base['world']}/logprob_fidelity", law="logprob_fidelity",
                  kind=LOGPROB_FIDELITY, samples=requests,
                  condition=f"{requests} requests with n_probs, |reported - reference| <= {tolerance:g} in probability "
                            f"({measured})")
    if not rows:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary="not judged: the server reported no probabilities",
                       **common)
    gaps = [(abs(reported - reference), r, t, reported, reference) for r, t, reported, reference in rows]
    gap, request, position, reported, reference = max(gaps)
    if gap <= tolerance:
        return Verdict(outcome=Outcome.EXACT, summary=f"{len(rows):,} token probabilities within {gap:.2e} of the "
                                                      f"reference's", **common)
    bad = [g for g in gaps if g[0] > tolerance]
    zero = all(g[3] in (0.0, 1.0) for g in gaps)
    ones = all(g[3] == 1.0 for g in bad)
    later = all(g[2] > 0 for g in bad) and any(g[2] == 0 for g in gaps)
    if zero:
        cause = "every reported probability is 0 or 1 (logprob 0.0 or -inf: llama.cpp #27972, vLLM #17876)"
    elif ones and later:
        cause = ("the tokens after the first are reported with probability 1.0 (logprob 0.0) while the first is "
                 "right: the probabilities of tokens a verification step emitted are not filled in (llama.cpp "
                 "#27972, PR #27196)")
    elif later:
        cause = ("only tokens after the first are off: the first (read after the prefill) is right, the decoded ones "
                 "are not: the probabilities reported for later tokens (llama.cpp PR #27196), or the model's own "
                 "decode path (a state or kernel that differs from the prefill's, as vLLM-CPU's recurrent kernels "
                 "under speculation: docs/serving.md)")
    else:
        cause = "the reported probabilities are not the target's"
    return Verdict(outcome=Outcome.DEFECT, summary=(
        f"{len(bad):,} of {len(rows):,} token probabilities differ from the reference's by more than {tolerance:g}: "
        f"{cause}; the largest at request {request}, token {position}: reported {reported:.4f}, reference "
        f"{reference:.4f}"), **common, evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(len(bad), len(rows), "token probabilities off:")))


def speculation_verdict(law: DraftTally, probed: DraftTally, share: float, base: dict) -> Verdict:
    """Whether the server speculated, by its own counters (``exactcheck.endpoints.draft_counts``):
    on the law requests, and on the requests that asked for probabilities against the law
    requests (vLLM #34497: asking for logprobs silently switched speculation off), by the test of
    ``exactcheck.stats.rates`` at the audit's Holm share. A count is evidence only through that
    test: an n-gram drafter drafts only where the context repeats, so few drafts, or none on a few
    probes, is what an exact server gives on many workloads."""
    common = dict(base, check=f"{base['world']}/speculation_ran", law="speculation_ran", kind=SPECULATION,
                  samples=law.requests + probed.requests, category=Category.SPECULATION,
                  condition=f"{law.source.value}; a unit: {law.unit_words(1)}")
    ran = (f"{law.positive:,} of {law.unit_words()} drafted ({law.drafted:,} tokens drafted, {law.accepted:,} "
           f"accepted)")
    if law.uncounted:
        ran += (f"; {law.uncounted:,} request{'s' * (law.uncounted != 1)} not counted (answered from the journal, "
                "or a short last chunk)")
    if not law.units:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not judged: none of the {law.requests:,} requests' drafts could be counted (server-wide counters move "
            f"only for requests sent in this run, not for answers taken from the journal)"),
            evidence=LawEvidence(Evidence.NONE), **common)
    if law.positive == 0 and probed.positive == 0:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not judged: no draft counted on {law.requests + probed.requests:,} requests ({ran}): speculation did not "
            f"run on this workload, or the server reports no counters, so the law checks say nothing about "
            f"speculative decoding here (a draft model "
            f"drafts on every request longer than one token; an n-gram drafter only where the context repeats: "
            f"start the server with speculation on, or give prompts that repeat)"),
            evidence=LawEvidence(Evidence.NONE), **common)
    n = len(probed.units)
    comparison = RateComparison(law.positive, len(law.units), probed.positive, n)
    seen = (f"on the {probed.requests:,} requests that asked for probabilities, {probed.positive:,} of "
            f"{probed.unit_words()} drafted where {comparison.expected:,.1f} are expected at the law requests' rate")
    if fewer_positives_pvalue(law.positive, len(law.units), 0, n) > share:  # (no positive law unit: 1)
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"speculation ran ({ran}); not judged on the requests that asked for probabilities: drafts too rare on "
            f"this workload to tell ({comparison.expected:,.1f} drafting units expected on the probes; even none "
            f"would not be evidence at the alpha share {share:.3g})"), evidence=LawEvidence(Evidence.NONE), **common)
    pvalue = comparison.pvalue
    fewer = probed.positive < comparison.expected
    cause = ("; fewer than expected: asking for probabilities switched speculation off (vLLM #34497)"
             if fewer and pvalue <= share else "")
    return Verdict(outcome=Outcome.EXACT, summary=f"speculation ran: {ran}; {seen}, p = {pvalue:.3g}{cause}",
                   evidence=LawEvidence(Evidence.FIXED_BUDGET, statistic=float(probed.positive),
                                        statistic_name="probed units that drafted", pvalue=pvalue), **common)


# the speculation settings a server exposes that name a registered lossy rule: (setting keys, rule,
# the rule's parameter for each key); the rule is exact where every parameter is at its exact value
LOSSY_SETTINGS = ((("speculative_accept_threshold_single", "speculative_accept_threshold_acc"), "sglang-threshold",
                   ("single", "acc")),)


def settings_verdict(settings: dict, base: dict) -> Verdict:
    """The server's verification settings where it exposes them (SGLang's ``/get_server_info``,
    llama.cpp's ``/slots``): a setting of a registered lossy rule away from its exact value is a
    finding, with the rule's exact TV on the built-in step worlds (``exactcheck lossy``)."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted(settings.items())) or "none"
    common = dict(base, check="server/declared_settings", law="declared_settings", kind=DECLARED_SETTINGS,
                  samples=0, condition=f"the speculation settings the server exposes: {shown}"[:400])
    if not settings:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            "not judged: the server exposes no speculation settings (llama.cpp shows them in /slots, SGLang in "
            "/get_server_info; vLLM through no endpoint)"), **common)
    for keys, rule, parameters in LOSSY_SETTINGS:
        values = {name: settings[key] for key, name in zip(keys, parameters)
                  if isinstance(settings.get(key), (int, float)) and not isinstance(settings.get(key), bool)}
        if not values:
            continue
        from exactcheck.rules import rule_spec
        spec = rule_spec(rule, **{k: float(v) for k, v in values.items()})
        if spec.exact:
            continue
        tv = _largest_tv(spec)
        line = " ".join(f"--param {k}={v:g}" for k, v in values.items())
        return Verdict(outcome=Outcome.DEFECT, summary=(
            f"the server verifies with a lossy setting: {spec.label}; its exact TV from the target's law is up to "
            f"{tv:.4f} on the built-in step worlds (exactcheck lossy {rule} {line})"), **common,
            evidence=FindingEvidence(pvalue=0.0))
    return Verdict(outcome=Outcome.EXACT, summary=f"no lossy setting among those exposed ({shown})"[:300], **common)


def _largest_tv(spec) -> float:
    from exactcheck.rules import output_tv
    from toy_models.suite import default_worlds
    return max(output_tv(spec, world) for world in default_worlds())


def seed_verdict(pairs: list[tuple[int, tuple[int, ...], tuple[int, ...]]], base: dict) -> Verdict:
    """The same request with the same seed, twice: the same tokens (reproducibility, not exactness:
    an exact engine whose kernels are not batch-invariant can give other tokens when the two
    requests meet other batches, which is why the category does not gate unless asked)."""
    differ = [(seed, a, b) for seed, a, b in pairs if a != b]
    common = dict(base, check=f"{base['world']}/same_seed", law="same_seed", kind=SEED_REPRODUCIBILITY,
                  samples=len(pairs), category=Category.REPRODUCIBILITY,
                  condition=f"{len(pairs)} seeded requests, each sent twice")
    if not differ:
        return Verdict(outcome=Outcome.EXACT, summary=f"the same tokens on all {len(pairs)} repeated requests", **common)
    seed, a, b = differ[0]
    return Verdict(outcome=Outcome.DEFECT, summary=(
        f"{len(differ)} of {len(pairs)} requests gave other tokens the second time with the same seed (seed {seed}: "
        f"{list(a)} then {list(b)})"), **common, evidence=FindingEvidence(
            pvalue=0.0, reachability=observed_in(len(differ), len(pairs), "repeats that differ:")))


def server_failed_verdict(error, server: str, role: str, sent: int, seed: int, journal: str | None) -> Verdict:
    """The audited (or reference) server stopped answering a valid request mid-audit: 5xx or refused
    connections after every retry, a time-out storm, an answer that is not JSON, too large or never
    ending. The most severe finding a server can have: a crash verdict (exit 1), never a usage
    error; the requests in flight are named as ``curl`` lines that send them again."""
    from exactcheck.endpoints.client import curl_line
    lines = [curl_line(url, body) for url, body in error.requests[:4]]
    resume = f"; the answers so far are in {journal}: rerun with --resume against a restarted server" if journal \
        else "; give --journal (or --report) to resume against a restarted server"
    return Verdict(check=f"{PseudoWorld.PROCESS.value}/server_answers", law="server_answers",
                   world=PseudoWorld.PROCESS.value, seed=seed, samples=sent, kind=CheckKind.CONTRACT,
                   condition=f"every request the audit sends to the {role} server ({server})",
                   outcome=Outcome.CRASHED, evidence=FindingEvidence(pvalue=0.0),
                   summary=(f"the {role} server stopped answering valid requests after {sent:,} answers: {error}"
                            f"{resume}. Requests in flight: " + " ; ".join(lines or ["(none recorded)"])),
                   reproduce=lines[0] if lines else "")
