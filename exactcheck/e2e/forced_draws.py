"""Forced random numbers inside an end-to-end generator: boundary values reach a verifier written
inline in a generate loop.

The step audit forces a verifier's draws (``exactcheck.forcing.randomness``); a generator whose
verification lives inside its loop (``r > p/q`` on float32 uniforms, as one popular package
writes it) cannot be audited at step level, and its sampled laws cannot show a trigger of
probability 2^-24. Here a whole generation runs inside ``controlled_randomness``: every
``torch.rand``, ``rand_like``, ``uniform_``, ``exponential_`` and ``multinomial`` it makes, on
torch's global generator or on a ``torch.Generator`` it created from its seed, returns one boundary
value, delivered as the draw's dtype can return it (0.0, or 1 - 2^-24 in float32 and 1 - 2^-53 in
float64). Generators it creates are watched (``watch_created``): one that moved, like a global
source that moved, is an escape, and the run names it.

Three properties per world, each deterministic (an exact generator keeps them at every value a
draw can return, so a failure spends none of alpha):

* ``forced_no_forbidden_token``: under sampled policies that truncate the target (top-k, top-p, or
  the world's own grammar mask) no generated token has probability 0 under the policy at its
  prefix (the exact float64 law of ``exactcheck.generation.laws.policy_sequence_law``);
* ``forced_no_crash``: no generation crashes or breaks the generator contract (a zero residual
  after a forced rejection, an all-masked row);
* ``forced_greedy``: greedy generations equal the target's own greedy decode
  (``exactcheck.generation.greedy_identity.target_greedy``; a float64 tie is not a defect).

These are judged on outputs alone, so a draw that escaped the forcing does not void them: every
value it took was one a real draw returns. A failure is re-run forcing fewer draws
(``exactcheck.step.properties.fewest_forced``, the others drawn from the generator's own seed) to
the smallest set that still breaks it; its reachability is that set's probability per generation.
A world where no draw went through a forced entry point is not judged ("nothing was forced").
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from exactcheck.contracts.generator import Capabilities, DecodingPolicy, call_generator
from exactcheck.generation.greedy_identity import classify_divergence, target_greedy
from exactcheck.contracts.policy import greedy_variant
from exactcheck.errors import SubjectCrashed, SubjectError
from exactcheck.options import CheckKind, derive_seed
from exactcheck.reachability import Reachability, wrong_uniforms
from exactcheck.report.verdict import FindingEvidence, Outcome, Verdict
from exactcheck.generation.laws import policy_sequence_law
from exactcheck.forcing.boundaries import fewest_forced, wrong_interval
from exactcheck.forcing.randomness import DrawLog, controlled_randomness
from toy_models.hf_toy_lm import ModelWorld, prompt_for_state

__all__ = ["FORCED_CHECKS", "FORCED_VALUES", "FORCED_PROMPTS", "TRUNCATING_POLICIES", "forced_policies",
           "forced_draw_verdicts", "ForcedRun"]

FORCED_CHECKS = ("forced_no_forbidden_token", "forced_no_crash", "forced_greedy")
FORCED_VALUES = ("zero", "one_minus_ulp")
FORCED_PROMPTS = 4
# sampled policies with zeros in the target's law, so an accepted forbidden draft can show
TRUNCATING_POLICIES = (DecodingPolicy(1.0, top_k=2), DecodingPolicy(1.0, top_p=0.5))
SHRINK_BUDGET = 60  # generations spent shrinking one failure's forced set
# a one-draw trigger's value is widened by bisection to this resolution (a set narrower than that
# keeps its point probability), with this many points inside re-checked: about 50 generations
WIDEN_RESOLUTION = 2.0 ** -20
WIDEN_CHECKS = 4
SHRINK_TRIES = 3  # failing generations shrunk, at most, looking for a reachable trigger


@dataclass(frozen=True)
class ForcedRun:
    """One generation under a forced value: what came out, or how it failed."""

    policy: DecodingPolicy
    prompt: int
    value: str
    seed: int
    log: DrawLog
    output: tuple[int, ...] | None
    error: SubjectError | None = None


def forced_policies(world: ModelWorld, policies, capabilities: Capabilities | None) -> tuple[DecodingPolicy, ...]:
    """The sampled policies a world's forced generations run under: its own (a grammar world), or
    the audit's with the truncating ones added (not those with penalties: the forced prompts are not
    the world's, whose history a penalty reads; the laws judge them); minus any the generator
    declares it cannot take."""
    chosen = (world.policy,) if world.policy is not None else tuple(dict.fromkeys(
        [p for p in policies if not p.greedy and not p.penalized] + list(TRUNCATING_POLICIES)))
    return tuple(p for p in chosen if capabilities is None or capabilities.missing_for(p) is None)


class _Laws:
    """The exact law of a world's outputs from each prompt state under each policy, cached."""

    def __init__(self, world: ModelWorld):
        self.world, self.cache = world, {}

    def forbidden_at(self, state: int, policy: DecodingPolicy, output: tuple[int, ...]) -> int | None:
        """The first position of ``output`` whose prefix has probability 0, or None."""
        key = (state, policy)
        if key not in self.cache:
            law = policy_sequence_law(dataclasses.replace(self.world.world, prompt_state=state), policy,
                                      self.world.new_tokens)
            prefixes: dict = {}
            for outcome, prob in law.items():
                for j in range(1, len(outcome) + 1):
                    prefixes[outcome[:j]] = prefixes.get(outcome[:j], 0.0) + prob
            self.cache[key] = prefixes
        prefixes = self.cache[key]
        for j in range(1, len(output) + 1):
            if prefixes.get(output[:j], 0.0) <= 0:
                return j - 1
        return None


def forced_draw_verdicts(generator, world: ModelWorld, policies, seed: int, base: dict, device,
                         capabilities: Capabilities | None = None) -> list[Verdict]:
    """The three forced-draw verdicts of ``world`` (``FORCED_CHECKS``, in order): plan (the
    world's models, prompts and laws), drive (a generation per policy, prompt and forced value),
    judge (the runs that break a property), finish (a verdict per check, a finding shrunk to the
    fewest forced draws)."""
    forced = _ForcedWorld(generator, world, seed, device)
    greedy = greedy_variant(world.policy)
    sampled = forced_policies(world, policies, capabilities)
    runs = forced.drive((*sampled, greedy))
    found = forced.failures(runs)
    return _verdicts(forced, runs, sampled, found, base)


class _ForcedWorld:
    """One world's forced generations: its models and prompts, the exact laws and the target's
    greedy decodes they are judged by, a tokenizer world's fresh drafts, the float64 target."""

    def __init__(self, generator, world: ModelWorld, seed: int, device):
        self.generator, self.world, self.seed, self.device = generator, world, seed, device
        self.target, self.draft = (m.to(device) for m in world.models())
        self.keywords = world.generator_keywords()
        self.prompts = [prompt_for_state(world.world, len(world.prompt), derive_seed(seed, f"forced/prompt/{i}"))
                        for i in range(FORCED_PROMPTS)]
        self.prompt_ids = [torch.tensor(p, dtype=torch.int64, device=self.target.device) for p, _ in self.prompts]
        self.laws = _Laws(world)
        self.expected_greedy: dict[int, list[int]] = {}
        self.fresh: dict = {}
        self.cache: dict = {}

    def draft_for(self, policy) -> tuple:
        """The draft and keywords a policy's runs use: the world's one pair where target and draft
        share a vocabulary; in a tokenizer world a fresh draft and tokenizers per policy (a
        generator that changes its draft in place when sampling is judged on reuse by
        ``draft_reuse``, not here)."""
        if self.world.shared_vocabulary:
            return self.draft, self.keywords
        key = (policy.label(), policy.greedy)  # a world's own policy names its greedy variant alike
        if key not in self.fresh:
            self.fresh[key] = (self.world.models()[1].to(self.device), self.world.generator_keywords())
        return self.fresh[key]

    def generate(self, policy, i, value, run_seed, only=None) -> ForcedRun:
        model, extra = self.draft_for(policy)
        with controlled_randomness(value, only=only, watch_created=True) as log:
            try:
                new, _ = call_generator(self.generator, self.target, model, self.prompt_ids[i][None], policy,
                                        self.world.new_tokens, run_seed, self.world.vocab_size, keywords=extra)
                output, error = tuple(new.tolist()), None
            except SubjectError as exc:
                output, error = None, exc
        return ForcedRun(policy, i, value, run_seed, log, output, error)

    def drive(self, policies) -> list[ForcedRun]:
        """A generation per policy, prompt and forced value, in that order (a greedy policy's
        prompts get the target's own greedy decode first)."""
        runs = []
        for policy in policies:
            for i in range(FORCED_PROMPTS):
                if policy.greedy and i not in self.expected_greedy:
                    self.expected_greedy[i] = target_greedy(self.target, self.prompt_ids[i], self.world.new_tokens,
                                                            policy)
                for value in FORCED_VALUES:
                    runs.append(self.generate(policy, i, value,
                                              derive_seed(self.seed, f"forced/{policy.label()}/{i}/{value}")))
        return runs

    def failures(self, runs: list[ForcedRun]) -> dict[str, list[tuple[ForcedRun, str]]]:
        """Each check's breaking runs with what went wrong, in run order."""
        found: dict[str, list[tuple[ForcedRun, str]]] = {}
        for run in runs:
            failure = self.broken(run)
            if failure is not None:
                found.setdefault(failure[0], []).append((run, failure[1]))
        return found

    def broken(self, run: ForcedRun) -> tuple[str, str] | None:
        """(check, what went wrong) for a run that breaks a property, or None."""
        if run.error is not None:
            return "forced_no_crash", str(run.error)
        if run.policy.greedy:
            return self.greedy_broken(run)
        j = self.laws.forbidden_at(self.prompts[run.prompt][1], run.policy, run.output)
        if j is None:
            return None
        return "forced_no_forbidden_token", (f"output {list(run.output)}: token {run.output[j]} at position {j} "
                                             f"has probability 0 under {run.policy.describe()}")

    def greedy_broken(self, run: ForcedRun) -> tuple[str, str] | None:
        """A greedy run that is not the target's greedy decode (a float64 tie is not a defect)."""
        want = self.expected_greedy[run.prompt]
        if list(run.output) == want:
            return None
        j = next((t for t in range(min(len(want), len(run.output))) if want[t] != run.output[t]), None)
        if j is None:
            return "forced_greedy", f"output {list(run.output)}, the target's greedy decode {want}"
        target, prompt = self.target, self.prompt_ids[run.prompt]
        prefix = torch.cat([prompt, torch.tensor(want[:j], dtype=torch.int64, device=target.device)])
        _, gap, kind = classify_divergence(target, _float64(target, self.cache), prompt.numel(),
                                           prefix, want[j], run.output[j], run.policy)
        if kind != "defect":
            return None
        return "forced_greedy", (f"new token {j} is {run.output[j]}, the target's greedy token {want[j]} "
                                 f"(float64 logit gap {gap:.3g})")

    def fails_again(self, run: ForcedRun, check: str, value, seed: int, only) -> bool:
        """Whether ``run`` made again (``value`` forced on the draws ``only``) still breaks ``check``."""
        again = self.generate(run.policy, run.prompt, value, seed, only=frozenset(only))
        failure = self.broken(again)
        return failure is not None and failure[0] == check

    def shrink(self, run: ForcedRun, check: str) -> tuple[tuple[int, ...], Reachability]:
        return fewest_forced(lambda only, s: self.fails_again(run, check, run.value, s, only), run.log, run.seed,
                             budget=SHRINK_BUDGET)

    def widened(self, run: ForcedRun, check: str, forced: tuple[int, ...], reach: Reachability) -> Reachability:
        """A trigger of one forced draw, moved by bisection from its boundary value while the
        property still breaks (``exactcheck.step.properties.wrong_interval``, the other draws from
        the seed as in the shrink): the measure of that set of values replaces the point's
        probability when larger. Triggers of several draws keep their point probability."""
        if len(forced) != 1 or reach.kind != "forced" or reach.draws != 1 or reach.value is None:
            return reach
        low, high = wrong_interval(lambda c: self.fails_again(run, check, float(c), run.seed, forced), reach.value,
                                   resolution=WIDEN_RESOLUTION, checks=WIDEN_CHECKS)
        if high - low <= (reach.probability or 0.0):
            return reach
        return wrong_uniforms(low, high, reach.value, reach.dtype, reach.draw_function)


def _verdicts(forced: _ForcedWorld, runs: list[ForcedRun], sampled, found: dict, base: dict) -> list[Verdict]:
    """One verdict per check of ``FORCED_CHECKS``: its finding (shrunk), or that it held, or why
    it was not judged."""
    values = " and ".join({"zero": "0", "one_minus_ulp": "1 - ulp"}[v] for v in FORCED_VALUES)
    sampled_names = ", ".join(p.describe() for p in sampled) or "none"
    escapes = sorted({e for r in runs for e in r.log.escaped} | {n for r in runs for n in r.log.uncontrolled})
    out = []
    for check in FORCED_CHECKS:
        mine = [r for r in runs if (check == "forced_greedy") == r.policy.greedy or check == "forced_no_crash"]
        if check == "forced_no_forbidden_token" and not sampled:
            mine = []
        condition = {
            "forced_no_forbidden_token": f"{len(mine)} generations under {sampled_names}, every draw forced to {values}",
            "forced_no_crash": f"{len(mine)} generations, sampled and greedy, every draw forced to {values}",
            "forced_greedy": f"{len(mine)} greedy generations from {FORCED_PROMPTS} prompts, every draw forced to {values}",
        }[check]
        common = dict(base, check=f"{forced.world.name}/{check}", law=check, condition=condition, samples=len(mine),
                      kind=CheckKind.PROPERTY)
        if check in found:
            out.append(_finding(forced, check, found[check], common))
        else:
            out.append(_held(check, mine, escapes, common))
    return out


def _finding(forced: _ForcedWorld, check: str, failures: list[tuple[ForcedRun, str]], common: dict) -> Verdict:
    """A check's finding: the first of its failing runs (at most ``SHRINK_TRIES``) whose shrunk
    trigger is reachable, else the last tried, unreachable; a one-draw trigger widened."""
    for run, message in failures[:SHRINK_TRIES]:  # the first reachable trigger, if any
        forced_set, reach = forced.shrink(run, check)
        if reach.reachable:
            break
    reach = forced.widened(run, check, forced_set, reach)
    crashed = isinstance(run.error, SubjectCrashed)
    outcome = (Outcome.CRASHED if crashed else Outcome.CONTRACT_VIOLATION) if run.error is not None \
        else Outcome.DEFECT
    if not reach.reachable:
        outcome = Outcome.UNREACHABLE
    summary = (f"with every draw forced to {run.value.replace('_', ' ')}, prompt {run.prompt}, "
               f"{run.policy.describe()}: {message}; the fewest forced draws that still do it: "
               f"{len(forced_set)} ({reach.describe()})")
    return Verdict(outcome=outcome, summary=summary, evidence=FindingEvidence(
        pvalue=0.0, reachability=reach, traceback=run.error.frames if crashed else ()), **common)


def _held(check: str, mine: list[ForcedRun], escapes: list[str], common: dict) -> Verdict:
    """A check with no finding: held where its generations drew through a forced entry point,
    else not applicable or not judged, with the reason."""
    forced_mine = [r for r in mine if r.log.draws]
    if not mine:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            "not applicable: the generator declares no sampling transforms and the world has no mask"),
            evidence=FindingEvidence(), **common)
    if not forced_mine:
        return Verdict(outcome=Outcome.INCONCLUSIVE, summary=(
            f"not judged: none of its {len(mine)} generations drew through a forced entry point"
            + (f" (it drew through: {'; '.join(escapes)})" if escapes else
               " (it drew no random number" + ("; greedy_identity decides)" if check == "forced_greedy" else ")"))),
            evidence=FindingEvidence(), **common)
    escaped_note = ("; draws that escaped the forcing (judged anyway, on outputs): " + "; ".join(escapes)
                    if escapes else "")
    draws = sum(r.log.elements for r in forced_mine)
    return Verdict(outcome=Outcome.EXACT, evidence=FindingEvidence(pvalue=1.0), summary=(
        f"held in {len(mine)} of {len(mine)} generations ({len(forced_mine)} drew, {draws:,} draws "
        f"forced){escaped_note}"), **common)


def _float64(target, cache: dict):
    """A float64 copy of the target (made once per world, for tie classification)."""
    if "target64" not in cache:
        import copy
        cache["target64"] = copy.deepcopy(target).double()
    return cache["target64"]
