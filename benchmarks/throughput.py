"""Driver + reference throughput against a memory-copy floor measured in the same run.

One verify step of one trial moves target_probs [(k+1) V] and draft_probs [k V] float32, the
draft tokens [k] and the output [k+1] int64. The floor is how many such steps per second a plain
device memory copy of those bytes reaches (preallocated buffers, best of several repeats); the
ratio says how close the whole speculative loop (drafting from the toy LM, building target rows,
verifying, validating, committing) comes to just moving its data once.

    python benchmarks/throughput.py            # V = 32, k = 4, B = 200,000 on CPU
    python benchmarks/throughput.py --device cuda
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from exactcheck.step.drive import drive_sequences
from exactcheck.memory import keep_freed_memory
from exactcheck.step.reference import reference_verifier
from toy_models import make_context_world


def _timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--length", type=int, default=64, help="tokens generated per trial")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--system-allocator", action="store_true",
                        help="leave glibc's allocator as it is (no keep_freed_memory)")
    args = parser.parse_args(argv)
    allocator = "glibc defaults" if args.system_allocator else (
        "glibc, freed blocks kept" if keep_freed_memory() else "unchanged (not glibc)")
    device = torch.device(args.device)
    vocab, k, batch = args.vocab, args.k, args.batch

    world = make_context_world("bench", vocab=vocab, num_states=1031, length=args.length,
                               draft_length=k, agreement=0.8, seed=0)
    bytes_per_step = ((k + 1) * vocab + k * vocab) * 4 + (k + (k + 1)) * 8
    src = torch.empty(batch * bytes_per_step, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    result = {}

    def run():
        result["samples"] = drive_sequences(reference_verifier, world, batch, seed=1, device=device,
                                            max_elements=batch * (k + 1) * vocab)

    run()  # warm up (alias tables, allocator)
    # floor and loop measured alternately, so a slow patch of the machine hits both alike
    copies, drives = [], []
    for _ in range(args.repeats):
        copies += [_timed(lambda: dst.copy_(src)) for _ in range(5)]
        drives.append(_timed(run))
    copy_s, drive_s = statistics.median(copies), statistics.median(drives)
    floor = batch / copy_s
    samples = result["samples"]
    rate = samples.steps / drive_s
    print(f"world: context LM, V={vocab}, k={k}, B={batch:,}, {args.length} tokens per trial, "
          f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"allocator: {allocator}")
    print(f"memory-copy floor (median of {len(copies)}): {batch * bytes_per_step / 1e6:.0f} MB in "
          f"{copy_s * 1e3:.1f} ms "
          f"= {floor:,.0f} verify steps/s ({batch * bytes_per_step / copy_s / 1e9:.1f} GB/s)")
    print(f"driver + reference (median of {len(drives)}): {samples.steps:,} verify steps "
          f"({samples.calls} calls) in {drive_s:.2f} s = {rate:,.0f} verify steps/s")
    print(f"ratio to floor: {rate / floor:.2f} (target >= 0.25)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
