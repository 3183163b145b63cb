"""A generator audited under a real grammar engine on a real model: SmolLM2 with an xgrammar
JSON-schema mask (``exactcheck.adapters.xgrammar_mask``), applied to the logits through the
decoding policy (a transformers logits processor in the transformers adapter).

Checks (one ``GrammarAuditResult``):

- ``greedy_identity``: greedy under the mask (temperature 0, stop at the tokenizer's stop
  token) equals the target's own masked greedy decode, at several draft lengths;
- ``valid_outputs``: every greedy and sampled output is JSON of the schema (checked by
  ``json.loads`` and a hand-written schema check, not by xgrammar) followed by a stop token;
- ``pit_target_order`` and ``surprisal``: chain-rule tests of the sampled outputs (temperature 1
  under the mask). For each output, one teacher-forced forward of the target gives every
  position's logits; the policy turns them into the masked law p_t in float64. Randomised PIT
  U_t = P_t(tokens more likely than x_t) + V_t p_t(x_t) (ties by id) is i.i.d. uniform when
  every x_t came from p_t (Kolmogorov-Smirnov); the summed surprisal minus its exact mean, over
  its exact standard deviation, is asymptotically N(0, 1). Holm at alpha over the two.
"""
from __future__ import annotations

import torch
from scipy import stats

from exactcheck.contracts.generator import call_generator, generator_name
from exactcheck.e2e.plan import GRAMMAR_WORLD, plan_grammar_audit
from exactcheck.contracts.policy import DecodingPolicy
from exactcheck.e2e.real_runner import RealModelRun
from exactcheck.errors import SubjectCrashed, SubjectError
from exactcheck.options import DEFAULT_ALPHA, CheckKind, derive_seed
from exactcheck.e2e.result import GrammarAuditResult
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, Verdict
from exactcheck.e2e.reproduce import grammar_audit_line
from exactcheck.stats.chain_rule import row_statistics, z_test

__all__ = ["run_grammar_audit", "JSON_PROMPTS", "pit_and_surprisal"]

JSON_PROMPTS = (
    "Give me a user as JSON:", "A user record in JSON:", "Create a JSON object for a new team member:",
    "Output one user as compact JSON:", "JSON for an administrator account:", "Here is a JSON user:",
    "Return a JSON object describing a person:", "User profile (JSON):",
)


def pit_and_surprisal(target, policy: DecodingPolicy, prompt: torch.Tensor, outputs):
    """Per-token chain-rule quantities (``chain_rule.row_statistics``) of ``outputs`` (lists of
    generated ids after ``prompt``), the masked law recomputed by one teacher-forced forward each;
    concatenated over the outputs."""
    parts = []
    for out in outputs:
        ids = torch.cat([prompt, torch.tensor(out[:-1], dtype=prompt.dtype)])[None]
        with torch.no_grad():
            logits = target(input_ids=ids.to(target.device), use_cache=False).logits[0, prompt.numel() - 1:]
        rows = policy.probabilities(logits, [tuple(out[:t]) for t in range(len(out))]).cpu()
        parts.append(row_statistics(rows, rows, torch.tensor(out)))
    return {key: torch.cat([part[key] for part in parts]) for key in ("p", "below_p", "surprisal",
                                                                      "surprisal_mean", "surprisal_var")}


def run_grammar_audit(generator, *, prompts: int = 4, draft_lengths=(1, 4, 8), samples: int = 24,
                      new_tokens: int = 64, seed: int = 0, alpha: float = DEFAULT_ALPHA, progress: bool = True,
                      loaded=None, device: str = "cpu", subject_name: str | None = None) -> GrammarAuditResult:
    """Greedy identity, validity and chain-rule tests of ``generator`` on SmolLM2 under the
    xgrammar mask of ``FOUR_PROPERTY_SCHEMA`` (``exactcheck.e2e.plan.plan_grammar_audit`` names the
    checks). ``subject_name``: how the ``exactcheck grammar`` command names the generator; given
    (and the settings are the command's), the reproduce line is a command.

    Four steps: plan (the models, the mask and its policies, the prompts), drive (greedy identity,
    then the sampled outputs), judge (validity, the contract, the chain-rule tests), finish."""
    audit = _GrammarRun(generator, prompts, draft_lengths, samples, new_tokens, seed, alpha, progress, loaded,
                        device, subject_name)
    try:
        audit.drive()
    except KeyboardInterrupt:
        return audit.run.finish_with(GrammarAuditResult, audit.done, samples_drawn=len(audit.outputs),
                                     interrupted=True, **audit.finish_fields)
    return audit.finish(audit.judge())


class _GrammarRun:
    """One grammar audit: the target and its first-layers draft, the xgrammar mask and its greedy
    and sampling policies, the prompts; and what it has drawn (the greedy identity verdict, the
    sampled outputs, every output's text and whether it stopped, the failed generations)."""

    def __init__(self, generator, prompts: int, draft_lengths, samples: int, new_tokens: int, seed: int,
                 alpha: float, progress: bool, loaded, device: str, subject_name: str | None):
        import importlib.metadata

        from exactcheck.adapters.xgrammar_mask import XGrammarMask, matches_schema
        from toy_models import real_models
        self.matches_schema = matches_schema  # checked by hand, not by xgrammar
        self.generator, self.prompts, self.draft_lengths = generator, prompts, draft_lengths
        self.samples, self.new_tokens, self.seed = samples, new_tokens, seed
        self.plan = plan_grammar_audit(alpha)
        target, self.tokenizer = loaded or real_models.smollm2()
        self.target = target = target.to(device)
        self.draft = real_models.first_layers_draft(target, 4).to(device)
        self.vocab = target.config.vocab_size
        self.mask = mask = XGrammarMask(self.tokenizer, vocab_size=self.vocab)
        self.greedy_policy = DecodingPolicy(0.0, mask=mask, stop_tokens=mask.stop_tokens, name="json_schema_greedy")
        self.sample_policy = DecodingPolicy(1.0, mask=mask, stop_tokens=mask.stop_tokens, name="json_schema")
        self.prompt_ids = [self.tokenizer(p, return_tensors="pt").input_ids[0] for p in JSON_PROMPTS[:prompts]]
        reproduce = grammar_audit_line(subject_name or generator_name(generator), prompts, draft_lengths, samples,
                                       new_tokens, seed, alpha, device, by_command=subject_name is not None)
        self.base = dict(world=GRAMMAR_WORLD, seed=seed, reproduce=reproduce)
        self.texts: list[tuple[str, bool]] = []  # every output's text and whether it stopped
        self.run = RealModelRun(self.plan, prompts * len(draft_lengths) + samples, "exactcheck: grammar", seed=seed,
                                reproduce=reproduce, statistical=alpha is not None, progress=progress)
        self.finish_fields = dict(subject=generator_name(generator), alpha=alpha, device=device,
                                  samples_planned=samples,
                                  environment={"xgrammar": importlib.metadata.version("xgrammar")})
        self.done: list[Verdict] = []
        self.outputs: list[tuple[int, list[int]]] = []  # (prompt index, generated ids)
        self.failures: list[SubjectError] = []

    def keep(self, new: torch.Tensor) -> None:
        """An output's text (stop tokens left out) and whether it ended with a stop token."""
        stops = self.mask.stop_tokens
        self.texts.append((self.tokenizer.decode([t for t in new.tolist() if t not in stops]),
                           bool(new.numel()) and int(new[-1]) in stops))

    # drive

    def drive(self) -> None:
        """Masked greedy identity at every draft length, then the sampled outputs."""
        result = self.run.greedy_identity(self.generator, self.target, self.draft, self.prompt_ids, self.draft_lengths,
                                          self.new_tokens, self.seed, self.vocab, policy=self.greedy_policy,
                                          on_generation=lambda i, k, new, generation: self.keep(new))
        condition = (f"{self.prompts} prompts x draft lengths {list(self.draft_lengths)}, up to {self.new_tokens} "
                     f"tokens, masked greedy")
        self.done.append(result.verdict(f"{GRAMMAR_WORLD}/greedy_identity", condition, **self.base))
        for i in range(self.samples):
            self.sample(i)

    def sample(self, i: int) -> None:
        prompt = self.prompt_ids[i % len(self.prompt_ids)]
        try:
            new, _ = call_generator(self.generator, self.target, self.draft, prompt[None].to(self.target.device),
                                    self.sample_policy, self.new_tokens, derive_seed(self.seed, f"sample/{i}"),
                                    self.vocab)
        except SubjectError as exc:
            self.failures.append(exc)
            return
        finally:
            self.run.step("sampled outputs")
        self.outputs.append((i % len(self.prompt_ids), new.tolist()))
        self.keep(new)

    # judge

    def judge(self) -> list[Verdict]:
        verdicts = [*self.done, self.validity()]
        if self.failures:
            verdicts.append(self.contract())
        if self.outputs:
            verdicts += self.chain_rule()
        return verdicts

    def validity(self) -> Verdict:
        """Every output that stopped is JSON of the schema; an output that reached max_new_tokens
        without a stop token was cut by the length limit (the policy's law includes that)."""
        new_tokens, texts = self.new_tokens, self.texts
        stopped = [t for t, done in texts if done]
        truncated = len(texts) - len(stopped)
        invalid = [t for t in stopped if not self.matches_schema(t)]
        return Verdict(check=f"{GRAMMAR_WORLD}/valid_outputs", law="valid_outputs", samples=len(texts),
                       condition=f"greedy and sampled outputs that stopped: JSON of the schema "
                                 f"(max {new_tokens} tokens)",
                       outcome=Outcome.DEFECT if invalid else Outcome.EXACT, kind=CheckKind.VALIDITY,
                       evidence=FindingEvidence(pvalue=0.0 if invalid else 1.0),
                       summary=(f"{len(stopped) - len(invalid)} of {len(stopped)} stopped outputs valid JSON of "
                                f"the schema"
                                + (f"; {truncated} cut by max_new_tokens={new_tokens}" if truncated else "")
                                + (f"; first invalid: {invalid[0]!r}" if invalid else "")), **self.base)

    def contract(self) -> Verdict:
        failures = self.failures
        return Verdict(check=f"{GRAMMAR_WORLD}/contract", law="contract", condition="every sampled generation",
                       outcome=Outcome.CRASHED if isinstance(failures[0], SubjectCrashed)
                       else Outcome.CONTRACT_VIOLATION, kind=CheckKind.CONTRACT,
                       evidence=FindingEvidence(pvalue=0.0), samples=self.samples,
                       summary=(f"{len(failures)} generation{'s' * (len(failures) != 1)} failed; first: "
                                f"{failures[0]}"), **self.base)

    def chain_rule(self) -> list[Verdict]:
        """The randomised PIT (Kolmogorov-Smirnov) and the summed surprisal's z-test of the sampled
        outputs, the masked law recomputed by teacher forcing."""
        outputs, base = self.outputs, self.base
        parts = [pit_and_surprisal(self.target, self.sample_policy, self.prompt_ids[index],
                                   [o for i, o in outputs if i == index])
                 for index in sorted({i for i, _ in outputs})]
        t = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        v = torch.rand(t["p"].shape, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(derive_seed(self.seed, "pit")))
        pit = (t["below_p"] + v * t["p"]).clamp(0, 1).numpy()
        ks = stats.kstest(pit, "uniform")
        surprisal = z_test("surprisal", t["surprisal"], t["surprisal_mean"], t["surprisal_var"], "surprisal -log p(x)")
        cond = f"{len(outputs)} sampled outputs, {pit.size} tokens, masked law by teacher forcing"
        return [Verdict(check=f"{GRAMMAR_WORLD}/pit_target_order", law="pit_target_order", condition=cond,
                        outcome=Outcome.EXACT, samples=pit.size, kind=CheckKind.CHAIN_RULE,
                        evidence=LawEvidence(Evidence.FIXED_BUDGET, statistic=float(ks.statistic),
                                             statistic_name="Kolmogorov-Smirnov D (randomised PIT)",
                                             pvalue=float(ks.pvalue)),
                        summary=f"D = {ks.statistic:.4f}, p = {ks.pvalue:.3g}", **base),
                Verdict(check=f"{GRAMMAR_WORLD}/surprisal", law="surprisal", condition=cond, outcome=Outcome.EXACT,
                        samples=pit.size, kind=CheckKind.CHAIN_RULE, evidence=LawEvidence(
                            Evidence.FIXED_BUDGET, statistic=surprisal.statistic,
                            statistic_name=surprisal.statistic_name, pvalue=surprisal.pvalue),
                        summary=f"z = {surprisal.statistic:.3f}, p = {surprisal.pvalue:.3g}", **base)]

    # finish

    def finish(self, verdicts: list[Verdict]) -> GrammarAuditResult:
        self.finish_fields["environment"]["outputs"] = [t for t, _ in self.texts][:12]
        return self.run.finish_with(GrammarAuditResult, verdicts, samples_drawn=len(self.outputs),
                                    **self.finish_fields)
