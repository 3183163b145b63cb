"""transformers' assisted generation and prompt lookup on tiny random HYBRID models, as shipped.

For every architecture of ``toy_models.hybrid_models.BUILDS_HERE`` (hidden 64, 4 layers: state
layers 0 and 2, attention 1 and 3, the state made to matter) and every mode

- ``assisted``: ``target.generate(assistant_model=draft)``, the draft a noisy copy of the target
  (relative noise 0.3 for greedy; 1.0 for the sampled laws, so that drafts are often rejected);
- ``prompt-lookup``: ``target.generate(prompt_lookup_num_tokens=k)``;
- ``target`` (control): plain ``target.generate``, which must pass everything;
- ``assisted-defaults`` (greedy only): ``generate(assistant_model=draft)`` with transformers' own
  drafting defaults (20 tokens, constant schedule, confidence threshold 0.4: the draft stops early);

it measures:

1. **greedy identity**: ``--prompts`` random prompts x draft lengths ``--draft-lengths``,
   ``--new-tokens`` tokens, against exactcheck's own incremental greedy decode of the target
   (``exactcheck.generation.greedy_identity``; a divergence is classified by its float64 gap);
2. **state invariants**: every greedy run's final target cache against a fresh recompute over
   its final sequence (``exactcheck.e2e.recurrent_cache``: conv, recurrent, keys, values per
   layer; tolerance ``TOLERANCE`` relative, 100x the float32 recompute noise measured here too);
3. **sampled laws** (temperature ``--temperature``, fixed seeds): (a) the law of the SECOND new
   token after a repetitive prompt (b b, b 4 random tokens: prompt lookup finds candidates at
   once) against its exact marginal sum_x1 p(x1) p(x2 | x1) (one batched forward), Pearson with
   TV estimate, 95% interval and the TV detectable at power 0.9 (``stats.goodness_of_fit``),
   ``--law-samples`` generations of 4 tokens at draft length 2; (b) the chain-rule tests of whole generations
   (randomised PIT, Kolmogorov-Smirnov; surprisal z; ``exactcheck.e2e.real_grammar.pit_and_surprisal``):
   ``--chain-samples`` generations of ``--new-tokens`` tokens over 5 repetitive prompts. Holm at
   ``--alpha`` over the three law tests of every (architecture, mode) row.

Writes ``--out``.json and ``--out``.md. On 2 shared CPU cores with one torch thread, about a minute
per architecture.

    python benchmarks/hybrid_transformers.py --out reports/hybrid-transformers
    python benchmarks/hybrid_transformers.py --archs qwen3_next lfm2 --prompts 4 --law-samples 200
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

MODES = ("assisted", "prompt-lookup", "target", "assisted-defaults")
LAW_MODES = ("assisted", "prompt-lookup", "target")
SAMPLED_DRAFT_NOISE = 1.0


class DefaultAssisted:
    """``target.generate(assistant_model=draft)`` with the draft's generation config untouched."""

    name = "transformers.generate(assistant_model=draft) [transformers' drafting defaults]"

    def __call__(self, target, draft, input_ids, policy, max_new_tokens, seed):
        # as exactcheck.adapters.hf_generate calls generate, without setting the drafting options
        from exactcheck.adapters.hf_generate import policy_kwargs
        from exactcheck.contracts.transformers_compat import output_cache
        from exactcheck.contracts.generator import Generation
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(seed)
            out = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                                  min_new_tokens=max_new_tokens, return_dict_in_generate=True, assistant_model=draft,
                                  **policy_kwargs(policy, input_ids.shape[-1]))
        return Generation(out.sequences, target_cache=output_cache(out))


def patch_keep_one_more() -> None:
    """The one-line fix the findings point to, applied in this process only (``--patched``): every
    ``Cache.activate_past_recording`` keeps one more recurrent state than asked, so a verify forward
    of k + 1 tokens records the state after each of them and rolling back all k drafts restores the
    state after the first (generation/utils.py:4002 asks for ``num_drafting_tokens``)."""
    from transformers.cache_utils import Cache
    original = Cache.activate_past_recording

    def keep_one_more(self, **kwargs):
        if kwargs.get("recurrent_states_to_keep") is not None:
            kwargs["recurrent_states_to_keep"] += 1
        return original(self, **kwargs)

    Cache.activate_past_recording = keep_one_more


def _generator(mode: str, k: int | None = None):
    from exactcheck.adapters.hf_generate import AssistedGeneration, PromptLookup, TargetGenerate
    if mode == "assisted-defaults":
        return DefaultAssisted()
    if mode == "assisted":
        return AssistedGeneration(draft_length=k or 2)
    if mode == "prompt-lookup":
        return PromptLookup(draft_length=k or 2)
    return TargetGenerate()


def _repetitive_prompts(count: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        base = torch.randint(256, (4,), generator=g)
        out.append(torch.cat([base, base]))
    return out


class StateChecks:
    """``on_generation`` hook of the greedy sweep: every run's final target cache checked."""

    def __init__(self, target, prompts):
        self.target, self.prompts = target, prompts
        self.checked, self.breached, self.by_part, self.first = 0, 0, {}, []

    def __call__(self, i, k, new, generation):
        from exactcheck.e2e.recurrent_cache import final_state_breaches
        if generation.target_cache is None:
            return
        self.checked += 1
        final = torch.cat([self.prompts[i], new])[None]
        breaches = final_state_breaches(self.target, generation.target_cache, final)
        if breaches:
            # the first breach (lowest layer; conv, recurrent, keys, values) is the root: the later
            # layers read its output, so their states differ as a consequence
            self.breached += 1
            root = f"layer {breaches[0].layer} {breaches[0].part}"
            self.by_part[root] = self.by_part.get(root, 0) + 1
            if len(self.first) < 3:
                self.first.append(f"prompt {i}, draft length {k}: " + "; ".join(b.describe() for b in breaches[:2]))

    def summary(self) -> dict:
        return dict(checked=self.checked, breached=self.breached, parts=self.by_part, first=self.first)


def greedy_row(mode, target, draft, prompts, lengths, new_tokens, seed) -> dict:
    from exactcheck.generation.greedy_identity import greedy_identity
    generator = _generator(mode)
    pairs = [(i, k) for i in range(len(prompts)) for k in (lengths if mode in ("assisted", "prompt-lookup") else (None,))]
    states = StateChecks(target, prompts)
    start = time.perf_counter()
    result = greedy_identity(generator, target, draft, prompts, lengths, new_tokens, seed, 256, pairs=pairs,
                             on_generation=states)
    bad_prompts = sorted({d.prompt for d in result.divergences} | {int(f.split(",")[0].split()[1])
                                                                   for f in result.failures})
    return dict(runs=result.runs, identical=result.identical, defects=len(result.defects), ties=len(result.ties),
                failures=len(result.failures), prompts=len(prompts), prompts_diverging=len(bad_prompts),
                first_divergences=[d.describe() for d in result.divergences[:3]],
                first_failures=list(result.failures[:2]), states=states.summary(),
                seconds=round(time.perf_counter() - start, 1))


def second_token_law(target, prompt: torch.Tensor, temperature: float) -> np.ndarray:
    """The exact law of the second new token after ``prompt``: sum_x1 p(x1) p(. | prompt, x1)."""
    vocab = target.config.vocab_size
    with torch.no_grad():
        p1 = (target(input_ids=prompt[None], use_cache=False).logits[0, -1].double() / temperature).softmax(-1)
        batch = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], 1)
        p2 = (target(input_ids=batch, use_cache=False).logits[:, -1].double() / temperature).softmax(-1)
    law = (p1[:, None] * p2).sum(0).numpy()
    return law / law.sum()


def law_row(mode, target, draft, law_samples, chain_samples, new_tokens, temperature, seed, alpha) -> dict:
    from scipy import stats

    from exactcheck.contracts.generator import call_generator
    from exactcheck.contracts.policy import DecodingPolicy
    from exactcheck.e2e.real_grammar import pit_and_surprisal
    from exactcheck.errors import SubjectError
    from exactcheck.options import derive_seed
    from exactcheck.stats.chain_rule import z_test
    from exactcheck.stats.goodness_of_fit import goodness_of_fit, holm
    policy = DecodingPolicy(temperature)
    generator = _generator(mode, 2)
    start = time.perf_counter()
    failures = []
    # (a) the second token's law after one repetitive prompt
    prompt = _repetitive_prompts(1, derive_seed(seed, "law-prompt"))[0]
    expected = second_token_law(target, prompt, temperature)
    counts = np.zeros(expected.size, dtype=np.int64)
    for i in range(law_samples):
        try:
            # 4 tokens, not 2: transformers caps a round's drafts at max_length - length - 1, and with 2
            # new tokens the first round would draft 1 token (fewer than recorded), not 2
            new, _ = call_generator(generator, target, draft, prompt[None], policy, 4, derive_seed(seed, f"x2/{i}"), 256)
            counts[int(new[1])] += 1
        except SubjectError as exc:
            failures.append(str(exc))
    fit = goodness_of_fit(counts, expected, alpha / 3)
    # (b) chain rule over whole generations
    prompts = _repetitive_prompts(5, derive_seed(seed, "chain-prompts"))
    outputs = {j: [] for j in range(len(prompts))}
    for i in range(chain_samples):
        j = i % len(prompts)
        try:
            new, _ = call_generator(generator, target, draft, prompts[j][None], policy, new_tokens,
                                    derive_seed(seed, f"chain/{i}"), 256)
            outputs[j].append(new.tolist())
        except SubjectError as exc:
            failures.append(str(exc))
    parts = [pit_and_surprisal(target, policy, prompts[j], outs) for j, outs in outputs.items() if outs]
    row = dict(samples=law_samples, chain_samples=chain_samples, failures=len(failures),
               first_failure=failures[0] if failures else None,
               x2=dict(pvalue=fit.pvalue, tv=fit.tv_estimate, tv_interval=list(fit.tv_interval),
                       detectable_tv=fit.detectable_tv, cells=fit.pooled_cells, samples=int(counts.sum())))
    pvalues = [fit.pvalue]
    if parts:
        t = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
        v = torch.rand(t["p"].shape, dtype=torch.float64, generator=torch.Generator().manual_seed(derive_seed(seed, "pit")))
        pit = (t["below_p"] + v * t["p"]).clamp(0, 1).numpy()
        ks = stats.kstest(pit, "uniform")
        surprisal = z_test("surprisal", t["surprisal"], t["surprisal_mean"], t["surprisal_var"], "surprisal")
        row["pit"] = dict(statistic=float(ks.statistic), pvalue=float(ks.pvalue), tokens=int(pit.size))
        row["surprisal"] = dict(z=surprisal.statistic, pvalue=surprisal.pvalue, tokens=int(pit.size))
        pvalues += [float(ks.pvalue), surprisal.pvalue]
    adjusted, _ = holm(pvalues, alpha, family=3)
    row["holm"] = adjusted
    row["verdict"] = "DEFECT" if min(adjusted) <= alpha else ("crashed" if failures else "pass")
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def measure(name: str, args) -> dict:
    from exactcheck.e2e.recurrent_cache import recompute_noise
    from toy_models import hybrid_models as H
    start = time.perf_counter()
    spec = H.ARCHITECTURES[name]
    target, draft = H.hybrid_pair(name, seed=args.seed)
    _, law_draft = H.hybrid_pair(name, seed=args.seed, draft_noise=SAMPLED_DRAFT_NOISE)
    if args.laws_only:  # the sampled laws only: they need generate and a no-cache forward, nothing 5.x-specific
        out = dict(arch=name, model_type=spec.model_type, mixer=spec.mixer, knob=spec.knob, greedy={}, laws={})
        for mode in args.modes:
            if mode in LAW_MODES:
                out["laws"][mode] = law_row(mode, target, law_draft, args.law_samples, args.chain_samples,
                                            args.new_tokens, args.temperature, args.seed, args.alpha)
                print(f"  {name} {mode}: laws {out['laws'][mode]['verdict']}", file=sys.stderr, flush=True)
        out["seconds"] = round(time.perf_counter() - start, 1)
        return out
    default = H.build_target(name, seed=args.seed, state_matters=False)
    g = torch.Generator().manual_seed(args.seed + 7)
    sequences = [torch.randint(256, (1, 35), generator=g) for _ in range(3)]
    noise_tokens, noise_chunks = {}, {}
    for s in sequences:
        for key, value in recompute_noise(target, s, chunkings=(None,)).items():
            noise_tokens[key] = max(noise_tokens.get(key, 0.0), value)
        for key, value in recompute_noise(target, s, chunkings=(3,)).items():
            noise_chunks[key] = max(noise_chunks.get(key, 0.0), value)
    out = dict(arch=name, model_type=spec.model_type, mixer=spec.mixer, knob=spec.knob,
               cache_layers=[s.kind for s in H.recompute_states(target, sequences[0][:, :4])],
               sensitivity=H.state_sensitivity(target, sequences[0][:, :12]),
               sensitivity_default_init=H.state_sensitivity(default, sequences[0][:, :12]),
               noise_token_by_token=noise_tokens, noise_three_chunks=noise_chunks)
    prompts = H.hybrid_prompts(count=args.prompts, seed=args.seed)
    out["greedy"], out["laws"] = {}, {}
    for mode in args.modes:
        out["greedy"][mode] = greedy_row(mode, target, draft, prompts, args.draft_lengths, args.new_tokens, args.seed)
        print(f"  {name} {mode}: greedy {out['greedy'][mode]['runs'] - out['greedy'][mode]['identical']}"
              f"/{out['greedy'][mode]['runs']} differ, states {out['greedy'][mode]['states']['breached']}"
              f"/{out['greedy'][mode]['states']['checked']} breached", file=sys.stderr, flush=True)
        if args.law_samples and mode in LAW_MODES:
            out["laws"][mode] = law_row(mode, target, law_draft, args.law_samples, args.chain_samples, args.new_tokens,
                                        args.temperature, args.seed, args.alpha)
            print(f"  {name} {mode}: laws {out['laws'][mode]['verdict']} (x2 TV {out['laws'][mode]['x2']['tv']:.3f}, "
                  f"p {out['laws'][mode]['x2']['pvalue']:.3g})", file=sys.stderr, flush=True)
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-300 else "<1e-300"


def markdown(report: dict) -> str:
    env = report["environment"]
    patched = " (PATCHED: every activate_past_recording keeps one more state)" if report["settings"].get("patched") else ""
    lines = [f"# transformers {env['transformers']}{patched}: assisted generation and prompt lookup on tiny hybrid models", "",
             f"torch {env['torch']}, CPU, one thread; seed {report['settings']['seed']}; "
             f"{report['settings']['prompts']} prompts x draft lengths {report['settings']['draft_lengths']}, "
             f"{report['settings']['new_tokens']} new tokens (greedy); sampled laws at temperature "
             f"{report['settings']['temperature']}, draft length 2, {report['settings']['law_samples']} four-token generations "
             f"(second-token law) and {report['settings']['chain_samples']} whole generations (chain rule), "
             f"Holm at alpha {report['settings']['alpha']}. State tolerance {report['tolerance']} relative "
             f"(float32 recompute noise, token by token vs one prefill: max {report['max_noise']:.2g}). "
             f"{report['seconds']:.0f} s in all."
             + (" **Laws only** (`--laws-only`): the greedy, state and noise stages read transformers 5.x's hybrid "
                "cache and were not run." if report["settings"].get("laws_only") else ""), "",
             "Greedy: runs that differ from the target's own greedy decode / runs (defects by float64 gap, "
             "ties, crashes), prompts affected / prompts. States: runs whose final target cache breaches / runs "
             "checked (parts: the first breach of each run, lowest layer first; later layers differ as a consequence). Laws: second-token law TV estimate [95% interval] (detectable TV) and p; PIT and "
             "surprisal p; verdict after Holm.", "",
             "| architecture | mode | greedy differ | defects / ties / crashes | prompts | states breached | "
             "parts | x2 TV [95%] (det.) | x2 p | PIT p | surprisal z | law verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["architectures"]:
        if "error" in row:
            lines.append(f"| {row['arch']} | - | {row['error']} | | | | | | | | | |")
            continue
        for mode in MODES:
            if mode not in row["greedy"] and mode not in row["laws"]:
                continue
            law = row["laws"].get(mode)
            if mode in row["greedy"]:
                g = row["greedy"][mode]
                s = g["states"]
                parts = ", ".join(f"{k} {v}" for k, v in sorted(s["parts"].items())) or "-"
                greedy_cells = (f"{g['runs'] - g['identical']}/{g['runs']} | {g['defects']} / {g['ties']} / "
                                f"{g['failures']} | {g['prompts_diverging']}/{g['prompts']} | "
                                f"{s['breached']}/{s['checked']} | {parts}")
            else:  # --laws-only
                greedy_cells = "not run | | | not run |"
            if law:
                x2 = law["x2"]
                pit = _fmt_p(law["pit"]["pvalue"]) if "pit" in law else "-"
                z = f"{law['surprisal']['z']:+.1f}" if "surprisal" in law else "-"
                lawcells = (f"{x2['tv']:.3f} [{x2['tv_interval'][0]:.2f}, {x2['tv_interval'][1]:.2f}] "
                            f"({x2['detectable_tv']:.2f}) | {_fmt_p(x2['pvalue'])} | {pit} | {z} | {law['verdict']}"
                            + (f" ({law['failures']} crashed)" if law["failures"] else ""))
            else:
                lawcells = "- | - | - | - | -"
            lines.append(f"| {row['arch']} | {mode} | {greedy_cells} | {lawcells} |")
    lines += ["", "## State sensitivity and recompute noise", "",
              "TV by which the next-token law moves when every recurrent state is zeroed / one token stale / "
              "every conv state zeroed (the state-matters knob on; in brackets: the default initialisation of "
              "the mixer), and the float32 recompute noise (max relative difference, token by token | three "
              "chunks, against one prefill).", "",
              "| architecture | mixer | knob | zero state | stale state | zero conv | noise (token by token) | "
              "noise (3 chunks) |", "|---|---|---|---|---|---|---|---|"]
    for row in report["architectures"]:
        if "error" in row or "sensitivity" not in row:  # (--laws-only measures no sensitivity)
            continue
        s, d = row["sensitivity"], row["sensitivity_default_init"]

        def cell(key):
            return f"{s[key]:.3f} ({d[key]:.3f})" if key in s else "-"
        lines.append(f"| {row['arch']} | {row['mixer']} | {row['knob']} | {cell('zero_state')} | {cell('stale_state')} | "
                     f"{cell('zero_conv')} | {max(row['noise_token_by_token'].values()):.2g} | "
                     f"{max(row['noise_three_chunks'].values()):.2g} |")
    lines += ["", "## First divergences, breaches and crashes", ""]
    for row in report["architectures"]:
        if "error" in row:
            continue
        for mode in MODES:
            if mode not in row["greedy"] and mode not in row["laws"]:
                continue
            g = row["greedy"].get(mode)
            items = g["first_divergences"][:1] + g["first_failures"][:1] + g["states"]["first"][:1] if g else []
            if row["laws"].get(mode, {}).get("first_failure"):
                items.append("sampled: " + row["laws"][mode]["first_failure"])
            for item in items:
                lines.append(f"- {row['arch']} / {mode}: {item[:400]}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    import transformers

    from exactcheck.e2e.recurrent_cache import TOLERANCE
    from toy_models import hybrid_models as H
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--archs", nargs="*", default=list(H.BUILDS_HERE))
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--draft-lengths", type=int, nargs="*", default=[1, 2, 3, 4])
    parser.add_argument("--law-samples", type=int, default=600)
    parser.add_argument("--chain-samples", type=int, default=30)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--alpha", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--patched", action="store_true",
                        help="apply the one-line fix (patch_keep_one_more) before measuring")
    parser.add_argument("--laws-only", action="store_true",
                        help="the sampled laws only (no greedy, state or noise stage: those read transformers 5.x's "
                             "hybrid cache; this is how the floor, 4.57, is measured)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--update", action="store_true",
                        help="merge the architectures and modes measured now into the report at --out "
                             "(same settings) instead of replacing it")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    if args.patched:
        patch_keep_one_more()
    start = time.perf_counter()
    rows = []
    for name in args.archs:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure(name, args))
        except Exception as exc:  # an architecture that does not build or run here is a row, not a stop
            rows.append(dict(arch=name, error=f"{type(exc).__name__}: {str(exc)[:300]}"))
        if args.out:  # what is measured so far, in case the run is cut short
            Path(args.out + ".partial.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    settings = dict(prompts=args.prompts, new_tokens=args.new_tokens, draft_lengths=args.draft_lengths,
                    law_samples=args.law_samples, chain_samples=args.chain_samples, temperature=args.temperature,
                    laws_only=args.laws_only,
                    alpha=args.alpha, seed=args.seed, sampled_draft_noise=SAMPLED_DRAFT_NOISE,
                    patched=args.patched)
    seconds = round(time.perf_counter() - start, 1)
    if args.update and args.out and Path(args.out + ".json").exists():
        old = json.loads(Path(args.out + ".json").read_text())
        old["settings"].setdefault("patched", False)
        if old["settings"] != settings or old["environment"]["transformers"] != transformers.__version__:
            raise SystemExit(f"--update: {args.out}.json was measured with other settings: {old['settings']}")
        merged = {row["arch"]: row for row in old["architectures"]}
        for row in rows:
            previous = merged.get(row["arch"])
            if previous and "error" not in previous and "error" not in row:
                previous["greedy"].update(row["greedy"])
                previous["laws"].update(row["laws"])
            else:
                merged[row["arch"]] = row
        rows = [merged[name] for name in H.ARCHITECTURES if name in merged]
        seconds += old["seconds"]
    noise = [v for r in rows if "error" not in r for v in r.get("noise_token_by_token", {}).values()]
    report = dict(environment=dict(transformers=transformers.__version__, torch=torch.__version__),
                  settings=settings, tolerance=TOLERANCE, max_noise=max(noise) if noise else 0.0, architectures=rows,
                  seconds=seconds)
    text = markdown(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out + ".json").write_text(json.dumps(report, indent=1, default=float) + "\n")
        Path(args.out + ".md").write_text(text)
        Path(args.out + ".partial.json").unlink(missing_ok=True)
    print(text)


if __name__ == "__main__":
    main()
