"""The serve audit: a running server, black box, against a reference with speculation off.

world (a prompt and the sampling settings users set) -> the reference's next-token laws -> the
exact law of the first L tokens (``continuation_law``; cut at the first stop string where the world
has some, ``stop_law``) -> planned requests to the audited server -> cells -> Pearson under Holm
-> verdicts; then several samples of one request (``independent_samples``), greedy identity
(speculation on vs off, each divergence classified by the reference's margin), logprob fidelity,
whether speculation ran (the server's own counters), and seed reproducibility.

The law comes from the reference, never from the audited server's own numbers. ``reference``
may be the audited URL itself: llama.cpp drafts only after a request's first token, so a
one-token request is the target alone; the report says which reference it used.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from exactcheck.audit_run import AuditRun
from exactcheck.core import not_run_verdict, run_environment, unreached_verdicts
from exactcheck.errors import UsageError
from exactcheck.options import AlphaBudget, AuditOptions, Category, Check, CheckKind, derive_seed
from exactcheck.serve.reproduce import serve_audit_line
from exactcheck.serve.result import ServeAuditResult
from exactcheck.report.verdict import Verdict
from exactcheck.serve.chat import ChatPrompt, ChatRequests, reproduce_flags, template_tokens
from exactcheck.endpoints.client import Client, EndpointError
from exactcheck.endpoints.continuation_law import ContinuationLaw, expand
from exactcheck.endpoints.draft_counts import CounterSource, DraftTally, probes_needed, send_counted, send_counted_mixed
from exactcheck.endpoints.apis import open_endpoint
from exactcheck.endpoints.endpoint import GREEDY_SAMPLING, POST_SAMPLING, Completion, Endpoint, Sampling, complete_mixed
from exactcheck.endpoints.sampler_law import NotDeterminable
from exactcheck.endpoints.text_prompts import one_token_path
from exactcheck.serve.settings import DEFAULT_PROMPTS, DEFAULT_SAMPLINGS, ServeSettings
from exactcheck.endpoints.constraints import matcher
from exactcheck.serve.constraint_law import ConstraintMask, confirmed_outside, constrained_law, outside
from exactcheck.serve.stop_law import ends_disagreeing, returned_text, stop_depth, stopped_law
from exactcheck.serve.finishing import as_ended, finish_verdict, parse_ids, reference_next_token
from exactcheck.serve.streaming import streamed_verdict
from exactcheck.serve.traffic import MIXED, concurrent_pairs, interleaved, traffic_mix
from exactcheck.serve.verdicts import (NEAR_TIE, NOISE_MARGIN, cell_indices, concurrent_requests_verdict,
                                       continuation_law_verdict,
                                       greedy_verdict,
                                       independent_samples_verdict, logprob_verdict, seed_verdict,
                                       server_failed_verdict, settings_verdict, speculation_verdict,
                                       two_sample_verdict)
from exactcheck.stats.planning import trials_to_detect
from exactcheck.serve.check_kinds import (ANSWER_END, DECLARED_SETTINGS, LOGPROB_FIDELITY, SEED_REPRODUCIBILITY,
                                          SPECULATION)

__all__ = ["ServeWorld", "ServeSettings", "run_serve_audit", "serve_worlds", "serve_checks", "serve_budget",
           "DEFAULT_PROMPTS", "DEFAULT_SAMPLINGS", "REQUEST_CAPS"]

REQUEST_CAPS = {"quick": 12_000, "standard": 100_000, "release": 400_000}  # sampled requests per world at most
# the prefix tree of the reference law: expanded while a prefix's mass is at least this, in at most
# this many reference requests (what is not expanded is merged into exact cells, never guessed)
EXPANSION = {"quick": (1e-2, 200), "standard": (1e-3, 1_000), "release": (2e-4, 4_000)}


@dataclass(frozen=True)
class ServeWorld:
    """A prompt (token ids) and the sampling settings users set; ``chat``: the conversation whose
    template made the prompt, for a world audited through the chat endpoint (``serve.chat``)."""

    name: str
    prompt: tuple[int, ...]
    sampling: Sampling
    length: int
    chat: ChatPrompt | None = None
    unseeded: bool = False  # its requests carry no seed (what most users send): the server draws its own

    def describe(self) -> str:
        if self.unseeded:
            return f"{ServeWorld(self.name, self.prompt, self.sampling, self.length, self.chat).describe()}, unseeded"
        if self.chat is not None:
            return (f"the first {self.length} tokens of the chat answer to {self.chat.describe()} (prompt: the "
                    f"{len(self.prompt)} tokens of {self.chat.source or 'its chat template'}), "
                    f"{self.sampling.describe()}")
        return f"the first {self.length} tokens after prompt {list(self.prompt)}, {self.sampling.describe()}"


def serve_worlds(prompts: list, samplings, length: int, unseeded: bool = False,
                 finishing: bool = False) -> list[ServeWorld]:
    """One world per prompt and sampling: ``p{i}-...`` for a prompt of token ids, ``c{i}-...`` for a
    conversation (a ``ChatPrompt``, its ids those its template made: empty before they are known);
    ``unseeded``: and the first prompt's first sampling again with unseeded requests (``...-unseeded``);
    ``finishing``: and again with answers that may end on an end-of-generation token (``...-ends``:
    ``ignore_eos`` off), where no world asks that already."""
    worlds, counts = [], {"p": 0, "c": 0}
    for p in prompts:
        chat = p if isinstance(p, ChatPrompt) else None
        letter = "c" if chat is not None else "p"
        worlds += [ServeWorld(f"{letter}{counts[letter]}-{_sampling_name(s)}", tuple(chat.ids if chat else p), s,
                              length, chat) for s in samplings]
        counts[letter] += 1
    first = next((w for w in worlds if not w.sampling.greedy), None)
    if unseeded and first is not None:
        worlds.append(dataclasses.replace(first, name=f"{first.name}-unseeded", unseeded=True))
    plain = next((w for w in worlds if not w.sampling.greedy and w.chat is None and not w.sampling.stop
                  and w.sampling.constraint is None), None)
    if finishing and plain is not None and not any(w.sampling.finishes and w.sampling.constraint is None
                                                   for w in worlds):
        worlds.append(dataclasses.replace(plain, name=f"{plain.name}-ends",
                                          sampling=dataclasses.replace(plain.sampling, ignore_eos=False)))
    return worlds


def _sampling_name(s: Sampling) -> str:
    """A world's name for its sampling: its spec, a constraint by its tag (``Constraint.tag``)."""
    plain = dataclasses.replace(s, constraint=None, ignore_eos=True if s.constraint else s.ignore_eos)
    name = plain.spec().replace("=", "").replace(",", "-").replace(".", "_") or "t1"
    return f"{name}-{s.constraint.tag()}" if s.constraint is not None else name



def serve_budget(alpha: float, worlds: int) -> AlphaBudget:
    """Holm over each world's five statistical checks: its continuation law, its streamed answers'
    law, its independent_samples and concurrent_requests tests and its speculation_ran test."""
    return AlphaBudget(alpha, 5 * max(worlds, 1), stop_early=False)


def serve_checks(worlds) -> list[Check]:
    """The checks a serve audit reports, in order: per world its continuation law, its streamed
    answers, several samples of one request, concurrent requests, what each answer says of its end,
    logprob fidelity, seed reproducibility and speculation counters; then greedy identity alone and
    under load, and the server's declared settings."""
    checks = [Check(f"{w.name}/{law}", kind, w.name, law) for w in worlds for law, kind in
              (("continuation", CheckKind.GENERATOR_LAW), ("streamed", CheckKind.GENERATOR_LAW),
               ("independent_samples", CheckKind.GENERATOR_LAW),
               ("concurrent_requests", CheckKind.GENERATOR_LAW), ("finish", ANSWER_END),
               ("logprob_fidelity", LOGPROB_FIDELITY),
               ("same_seed", SEED_REPRODUCIBILITY), ("speculation_ran", SPECULATION))]
    checks += [Check(f"greedy/{law}", CheckKind.GREEDY_IDENTITY, "greedy", law)
               for law in ("greedy_identity", "greedy_under_load")]
    checks.append(Check("server/declared_settings", DECLARED_SETTINGS, "server", "declared_settings"))
    return checks

def run_serve_audit(url: str, *, options: AuditOptions | None = None, settings: ServeSettings | None = None,
                    progress: bool = True, subject_name: str | None = None, transport=None,
                    **keywords) -> ServeAuditResult:
    """Audit the server at ``url``; see the module docstring. ``options``: level, seed, alpha,
    worlds (names from ``serve_worlds``); ``settings``: the reference, prompts, samplings, the
    journal and the client's limits; ``transport``: answers without HTTP (``serve.client.Client``).

    Four steps: plan (open the endpoints, make the worlds and their checks), drive (each world's
    requests and verdicts, then greedy identity and the declared settings), judge a server that
    stopped answering (``server_failed``), finish (Holm, the result)."""
    options = AuditOptions.of(options, {k: v for k, v in keywords.items() if k in AuditOptions.__dataclass_fields__})
    # a served system's claim is speculative decoding: a server that did not speculate fails it
    options = dataclasses.replace(options, require=tuple(dict.fromkeys(options.require + (Category.SPECULATION.value,))))
    settings = settings or ServeSettings(**{k: v for k, v in keywords.items() if k in ServeSettings.__dataclass_fields__})
    audit = _ServeRun(url, options, settings, subject_name, progress, transport)
    try:
        try:
            audit.plan()
            audit.drive()
        except EndpointError as exc:  # the server went away, or answered what the audit cannot use
            audit.server_failed(exc)
    finally:
        audit.run.close_bars()
        audit.client.close()
    return audit.finish()


class _ServeRun:
    """One serve audit while it runs: the client, the audited and reference endpoints, the worlds
    and the prompts they came from, each conversation's requests (and why it is not judged, if it
    is not), and the reference's largest decode-vs-prefill gap over the worlds so far (``noise``)."""

    def __init__(self, url: str, options: AuditOptions, settings: ServeSettings, subject_name: str | None,
                 progress: bool, transport):
        self.url, self.options, self.settings = url, options, settings
        self.name = subject_name or url
        self.reference_url = settings.reference or url
        self.worlds: list[ServeWorld] = []
        self.prompts: list = []
        self.run = AuditRun((), None, options.seed, self.reproduce, progress=progress, unreached=(
            "not run: the audit was interrupted before this check (its answers so far are in the journal: --resume)"))
        self.bar = self.run.bar(0, unit="request", desc="exactcheck: serve", growing=True)
        self.client = Client(settings.journal, concurrency=settings.concurrency, timeout=settings.timeout,
                             resume=settings.resume, progress=self.bar, transport=transport)
        self.audited: Endpoint | None = None
        self.reference: Endpoint | None = None
        self.noise = 0.0  # the reference's own largest decode-vs-prefill gap over the worlds
        self.chats: dict[ChatPrompt, tuple[ChatRequests, str | None]] = {}  # each conversation: its requests, why not judged
        self.budget: AlphaBudget | None = None  # with the level's cap and reference expansion: set by ``plan``
        self.cap = self.min_mass = self.max_calls = None
        self.mix = None  # what the server met (``serve.traffic.TrafficMix``): set once the worlds are sent
        self.laws: dict = {}  # each (prompt, sampling, conversation, length)'s law from the reference
        self.eog: frozenset[int] | None = None  # the end-of-generation ids, once a world asks for them
        self.masks: dict = {}  # each constrained (prompt, sampling)'s mask (``serve.constraint_law``)

    @property
    def separate(self) -> bool:
        """Whether the reference is another server (else the audited one, by one-token requests)."""
        return self.reference_url != self.url

    def reproduce(self, world: str) -> str:
        settings = self.settings
        # a twin world (-unseeded, -ends) is named after the world it repeats: that world's sampling
        sampling = next((dataclasses.replace(w.sampling, ignore_eos=True, min_tokens=0).spec()
                         if w.name.endswith("-ends") else w.sampling.spec() for w in self.worlds if w.name == world),
                        None)
        line = serve_audit_line(self.url, settings.reference, self.options, world, api=settings.api,
                                model=settings.model, reference_probabilities=settings.reference_probabilities,
                                prompts=() if tuple(settings.prompts) == DEFAULT_PROMPTS else
                                [p for p in settings.prompts if not isinstance(p, ChatPrompt)],
                                sampling=sampling, length=settings.length,
                                samples_per_request=settings.samples_per_request, n_probs=settings.n_probs,
                                traffic=settings.traffic, stream_share=settings.stream_share,
                                server_settings=settings.server_settings, eos_ids=settings.eos_ids)
        conversations = [p for p in settings.prompts if isinstance(p, ChatPrompt)]
        index = world[1:].partition("-")[0]
        if world.startswith("c") and index.isdigit() and int(index) < len(conversations):
            line += reproduce_flags(conversations[int(index)], settings.chat_template_tokenizer)
        return line

    # plan

    def plan(self) -> None:
        """Open the endpoints, make the worlds (the prompts tokenized by the server) and plan their
        checks under one alpha budget; the level's sample cap and reference expansion."""
        settings, options = self.settings, self.options
        try:
            self.audited = open_endpoint(settings.api, self.url, self.client, model=settings.model,
                                         reference_probabilities=settings.reference_probabilities,
                                         declared=settings.server_settings)
            self.reference = open_endpoint(settings.api, self.reference_url, self.client, model=settings.model,
                                           reference_probabilities=settings.reference_probabilities,
                                           declared=settings.server_settings) \
                if self.separate else self.audited
        except EndpointError as exc:
            raise UsageError(f"cannot be audited: {exc}") from None
        self.prompts = [_prompt_ids(self.audited, p, settings) for p in settings.prompts]
        worlds = serve_worlds(self.prompts, settings.samplings, settings.length, unseeded=settings.traffic == MIXED,
                              finishing=settings.traffic == MIXED and self.audited.takes_ignore_eos)
        if options.worlds:
            unknown = sorted(set(options.worlds) - {w.name for w in worlds})
            if unknown:
                raise UsageError(f"unknown serve world(s) {unknown}; known: {[w.name for w in worlds]}")
            worlds = [w for w in worlds if w.name in options.worlds]
        self.worlds = worlds
        self.budget = serve_budget(options.alpha, len(worlds))
        self.run.plan(serve_checks(worlds), self.budget)
        self.cap = REQUEST_CAPS[options.level.value] if options.max_samples is None else options.cap
        self.min_mass, self.max_calls = EXPANSION[options.level.value]

    # drive

    def drive(self) -> None:
        """Every world's sampled requests (interleaved in one stream under mixed traffic, else one
        world after another) and each world's verdicts, then greedy identity and the server's
        declared settings."""
        with self.run.interruptible():
            if self.settings.traffic == MIXED:
                planned = [p for p in map(self.prepare, self.worlds) if p is not None]
                self.send(planned)
                for world in planned:
                    self.judge_world(world)
            else:
                planned = []
                for world in map(self.prepare, self.worlds):
                    if world is not None:
                        self.send([world])
                        self.judge_world(world)
                        planned.append(world)
            self.mix = traffic_mix(self.settings.traffic, self.settings.concurrency,
                                   [(w.world.name, r.sent_at, r.answered_at) for w in planned for r in w.runs])
            if self.worlds:
                self.judge_greedy()
                self.run.add(settings_verdict(self.audited.speculation_settings(), dict(
                    world="server", seed=self.options.seed, reproduce=self.reproduce("server"))))

    def prepare(self, world: ServeWorld) -> "_WorldRequests | None":
        """A world's law (from the reference) and its planned sampled requests; None for a
        conversation not judged (its checks are reported so, with the reason)."""
        settings = self.settings
        seed = derive_seed(self.options.seed, world.name)
        base = dict(world=world.name, seed=seed, reproduce=self.reproduce(world.name))
        requests = self.requests_for(world, seed, base)
        if requests is None or not self.carries(world, seed, base):
            return None
        law, texts, why = self.reference_law(world)
        two_sample = law is None and self.two_sample(world)
        if world.sampling.constraint is not None and law is None and not two_sample:  # its answers would judge nothing
            self.run.extend(_world_not_judged(world, why, seed, base["reproduce"]))
            return None
        n = (trials_to_detect(law.expected, self.options.target_tv, self.budget.first_share, self.cap) or self.cap) \
            if law is not None else self.cap if two_sample else max(settings.probed, settings.seeds)
        self.run.planned += n * (1 + two_sample)
        self.bar.grow(n * (1 + two_sample) + settings.probed + 2 * settings.seeds)
        seeds = [_request_seed(seed, i) for i in range(n)]
        bodies = [_body(requests, world, s, f"request/{i}") for i, s in enumerate(seeds)]
        # a law not computed here (a JSON schema): the reference's answers to the same requests, other seeds
        beside = [_body(self.reference, world, _request_seed(seed, i, "reference"), f"reference/{i}")
                  for i in range(n)] if two_sample else []
        streamed, why_not_streamed = [], None  # each streamed request repeats the seed of a non-streamed one
        m = min(n, math.ceil(settings.stream_share * n)) if law is not None else 0
        try:
            streamed = [requests.streamed(_body(requests, world, s, f"stream/{i}")) for i, s in enumerate(seeds[:m])]
        except NotDeterminable as exc:
            why_not_streamed = str(exc)
        self.run.planned += len(streamed)
        self.bar.grow(len(streamed))
        return _WorldRequests(world, seed, base, requests, law, texts, why, seeds, bodies, streamed,
                              why_not_streamed, reference_bodies=beside)

    def two_sample(self, world: ServeWorld) -> bool:
        """Whether a world is judged by the two-sample test (``serve.verdicts.two_sample_verdict``): a
        constraint the audit has no local engine for (a JSON schema, a recursive grammar), with the
        reference another server that takes the constraint too."""
        constraint = world.sampling.constraint
        if constraint is None or not self.separate or world.chat is not None:
            return False
        try:
            matcher(constraint)
            return False  # a local engine: the masked law (or why not) decides
        except NotDeterminable:
            pass
        try:
            self.reference.constraint_fields(constraint)
        except NotDeterminable:
            return False
        return True

    def send(self, worlds: "list[_WorldRequests]") -> None:
        """The worlds' sampled requests in one stream (interleaved, seeded, when there are several),
        at most ``--concurrency`` in flight; each world gets its answers back in its own order, and
        the drafts counted over the stream (a server-wide counter's chunks mix the worlds)."""
        streams = {(w.world.name, False): w.bodies for w in worlds}
        streams.update({(w.world.name, True): w.streamed for w in worlds if w.streamed})
        keys = list(streams)
        order = interleaved([(j, len(streams[key])) for j, key in enumerate(keys)], self.options.seed)
        by_name = {w.world.name: w for w in worlds}
        requests = [(by_name[keys[j][0]].requests, streams[keys[j]][i]) for j, i in order]
        answers, tally = send_counted_mixed(requests, self.settings.concurrency)
        runs = {key: [None] * len(bodies) for key, bodies in streams.items()}
        for (j, i), answer in zip(order, answers):
            runs[keys[j]][i] = answer
        for w in worlds:
            w.runs, w.streamed_runs = runs[(w.world.name, False)], runs.get((w.world.name, True), [])
            w.tally = tally if tally.source is CounterSource.SERVER_WIDE or len(worlds) == 1 else \
                DraftTally(tally.source, tuple(a.draft_n or 0 for a in w.runs), 1, len(w.runs),
                           sum(a.draft_accepted or 0 for a in w.runs))
        self.run.drawn += len(answers)
        for w in worlds:  # the reference's answers of a two-sample world (its speculation counters are not read)
            if w.reference_bodies:
                w.reference_runs, _ = send_counted_mixed([(self.reference, b) for b in w.reference_bodies],
                                                         self.settings.concurrency)
                self.run.drawn += len(w.reference_runs)

    def judge_world(self, planned: "_WorldRequests") -> None:
        """One world's verdicts from its answers: the continuation law, several samples of one
        request, concurrent requests, the probed requests' logprobs, seed reproducibility and
        speculation."""
        run, settings = self.run, self.settings
        world, seed, base, requests, runs = planned.world, planned.seed, planned.base, planned.requests, planned.runs
        law, why, cause = self.judged_law(world, planned.law, planned.texts, planned.why, runs)
        if law is not None:
            run.add(continuation_law_verdict(law, runs, world.describe(), self.budget.first_share, self.budget.alpha,
                                             base, cause))
        elif planned.reference_runs:
            why = f"the audit has no local engine for a {world.sampling.constraint.kind.replace('_', ' ')}"
            run.add(two_sample_verdict(runs, planned.reference_runs, world.describe(), self.budget.first_share, base,
                                       why))
            why += ": the continuation check is a two-sample test against the reference server"
        else:
            run.add(not_run_verdict(Check(f"{world.name}/continuation", CheckKind.GENERATOR_LAW, world.name,
                                          "continuation"), seed, base["reproduce"], f"not judged: {why}"))
        if law is not None and world.sampling.finishes and planned.streamed_runs:
            # a streamed answer read as the non-streamed ones are: an end the server names, on the one
            # end-of-generation id, that its ids do not carry (vLLM's stream drops it where a speculative
            # step's last token is the end) is added (``finishing.as_ended``)
            ended = [as_ended(r, self.eog) for r in planned.streamed_runs]
            if all(e is not None for e in ended):
                planned.streamed_runs[:] = ended
        run.add(self.judge_streamed(planned, law, why))
        run.add(_independent_samples(requests, self.reference, world, law, planned.texts, why if law is None else None,
                                     len(runs), settings, seed, self.budget, base, run, self.bar))
        concurrent = Check(f"{world.name}/concurrent_requests", CheckKind.GENERATOR_LAW, world.name,
                           "concurrent_requests")
        if law is None:
            run.add(not_run_verdict(concurrent, seed, base["reproduce"], f"not judged: {why}",
                                    condition=world.describe()))
        else:
            pairs = concurrent_pairs([(r.sent_at, r.answered_at) for r in runs])
            run.add(concurrent_requests_verdict(law, runs, pairs, world.describe(), self.budget.first_share,
                                                self.budget.alpha, base, settings.concurrency))
        probe_tally, probes = self.judge_probes(requests, world, law, seed, base, planned.tally, len(runs))
        run.add(finish_verdict([*runs, *planned.streamed_runs, *probes], world.length, world.sampling,
                               self.eog if world.sampling.finishes else None, base, world.describe(),
                               masks=requests.takes_ignore_eos))
        if world.unseeded:
            run.add(not_run_verdict(Check(f"{world.name}/same_seed", SEED_REPRODUCIBILITY, world.name,
                                          "same_seed"), seed, base["reproduce"],
                                    "not judged: the world's requests carry no seed"))
        else:
            repeats = requests.complete_many([requests.body(world.prompt, world.length, world.sampling, s,
                                                            tag="repeat") for s in planned.seeds[:settings.seeds]])
            run.add(seed_verdict([(s, a.tokens, r.tokens) for s, a, r in zip(planned.seeds, runs, repeats)], base))
        run.add(speculation_verdict(planned.tally, probe_tally, self.budget.first_share, base))

    def judge_streamed(self, planned: "_WorldRequests", law: ContinuationLaw | None, why: str | None) -> Verdict:
        """The world's streamed answers (``serve.streaming``); not judged, with the reason, where its
        law is not, its dialect's stream is not read, or no request was streamed."""
        world = planned.world
        check = Check(f"{world.name}/streamed", CheckKind.GENERATOR_LAW, world.name, "streamed")
        reason = (why if law is None else planned.why_not_streamed or
                  ("--stream-share 0: no request streamed" if not planned.streamed_runs else None))
        if reason is not None:
            return not_run_verdict(check, planned.seed, planned.base["reproduce"], f"not judged: {reason}",
                                   condition=world.describe())
        return streamed_verdict(law, planned.runs, planned.streamed_runs, world.describe(), self.budget.first_share,
                                self.budget.alpha, planned.base, stops=world.sampling.stop,
                                exact_length=not world.sampling.stop, seeded=not world.unseeded, cells=cell_indices)

    def carries(self, world: ServeWorld, seed: int, base: dict) -> bool:
        """Whether the audited dialect carries the world's constraint (none: yes); where it cannot, every
        check of the world is not judged, with the reason (unconstrained answers would judge nothing)."""
        constraint = world.sampling.constraint
        why = "a constraint on the chat endpoint is not judged" if constraint and world.chat else None
        try:
            if constraint is not None and why is None:
                self.audited.constraint_fields(constraint)
        except NotDeterminable as exc:
            why = f"the constraint cannot be carried: {exc}"
        if why is not None:
            self.run.extend(_world_not_judged(world, why, seed, base["reproduce"]))
        return why is None

    def requests_for(self, world: ServeWorld, seed: int, base: dict) -> Endpoint | None:
        """Where a world's requests go: the audited server's completions, or its conversation's chat
        requests; None for a conversation not judged (its checks are reported so, with the reason)."""
        if world.chat is None:
            return self.audited
        if world.chat not in self.chats:
            chat = ChatRequests(self.audited, world.chat)
            self.chats[world.chat] = (chat, chat.probe(world.length))
        requests, why_not = self.chats[world.chat]
        if why_not is not None:
            self.run.extend(_world_not_judged(world, why_not, seed, base["reproduce"]))
            return None
        return requests

    def reference_law(self, world: ServeWorld) -> tuple[ContinuationLaw | None, dict | None, str | None]:
        """(the world's law, the text of each prefix where it has stop strings, why no law), built
        once per prompt and sampling (an unseeded world shares its seeded twin's)."""
        key = (world.prompt, world.sampling, world.chat, world.length)
        if key not in self.laws:
            self.laws[key] = self._reference_law(world)
        return self.laws[key]

    def _reference_law(self, world: ServeWorld) -> tuple[ContinuationLaw | None, dict | None, str | None]:
        texts = None  # a world with stop strings: the text of each prefix of the law, as the server searches it
        why = None
        try:
            eog = self.ends_of(world)
            if world.sampling.constraint is None:
                law = _reference_law(self.reference, world, self.settings.n_probs, self.min_mass, self.max_calls, eog)
            else:
                mask = self.masks[(world.prompt, world.sampling)] = ConstraintMask.build(
                    world.sampling.constraint, self.reference, world.prompt, eog)
                law = constrained_law(self.reference, mask, world.sampling, world.length, self.settings.n_probs,
                                      self.min_mass, self.max_calls, self.audited.constraint_order)
        except NotDeterminable as exc:
            law, why = None, f"the reference's probabilities do not determine the law of these settings " \
                             f"({exc})"
        if law is not None and world.sampling.stop:
            if world.chat is not None:
                law, why = None, "stop strings on the chat endpoint are not judged (its answers' text is " \
                                 "the template's reply, not read here)"
            else:
                try:
                    law, texts = stopped_law(law, lambda c: self.reference.continuation_texts(world.prompt, c),
                                             world.sampling.stop)
                except (NotDeterminable, EndpointError) as exc:
                    if isinstance(exc, EndpointError) and exc.server_fault:
                        raise
                    law, why = None, f"the text the server searches for stop strings is not known ({exc})"
        return law, texts, why

    def ends_of(self, world: ServeWorld) -> frozenset[int] | None:
        """The end-of-generation ids a world's answers may end on (None: a world whose answers have the
        asked length); ``NotDeterminable`` where the audit cannot know them or cannot build that law."""
        sampling = world.sampling
        if not sampling.finishes:
            return None
        if world.chat is not None:
            raise NotDeterminable("answers that end on an end-of-generation token are judged on the completions "
                                  "endpoint only")
        if sampling.min_tokens and not (self.audited.min_tokens and self.reference.min_tokens):
            raise NotDeterminable(f"{self.audited.api} takes no min_tokens")
        if self.eog is None:
            self.eog = parse_ids(self.settings.eos_ids) if self.settings.eos_ids else \
                self.audited.end_of_generation()
        return self.eog

    def judged_law(self, world: ServeWorld, law: ContinuationLaw | None, texts: dict | None, why: str | None,
                   runs: list[Completion]) -> tuple[ContinuationLaw | None, str | None, str | None]:
        """(the law the sampled answers are judged by, or None; why not; words for what went wrong: a
        stop world's answers that end where the text read puts no stop, a constrained world's answers
        outside the constraint): none where chat answers stopped early, a stop world's ends cannot be
        explained by the text the audit read, or a constrained world's answers outside the constraint
        came back with a text the audit does not read for their tokens (``constraint_law``)."""
        if law is not None and world.sampling.finishes:
            ended = [as_ended(r, self.eog) for r in runs]
            unknown = [r for r, e in zip(runs, ended) if e is None]
            if unknown:
                return None, (f"{len(unknown):,} answers end on a token the audit does not know as an end of "
                              f"generation (e.g. {list(unknown[0].tokens)[-3:]}; declare the model's with "
                              f"--eos-ids)"), []
            runs[:] = ended
        stopped = sum(len(r.tokens) < world.length for r in runs) if world.chat is not None else 0
        if stopped:
            why = (f"{stopped} of {len(runs)} chat answers ended before {world.length} tokens (finish_reason "
                   f"stop: a stop string the chat template added; ignore_eos masks end-of-generation tokens "
                   f"only), and the completions endpoint's law knows no such stop")
            law = None
        mask = self.masks.get((world.prompt, world.sampling))
        if law is not None and mask is not None:
            wrong = outside(runs, mask)
            if not wrong:
                return law, why, None
            unconfirmed, words = confirmed_outside(wrong, mask)
            return (None, unconfirmed, None) if unconfirmed else (law, why, words)
        wrong = _stop_ends_wrong(runs, texts, world) if law is not None else []
        if wrong:
            why = _stop_ends_unexplained(self.reference, world, runs, wrong)
            law = None if why else law
        return law, why, _stop_cause(wrong, texts, world)

    def judge_probes(self, requests: Endpoint, world: ServeWorld, law: ContinuationLaw | None, seed: int,
                     base: dict, law_tally, n: int) -> tuple:
        """The probed requests (with n_probs): their logprob fidelity verdict, measured against the
        reference's own noise where the reference is another server; returns their draft tally and
        the probed answers."""
        settings, bar = self.settings, self.bar
        probe_count = probes_needed(law_tally, self.budget.first_share, settings.probed, n)
        bar.grow(probe_count - settings.probed)
        probes, probe_tally = send_counted(requests, [
            _body(requests, world, _request_seed(seed, i, "probe"), f"probe/{i}", n_probs=1)
            for i in range(probe_count)], settings.concurrency)
        if world.sampling.constraint is not None:
            check = Check(f"{world.name}/logprob_fidelity", LOGPROB_FIDELITY, world.name, "logprob_fidelity")
            self.run.add(not_run_verdict(check, seed, base["reproduce"], "not judged: a constrained world's reported "
                                         "probabilities are not read (engines report them before or after the "
                                         "mask: llama.cpp the chain it sampled from, without the grammar unless it "
                                         "resampled)", condition=world.describe()))
            return probe_tally, probes
        world_noise = None
        if self.separate:
            bar.grow(settings.probed)
            world_noise = _reference_noise(self.reference, world, law, settings, seed)
            if world_noise is not None:
                self.noise = max(self.noise, world_noise)
        # every probe is read (where drafts are rare, the ones planned for speculation_ran are what
        # carries speculated tokens whose reported probabilities can be checked)
        self.run.add(logprob_verdict(_probability_rows(self.reference, world, law, probes, settings.n_probs),
                                     settings.logprob_tolerance, len(probes), base, noise=world_noise))
        return probe_tally, probes

    def judge_greedy(self) -> None:
        """Greedy identity alone and under load, on every prompt whose answers' tokens are known."""
        greedy_base = dict(world="greedy", seed=self.options.seed, reproduce=self.reproduce("greedy"))
        chats = self.chats
        senders = [(p.ids, chats[p][0]) if isinstance(p, ChatPrompt) else (p, self.audited) for p in self.prompts
                   if not isinstance(p, ChatPrompt) or (p in chats and chats[p][1] is None)]
        if senders:
            self.run.extend(_greedy(self.reference, senders, self.settings, self.separate, greedy_base,
                                    near_tie=max(NEAR_TIE, NOISE_MARGIN * self.noise)))
        else:
            self.run.extend(not_run_verdict(c, self.options.seed, greedy_base["reproduce"], "not judged: no prompt "
                                            "whose answers' tokens are known (every conversation: not judged)")
                            for c in serve_checks([]) if c.world == "greedy")

    # judge a server that stopped answering

    def server_failed(self, exc: EndpointError) -> None:
        """A refused request is the user's settings (a usage error); a server that stops answering
        valid requests mid-audit is its finding, with what was drawn so far."""
        url, settings, run = self.url, self.settings, self.run
        if not (exc.server_fault and self.audited is not None):  # a refused request: the user's settings
            kept = f"; the answers so far are in {settings.journal}: rerun with --resume" if settings.journal else ""
            raise UsageError(f"{url}: {exc}{kept}") from None
        failing = exc.requests[0][0] if exc.requests else url
        role, server = ("reference", self.reference_url) if self.separate and failing.startswith(
            self.reference_url.rstrip("/")) else ("audited", url)
        run.close_bars()
        run.add(server_failed_verdict(exc, server, role, self.client.stats.sent + self.client.stats.from_journal,
                                      self.options.seed, settings.journal))
        run.extend(unreached_verdicts(run.checks, run.pending, self.options.seed, self.reproduce, (
            f"not run: the {role} server stopped answering before this check")))

    # finish

    def finish(self) -> ServeAuditResult:
        options = self.options
        return self.run.finish(
            ServeAuditResult, subject=self.name, level=options.level.value, seed=options.seed, alpha=options.alpha,
            device="server", environment=run_environment(server=self.url, reference=self.reference_url),
            require=options.require,
            reference=(self.reference.describe() if self.reference is not None else self.reference_url)
            + ("" if self.settings.reference else " (the audited server, one-token requests)"),
            traffic=self.client.stats.line() + (f"; {self.mix.line()}" if self.mix is not None else ""))


@dataclass
class _WorldRequests:
    """One world's planned sampled requests while the audit runs: its law from the reference (or why
    none), their seeds and bodies; once sent, the answers in the order planned and the drafts counted."""

    world: ServeWorld
    seed: int
    base: dict
    requests: Endpoint
    law: ContinuationLaw | None
    texts: dict | None
    why: str | None
    seeds: list[int]
    bodies: list[dict]
    streamed: list[dict] = dataclasses.field(default_factory=list)  # streamed repeats of the first seeds
    why_not_streamed: str | None = None
    runs: list = dataclasses.field(default_factory=list)
    streamed_runs: list = dataclasses.field(default_factory=list)
    tally: DraftTally | None = None
    # a world judged by two samples: the reference server's requests and answers (same sampling, other seeds)
    reference_bodies: list = dataclasses.field(default_factory=list)
    reference_runs: list = dataclasses.field(default_factory=list)


def _body(requests: Endpoint, world: ServeWorld, seed: int, tag: str, **keywords) -> dict:
    """A request of ``world`` with ``seed`` (unseeded, told apart by ``tag``, for an unseeded world)."""
    body = requests.body(world.prompt, world.length, world.sampling, seed, **keywords)
    return requests.unseeded(body, tag) if world.unseeded else body


def _prompt_ids(audited: Endpoint, prompt, settings: ServeSettings):
    """A prompt as the audit uses it: a text tokenized by the server, token ids as given, a
    conversation with the ids its chat template makes (``serve.chat.template_tokens``)."""
    if isinstance(prompt, ChatPrompt):
        return template_tokens(audited, prompt, settings.chat_template_tokenizer)
    ids = tuple(audited.tokenize(prompt)) if isinstance(prompt, str) else tuple(prompt)
    audited.check_prompt(ids)  # a text-prompt server: ids it cannot be sent are refused before the audit starts
    return ids


def _world_not_judged(world: ServeWorld, why: str, seed: int, reproduce: str) -> list[Verdict]:
    """A world whose answers would judge nothing (a chat world whose answers cannot be known to continue
    its template's tokens; a constraint the dialect cannot carry): each of its checks not judged, with
    the reason (never a guess)."""
    return [not_run_verdict(c, seed, reproduce, f"not judged: {why}", condition=world.describe())
            for c in serve_checks([world]) if c.world == world.name]


def _independent_samples(endpoint: Endpoint, reference: Endpoint, world: ServeWorld, law: ContinuationLaw | None,
                         texts: dict | None, why: str | None, planned: int, settings: ServeSettings, world_seed: int,
                         budget: AlphaBudget, base: dict, run: AuditRun, bar) -> Verdict:
    """``settings.samples_per_request`` samples of each of about ``planned / (2k)`` seeded requests
    (half the continuation law's samples), judged by ``independent_samples_verdict``; not judged,
    with the reason, where the API has no field for it, the server refuses it or ignores it, the
    world's law is not determined, or (a stop world: ``texts``) the samples end where the text the
    audit read cannot explain (``_stop_ends_unexplained``)."""
    k = settings.samples_per_request
    check = Check(f"{world.name}/independent_samples", CheckKind.GENERATOR_LAW, world.name, "independent_samples")

    def not_judged(words: str) -> Verdict:
        return not_run_verdict(check, world_seed, base["reproduce"], f"not judged: {words}",
                               condition=world.describe())

    if k < 2:
        return not_judged("samples_per_request is 1: no request asks for several samples")
    if law is None:
        return not_judged(why or "the world's law is not determined")
    m = max(settings.probed, -(-planned // (2 * k)))
    try:
        bodies = [endpoint.several(_body(endpoint, world, _request_seed(world_seed, i, "several"), f"several/{i}"), k)
                  for i in range(m)]
    except NotDeterminable as exc:
        return not_judged(str(exc))
    run.planned += m * k
    bar.grow(m)
    try:
        groups = endpoint.complete_several(bodies[:1])
    except EndpointError as exc:
        if exc.server_fault:
            raise
        return not_judged(f"the server refused {k} samples of one request ({exc})")
    groups += endpoint.complete_several(bodies[1:])
    run.drawn += sum(map(len, groups))
    if all(len(g) < 2 for g in groups):
        return not_judged(f"the server answered one sample to each request asking {k} (it ignores the field)")
    samples = [c for g in groups for c in g]
    wrong = _stop_ends_wrong(samples, texts, world)
    unexplained = _stop_ends_unexplained(reference, world, samples, wrong) if wrong else None
    if unexplained:
        return not_judged(unexplained)
    return independent_samples_verdict(law, groups, f"{k} samples of each request: {world.describe()}",
                                       budget.first_share, budget.alpha, base)


def _stop_ends_wrong(runs: list[Completion], texts: dict | None, world: ServeWorld) -> list[tuple[int, ...]]:
    """A stop world's answers that end where the texts the audit read put no stop, or run past one
    (``stop_law.ends_disagreeing``); none where the world has no stop strings (``texts`` None)."""
    if texts is None:
        return []
    return ends_disagreeing([r.tokens for r in runs], texts, world.sampling.stop, world.length)


def _stop_ends_unexplained(reference: Endpoint, world: ServeWorld, runs: list[Completion],
                           wrong: list[tuple[int, ...]]) -> str | None:
    """Why the audited answers' ends cannot be judged by the stop law, or None. The ``wrong``
    answers (``_stop_ends_wrong``) are a finding only where each came back with the text the audit
    reads for its tokens, cut at the stop (``stop_law.returned_text``; at most 1,000 distinct
    answers read): the server's own text then says the same. Otherwise the text the audit read may
    not be the one the server searches (special tokens its stop search skips, a detokenizer's
    context): not judged, with the reason."""
    stops = world.sampling.stop
    example = f"{len(wrong):,} of {len(runs):,} answers end where the text the audit read does not put a stop (e.g. " \
              f"{list(wrong[0])})"
    distinct = list(dict.fromkeys(wrong))[:1_000]
    try:
        full = dict(zip(distinct, reference.continuation_texts(world.prompt, distinct)))
    except (NotDeterminable, EndpointError) as exc:
        if isinstance(exc, EndpointError) and exc.server_fault:
            raise
        return f"{example}, and their text is not known ({exc})"
    returned = {r.tokens: r.text for r in runs if r.tokens in full}
    unlike = [t for t in distinct if returned.get(t) not in returned_text(full[t], stops)]
    if unlike:
        t = unlike[0]
        return (f"{example}; the server returned text {returned.get(t)!r} with {list(t)}, where the audit reads "
                f"{full[t]!r}: the text its stop strings are searched in is not the one the audit read")
    return None


def _stop_cause(wrong: list[tuple[int, ...]], texts: dict | None, world: ServeWorld) -> str | None:
    """Words for the ``wrong`` answers (``_stop_ends_wrong``): run past the token that completed a
    stop string (a verify step's tokens after the stop returned), or ended with none completed."""
    if not wrong:
        return None
    past = [(t, d) for t in wrong if (d := stop_depth(t, texts, world.sampling.stop)) is not None]
    if past:
        (t, depth) = past[0]
        runs = "answer runs" if len(past) == 1 else "answers run"
        return (f"{len(past):,} {runs} past the token that completed a stop string (e.g. {list(t)}: its "
                f"text {texts[t[:depth]]!r} holds one after {depth} tokens): tokens after the stop returned "
                f"(a speculation step's accepted tokens not cut at the stop)")
    one = len(wrong) == 1
    return (f"{len(wrong):,} {'answer ends' if one else 'answers end'} before {world.length} tokens with no stop "
            f"string in {'its' if one else 'their'} text (e.g. {list(wrong[0])})")


def _request_seed(world_seed: int, i: int, purpose: str = "request") -> int:
    return derive_seed(world_seed, f"{purpose}/{i}") % (1 << 31)


def _reference_law(reference: Endpoint, world: ServeWorld, n_probs: int, min_mass: float,
                   max_calls: int, eog: frozenset[int] | None = None) -> ContinuationLaw:
    """The world's law from the reference's next-token laws; ``eog``: a world whose answers may end on
    one of these ids, each prefix ending on one a whole output (``serve.finishing``)."""
    prompt = list(world.prompt)
    if eog is None:
        return expand(lambda prefix: reference.next_token_laws(prompt, [prefix], world.sampling, n_probs)[0],
                      world.length, min_mass=min_mass, max_calls=max_calls)
    return expand(lambda prefix: reference_next_token(reference, prompt, prefix, world.sampling, n_probs, eog),
                  world.length, min_mass=min_mass, max_calls=max_calls, ends=lambda prefix: prefix[-1] in eog)


def _reference_noise(reference: Endpoint, world: ServeWorld, law: ContinuationLaw | None,
                     settings: ServeSettings, world_seed: int) -> float | None:
    """The reference's own arithmetic noise: the largest gap between the probabilities it reports
    for its own tokens while decoding (``settings.probed`` requests with n_probs, speculation off)
    and those its one-token requests give after the same prefix; None where it reported none."""
    own = reference.complete_many([reference.body(world.prompt, world.length, world.sampling,
                                                  _request_seed(world_seed, i, "noise"), n_probs=1)
                                   for i in range(settings.probed)])
    rows = _probability_rows(reference, world, law, own, settings.n_probs)
    return max((abs(reported - known) for _, _, reported, known in rows), default=None)


def _probability_rows(reference: Endpoint, world: ServeWorld, law: ContinuationLaw | None, probes: list[Completion],
                      n_probs: int) -> list[tuple[int, int, float, float]]:
    """(request, position, reported, the reference's) for every token the probed requests reported,
    the reference's probability of the kind the audited server reported (post-sampling, or raw)."""
    rows, missing = [], {}
    for r, c in enumerate(probes):
        kind = c.probability_kind
        for t, (token, reported) in enumerate(zip(c.tokens, c.probabilities or ())):
            prefix = c.tokens[:t]
            known = law.next_token(prefix) if law is not None and kind == POST_SAMPLING else None
            if known is None:
                missing.setdefault((kind, prefix), []).append((r, t, token, reported))
                continue
            rows.append((r, t, reported, known.probabilities.get(token, 0.0)))
    for kind in sorted({k for k, _ in missing}):
        prefixes = sorted(prefix for k, prefix in missing if k == kind)
        try:
            laws = reference.next_token_laws(list(world.prompt), prefixes, world.sampling, n_probs, kind=kind)
        except NotDeterminable:
            continue  # these tokens are not judged (the verdict counts what it compared)
        for prefix, next_law in zip(prefixes, laws):
            rows += [(r, t, reported, next_law.probabilities.get(token, 0.0))
                     for r, t, token, reported in missing[(kind, prefix)]]
    return sorted(rows)


def _greedy(reference: Endpoint, senders: list[tuple[tuple[int, ...], Endpoint]], settings: ServeSettings,
            separate: bool, base: dict, near_tie: float) -> list[Verdict]:
    """Greedy output speculation on vs off per prompt (each prompt sent alone), and on alone vs on
    under load (each prompt ``settings.load`` times at once; with the prompt cache on and, where the
    API has the switch, off): with the reference being the audited server, "off" is built token by
    token from one-token requests. ``senders``: each prompt's ids and the endpoint its audited
    requests go to (the audited server's completions, or its chat endpoint for a conversation)."""
    tokens = settings.greedy_tokens
    prompts = [p for p, _ in senders]
    alone = [sender.complete_many([sender.body(p, tokens, GREEDY_SAMPLING, 0)])[0].tokens[:tokens]
             for p, sender in senders]
    cut = [None] * len(prompts)  # why a path built one token at a time stops short (a text-prompt server)
    if separate:
        off = [c.tokens[:tokens] for c in reference.complete_many([reference.body(p, tokens, GREEDY_SAMPLING, 0)
                                                                   for p in prompts])]
    else:
        off, cut = map(list, zip(*(one_token_path(reference, p, tokens) for p in prompts))) if prompts else ([], [])
    switch = all(sender.cache_switch for _, sender in senders)
    caches = (True, False) if switch else (True,)
    levels = concurrency_sweep(settings.load, settings.concurrency)
    groups: dict[int, tuple[Endpoint, list[int]]] = {}  # the prompts one endpoint takes, all sent at once
    for i, (_, sender) in enumerate(senders):
        groups.setdefault(id(sender), (sender, []))[1].append(i)
    loaded: list = [[] for _ in prompts]
    for level in levels:  # each prompt ``level`` times, at most ``level`` requests in flight: the batch size swept
        copies = [(cache, j) for cache in caches for j in range(level)]
        for sender, members in groups.values():
            answers = complete_mixed([(sender, sender.body(prompts[i], tokens, GREEDY_SAMPLING, 0, cache=cache,
                                                           tag=f"load/{level}/{j}"))
                                      for i in members for cache, j in copies], concurrency=level)
            for k, i in enumerate(members):
                loaded[i] += answers[k * len(copies):(k + 1) * len(copies)]
    pairs = [(list(p), a[:len(r)] if why else a, tuple(r)) for p, a, r, why in zip(prompts, alone, off, cut)]
    under_load = [(list(p), a, c.tokens[:tokens]) for p, a, answers in zip(prompts, alone, loaded) for c in answers]
    cache_words = "the prompt cache on and off" if switch else \
        "the prompt cache as the server keeps it (no per-request switch in this API)"
    swept = ", ".join(map(str, levels))
    short = [w for w in cut if w]
    return [greedy_verdict(pairs, _margins(reference, pairs, settings.n_probs), base, near_tie=near_tie, condition=(
                f"temperature 0, {len(pairs)} prompts, speculation on vs off; {len(short)} compared on their first "
                f"tokens only: {short[0]}") if short else None),
            greedy_verdict(under_load, _margins(reference, under_load, settings.n_probs), base, law="greedy_under_load",
                           condition=f"temperature 0, {len(prompts)} prompts each alone and then {swept} times at "
                                     f"once, at most as many in flight (a concurrency sweep; {cache_words}), "
                                     f"speculation on: a greedy answer must not depend on how many requests share "
                                     f"the batch", near_tie=near_tie)]


def concurrency_sweep(load: int, concurrency: int) -> tuple[int, ...]:
    """The numbers of copies of each greedy prompt sent at once: 2, 4, 8, ... up to ``concurrency``,
    and ``load``."""
    levels, level = {max(1, min(load, concurrency))}, 2
    while level <= concurrency:
        levels.add(level)
        level *= 2
    return tuple(sorted(levels - {1}) or (1,))


def _margins(reference: Endpoint, pairs, n_probs: int) -> dict:
    """Per diverging pair: (first differing position, the reference's margin between its top two
    tokens there, at temperature 1 and no truncation)."""
    margins = {}
    for i, (p, a, r) in enumerate(pairs):
        if a == r:
            continue
        position = next((j for j, (x, y) in enumerate(zip(a, r)) if x != y), min(len(a), len(r)))
        try:
            (law,) = reference.next_token_laws(p, [tuple(r[:position])], Sampling(), n_probs)
        except NotDeterminable:  # a prefix a text-prompt server cannot be sent: the margin is not known
            margins[i] = (position, None)
            continue
        margins[i] = (position, law.top_two_margin())
    return margins
