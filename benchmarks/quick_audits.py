"""Each kind's quick audit as a user runs it, next to its floor: the subject's own work.

Per kind (step, tree, tree-loop, e2e, recurrent, greedy on tiny-llama, serve against the toy
server), in one run on this machine:

- **wall**: the command as a user types it (a fresh process, the default ``--jobs auto``), and with
  ``--jobs 1``;
- in this process, the same audit serially (``--jobs 1``), timed from the command's start, with two
  clocks inside it: the time in the **subject's calls** (``call_subject``: every verify or generate
  call, the subject's drafting and verifying included) and the time in the **target's forward
  calls** (the world's target model; for greedy, a real transformers model whose draft is the same
  class, every model forward). The target's forwards are the floor no audit of that subject can go
  under on one core; the subject's calls, the floor of a serial audit of it; the rest (imports,
  world building, laws, statistics, reports) is exactcheck's own.

The serve row starts two toy servers in this process (``toy_models.served_lm``: the audited one
speculative, the reference plain) and audits them with ``exactcheck serve URL --reference URL``;
its floor is the audited server's time answering (``respond``).

    python benchmarks/quick_audits.py --json reports/quick-audits.json
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # wall_time, beside this script

KINDS = {
    "step": ["audit", "exactcheck.contracts.reference_verifier:reference_verifier", "--level", "quick"],
    "tree": ["tree", "tree-reference:multi_round", "--level", "quick"],
    "tree-loop": ["tree-loop", "tree-loop-reference", "--level", "quick"],
    "e2e": ["e2e", "reference-loop", "--level", "quick"],
    "recurrent": ["recurrent", "recurrent-snapshot", "--level", "quick"],
    "greedy": ["greedy", "reference-loop", "--model", "tiny-llama"],
    "serve": ["serve", "{url}", "--reference", "{reference}", "--level", "quick"],
}
TAKES_JOBS = {"step", "tree-loop", "e2e", "recurrent"}


class Clock:
    """Seconds spent inside the wrapped calls (nested calls of the same clock counted once)."""

    def __init__(self):
        self.seconds, self.calls, self._depth = 0.0, 0, threading.local()

    def wrap(self, fn, only=None):
        clock = self

        def timed(*args, **kwargs):
            if only is not None and not only(args):
                return fn(*args, **kwargs)
            depth = getattr(clock._depth, "n", 0)
            clock._depth.n = depth + 1
            begun = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                clock._depth.n = depth
                if depth == 0:
                    clock.seconds += time.perf_counter() - begun
                    clock.calls += 1
        return timed


@contextlib.contextmanager
def patched(pairs):
    """Set (owner, name, value) for the block, restoring the originals after."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in pairs]
    for owner, name, value in pairs:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _is_target(args) -> bool:
    return getattr(args[0], "role", "target") == "target"


def instrumented(kind: str) -> list:
    """(owner, name, timed function) pairs: the subject's calls and the target's forwards."""
    import exactcheck.contracts.generator as generator
    import exactcheck.contracts.tree_generator as tree_generator
    import exactcheck.contracts.tree_verifier as tree_verifier
    import exactcheck.contracts.verifier as verifier
    import exactcheck.subject_call as subject_call
    subject, target = Clock(), Clock()
    pairs = [(module, "call_subject", subject.wrap(subject_call.call_subject))
             for module in (generator, tree_generator, tree_verifier, verifier)]
    if kind in ("e2e", "recurrent"):
        from toy_models.hf_toy_lm import ToyLMForCausalLM
        from toy_models.recurrent_lm import RecurrentLMForCausalLM
        pairs += [(cls, "forward", target.wrap(cls.forward, _is_target))
                  for cls in (ToyLMForCausalLM, RecurrentLMForCausalLM)]
    elif kind == "tree-loop":
        from toy_models.tree_cache_lm import TreeCacheLM
        pairs.append((TreeCacheLM, "forward", target.wrap(TreeCacheLM.forward, _is_target)))
    elif kind == "greedy":
        from transformers import LlamaForCausalLM
        pairs.append((LlamaForCausalLM, "forward", target.wrap(LlamaForCausalLM.forward)))
    elif kind == "serve":
        import toy_models.served_lm as served
        pairs.append((served, "respond", target.wrap(served.respond)))
    return pairs, subject, target


def wall(argv: list[str], directory: str) -> tuple[float, int]:
    """``wall_time.wall``: the command in a fresh process, quiet, its reports in ``directory``."""
    from wall_time import wall as timed
    return timed([sys.executable, "-m", "exactcheck", *argv, "--quiet"], directory)


def in_process(kind: str, argv: list[str]) -> dict:
    """The audit serially in this process, with the subject's and the target's clocks."""
    from exactcheck.cli import main
    pairs, subject, target = instrumented(kind)
    with patched(pairs):
        clock = time.perf_counter()
        code = main(argv + (["--jobs", "1"] if kind in TAKES_JOBS else []) + ["--quiet"])
        seconds = time.perf_counter() - clock
    return {"seconds": seconds, "exit": code, "subject_seconds": subject.seconds, "subject_calls": subject.calls,
            "target_seconds": target.seconds, "target_calls": target.calls}


@contextlib.contextmanager
def toy_servers():
    """(audited URL, reference URL): the toy served model, speculative and plain."""
    from toy_models.served_lm import ToyServedModel, served_model
    model = ToyServedModel()
    with served_model(model.as_plain()) as reference, served_model(model) as audited:
        yield audited.url, reference.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", action="append", choices=list(KINDS), help="only this kind (repeatable)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    os.environ.pop("EXACTCHECK_JOBS", None)
    rows = {}
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as scratch, toy_servers() as (url, reference):
        for kind in args.kind or KINDS:
            command = [a.format(url=url, reference=reference) for a in KINDS[kind]]
            row = {"command": "exactcheck " + " ".join(KINDS[kind])}
            row["wall"], row["exit"] = wall(command, scratch)
            if kind in TAKES_JOBS:
                row["wall_jobs_1"], _ = wall(command + ["--jobs", "1"], scratch)
            row["in_process"] = in_process(kind, command + ["--report", scratch])
            load.append(os.getloadavg()[0])
            rows[kind] = row
            p = row["in_process"]
            print(f"{kind:<10} wall {row['wall']:6.1f} s (exit {row['exit']})"
                  + (f", --jobs 1 {row['wall_jobs_1']:6.1f} s" if "wall_jobs_1" in row else "")
                  + f"; serial in process {p['seconds']:6.1f} s: subject's calls {p['subject_seconds']:6.1f} s "
                  f"({p['subject_calls']:,}), target's forwards {p['target_seconds']:6.1f} s ({p['target_calls']:,})",
                  flush=True)
    print(f"\nload average (1 min) at the start and after each kind: {', '.join(f'{x:.2f}' for x in load)}")
    print("\n| kind | wall (default jobs) | wall, --jobs 1 | serial in process | subject's calls | target's forwards |"
          "\n|---|---:|---:|---:|---:|---:|")
    for kind, row in rows.items():
        p = row["in_process"]
        jobs_1 = f"{row['wall_jobs_1']:.1f} s" if "wall_jobs_1" in row else "–"
        print(f"| {kind} | {row['wall']:.1f} s | {jobs_1} | {p['seconds']:.1f} s | {p['subject_seconds']:.1f} s | "
              f"{p['target_seconds']:.1f} s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "exactcheck.quick_audits/1", "cores": os.cpu_count(), "load": load, "kinds": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
