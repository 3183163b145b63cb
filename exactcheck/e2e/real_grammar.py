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
from exactcheck.report.result import GrammarAuditResult
from exactcheck.report.verdict import Evidence, FindingEvidence, LawEvidence, Outcome, Verdict
from exactcheck.reproduce import grammar_audit_line
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
    (and the settings are the command's), the reproduce line is a command."""
    import importlib.metadata

    from exactcheck.adapters.xgrammar_mask import XGrammarMask, matches_schema
    from toy_models import real_models
    plan = plan_grammar_audit(alpha)
    target, tokenizer = loaded or real_models.smollm2()
    target = target.to(device)
    draft = real_models.first_layers_draft(target, 4).to(device)
    vocab = target.config.vocab_size
    mask = XGrammarMask(tokenizer, vocab_size=vocab)
    greedy_policy = DecodingPolicy(0.0, mask=mask, stop_tokens=mask.stop_tokens, name="json_schema_greedy")
    sample_policy = DecodingPolicy(1.0, mask=mask, stop_tokens=mask.stop_tokens, name="json_schema")
    prompt_ids = [tokenizer(p, return_tensors="pt").input_ids[0] for p in JSON_PROMPTS[:prompts]]
    world = GRAMMAR_WORLD
    reproduce = grammar_audit_line(subject_name or generator_name(generator), prompts, draft_lengths, samples,
                                   new_tokens, seed, alpha, device, by_command=subject_name is not None)
    base = dict(world=world, seed=seed, reproduce=reproduce)
    texts = []
    run = RealModelRun(plan, prompts * len(draft_lengths) + samples, "exactcheck: grammar", seed=seed,
                       reproduce=reproduce, statistical=alpha is not None, progress=progress)

    def text(new) -> str:
        return tokenizer.decode([t for t in new if t not in mask.stop_tokens])

    def keep(i, k, new, generation):
        texts.append((text(new.tolist()), bool(new.numel()) and int(new[-1]) in mask.stop_tokens))

    finish = dict(subject=generator_name(generator), alpha=alpha, device=device, samples_planned=samples,
                  environment={"xgrammar": importlib.metadata.version("xgrammar")})
    done, outputs, failures = [], [], []
    try:
        result = run.greedy_identity(generator, target, draft, prompt_ids, draft_lengths, new_tokens, seed, vocab,
                                     policy=greedy_policy, on_generation=keep)
        condition = f"{prompts} prompts x draft lengths {list(draft_lengths)}, up to {new_tokens} tokens, masked greedy"
        done.append(result.verdict(f"{world}/greedy_identity", condition, **base))
        for i in range(samples):
            prompt = prompt_ids[i % len(prompt_ids)]
            try:
                new, _ = call_generator(generator, target, draft, prompt[None].to(target.device), sample_policy,
                                        new_tokens, derive_seed(seed, f"sample/{i}"), vocab)
            except SubjectError as exc:
                failures.append(exc)
                continue
            finally:
                run.step("sampled outputs")
            outputs.append((i % len(prompt_ids), new.tolist()))
            texts.append((text(new.tolist()), bool(new.numel()) and int(new[-1]) in mask.stop_tokens))
    except KeyboardInterrupt:
        return run.finish_with(GrammarAuditResult, done, samples_drawn=len(outputs), interrupted=True, **finish)
    # an output that reached max_new_tokens without a stop token was cut by the length limit (the
    # policy's law includes that); every output that stopped must be JSON of the schema
    stopped = [t for t, done in texts if done]
    truncated = len(texts) - len(stopped)
    invalid = [t for t in stopped if not matches_schema(t)]
    validity = Verdict(check=f"{world}/valid_outputs", law="valid_outputs", samples=len(texts),
                       condition=f"greedy and sampled outputs that stopped: JSON of the schema (max {new_tokens} tokens)",
                       outcome=Outcome.DEFECT if invalid else Outcome.EXACT, kind=CheckKind.VALIDITY,
                       evidence=FindingEvidence(pvalue=0.0 if invalid else 1.0),
                       summary=(f"{len(stopped) - len(invalid)} of {len(stopped)} stopped outputs valid JSON of the schema"
                                + (f"; {truncated} cut by max_new_tokens={new_tokens}" if truncated else "")
                                + (f"; first invalid: {invalid[0]!r}" if invalid else "")), **base)
    verdicts = [*done, validity]
    if failures:
        verdicts.append(Verdict(check=f"{world}/contract", law="contract", condition="every sampled generation",
                                outcome=Outcome.CRASHED if isinstance(failures[0], SubjectCrashed)
                                else Outcome.CONTRACT_VIOLATION, kind=CheckKind.CONTRACT,
                                evidence=FindingEvidence(pvalue=0.0), samples=samples,
                                summary=(f"{len(failures)} generation{'s' * (len(failures) != 1)} failed; first: "
                                         f"{failures[0]}"), **base))
    if outputs:
        parts = [pit_and_surprisal(target, sample_policy, prompt_ids[index], [o for i, o in outputs if i == index])
                 for index in sorted({i for i, _ in outputs})]
        t = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        v = torch.rand(t["p"].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(derive_seed(seed, "pit")))
        pit = (t["below_p"] + v * t["p"]).clamp(0, 1).numpy()
        ks = stats.kstest(pit, "uniform")
        surprisal = z_test("surprisal", t["surprisal"], t["surprisal_mean"], t["surprisal_var"], "surprisal -log p(x)")
        cond = f"{len(outputs)} sampled outputs, {pit.size} tokens, masked law by teacher forcing"
        verdicts.append(Verdict(check=f"{world}/pit_target_order", law="pit_target_order", condition=cond,
                                outcome=Outcome.EXACT, samples=pit.size, kind=CheckKind.CHAIN_RULE,
                                evidence=LawEvidence(Evidence.FIXED_BUDGET, statistic=float(ks.statistic),
                                                     statistic_name="Kolmogorov-Smirnov D (randomised PIT)",
                                                     pvalue=float(ks.pvalue)),
                                summary=f"D = {ks.statistic:.4f}, p = {ks.pvalue:.3g}", **base))
        verdicts.append(Verdict(check=f"{world}/surprisal", law="surprisal", condition=cond, outcome=Outcome.EXACT,
                                samples=pit.size, kind=CheckKind.CHAIN_RULE, evidence=LawEvidence(
                                    Evidence.FIXED_BUDGET, statistic=surprisal.statistic,
                                    statistic_name=surprisal.statistic_name, pvalue=surprisal.pvalue),
                                summary=f"z = {surprisal.statistic:.3f}, p = {surprisal.pvalue:.3g}", **base))
    finish["environment"]["outputs"] = [t for t, _ in texts][:12]
    return run.finish_with(GrammarAuditResult, verdicts, samples_drawn=len(outputs), **finish)
