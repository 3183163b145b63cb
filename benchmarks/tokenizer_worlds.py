"""The two-tokenizer audits measured (issue 43): the TLI, SLEM and SLRS references' false alarms
over seeds at quick, and each translation mutant at a level, on the world that shows it.

    python benchmarks/tokenizer_worlds.py references --seeds 50          # 0 findings expected
    python benchmarks/tokenizer_worlds.py mutants --level standard        # every mutant found

Each reference audit is ``run_generator_audit`` at quick with the seed, greedy identity skipped
(deterministic: it cannot false-alarm, and the tests run it); one JSON line per audit, so an
interrupted run keeps what it measured. The references run the real generate loop through the
toy models (about 8 ms a generation on one core), so 50 seeds of one reference take about 25
minutes of one core.
"""
from __future__ import annotations

import argparse
import json
import time

MUTANT_WORLDS = (("q_written_in_vocab_order", "tok_abc_l4"), ("draft_only_mass_in_q", "tok_abc_l4"),
                 ("target_only_tokens_in_q", "tok_abc_l4"), ("draft_stop_in_target_ids", "tok_abcd_stop"),
                 ("committed_tokens_retokenised", "tok_abc_l4"), ("slrs_canonical_only", "tok_abc_l4"),
                 ("slrs_drawn_tokenisation_q", "tok_abc_l4"))


def references(seeds: range, names: list[str]) -> None:
    from exactcheck.e2e.runner import run_generator_audit
    from exactcheck.e2e.subjects import load_generator
    for name in names:
        generator = load_generator(name)
        for seed in seeds:
            started = time.perf_counter()
            result = run_generator_audit(generator, level="quick", seed=seed, greedy=False, progress=False)
            findings = [(v.check, v.outcome.value) for v in result.verdicts if v.outcome.failed]
            print(json.dumps(dict(reference=name, seed=seed, passed=not findings, findings=findings,
                                  checks=len(result.verdicts), s=round(time.perf_counter() - started, 1))), flush=True)


def mutants(level: str, names: list[str] | None = None) -> None:
    from exactcheck.e2e.runner import run_generator_audit
    from exactcheck.e2e.subjects import load_generator
    for name, world in MUTANT_WORLDS:
        if names and name not in names:
            continue
        started = time.perf_counter()
        result = run_generator_audit(load_generator(f"loop-mutant:{name}"), level=level, seed=0, worlds=[world],
                                     greedy=False, progress=False)
        caught = [v for v in result.verdicts if v.outcome.failed]
        print(json.dumps(dict(mutant=name, world=world, found=bool(caught),
                              caught_by=[f"{v.check} ({v.outcome.value})" for v in caught],
                              first=caught[0].summary[:200] if caught else None,
                              s=round(time.perf_counter() - started, 1))), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("references", "mutants"))
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--reference", action="append",
                        help="reference-tli, reference-slem and reference-slrs by default")
    parser.add_argument("--mutant", action="append", help="every mutant of MUTANT_WORLDS by default")
    parser.add_argument("--level", default="standard")
    args = parser.parse_args()
    if args.what == "references":
        references(range(args.first_seed, args.first_seed + args.seeds),
                   args.reference or ["reference-tli", "reference-slem", "reference-slrs"])
    else:
        mutants(args.level, args.mutant)


if __name__ == "__main__":
    main()
