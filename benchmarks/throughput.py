"""Driver + reference throughput against a memory-copy floor measured in the same run.

One verify step of one trial moves target_probs [(k+1) V] and draft_probs [k V] float32, the
draft tokens [k] and the output [k+1] int64. The floor is how many such steps per second a plain
device memory copy of those bytes reaches (preallocated buffers, best of several repeats); the
ratio says how close the whole speculative loop (drafting from the toy LM, building target rows,
verifying, validating, committing) comes to just moving its data once.

    python benchmarks/throughput.py            # V = 32, k = 4, B = 200,000 on CPU
    python benchmarks/throughput.py --device cuda
    python benchmarks/throughput.py --sweep [--device cuda] [--json FILE]
        # V in {32, 4096, 32000, 152064} x k in {1, 4, 8}; B sized to the device's free memory
    python benchmarks/throughput.py --compile [--sweep | --pairs N] [--device cuda]
        # the driver's drafting and row building compiled (drive_sequences(compile=True)), and
        # the subject the corpus's ``compiled_step``: the reference's step as one torch.compile'd
        # graph, checked token for token against the eager driver + reference in the same run;
        # --pairs N: N eager and N compiled measurements, alternating (the machine's speed drifts)

In the sweep each cell's batch is the largest that fits half the device's free memory
(``exactcheck.memory.device_max_elements``), capped at 200,000 trials; the world keeps at most
2^25 table entries (fewer states at large V), and the floor copies the same bytes per step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from exactcheck.corpus.verifiers import compiled_step
from exactcheck.step.drive import drive_sequences
from exactcheck.memory import device_max_elements, keep_freed_memory
from exactcheck.contracts.reference_verifier import reference_verifier
from toy_models import make_context_world


def _timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


SWEEP_VOCABS = (32, 4096, 32000, 152064)
SWEEP_DRAFT_LENGTHS = (1, 4, 8)


def bytes_per_step(vocab: int, k: int) -> int:
    return ((k + 1) * vocab + k * vocab) * 4 + (k + (k + 1)) * 8


def measure(vocab: int, k: int, batch: int, length: int, device: torch.device, repeats: int,
            max_elements: int | None = None, compile: bool = False) -> dict:
    """Floor and driver+reference rates for one (V, k, B), measured alternately; ``compile``:
    compiled driver and ``compiled_step`` as the subject."""
    states = max(16, min(1031, (1 << 25) // vocab))
    world = make_context_world("bench", vocab=vocab, num_states=states, length=length,
                               draft_length=k, agreement=0.8, seed=0)
    step_bytes = bytes_per_step(vocab, k)
    src = torch.empty(batch * step_bytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    elements = max_elements or batch * (k + 1) * vocab
    result = {}
    subject = compiled_step if compile else reference_verifier

    def run():
        result["samples"] = drive_sequences(subject, world, batch, seed=1, device=device,
                                            max_elements=elements, compile=compile)

    subject_s = []

    def timed_subject(*args):
        out = []
        subject_s[-1] += _timed(lambda: out.append(subject(*args)))
        return out[0]

    def split():
        subject_s.append(0.0)
        drive_sequences(timed_subject, world, batch, seed=1, device=device, max_elements=elements,
                        compile=compile)

    run()  # warm up (alias tables, allocator, kernels; compiles with --compile)
    same = None
    if compile:  # the compiled loop must give the eager loop's sequences, token for token
        eager = drive_sequences(reference_verifier, world, batch, seed=1, device=device, max_elements=elements)
        same = torch.equal(eager.sequences, result["samples"].sequences)
        del eager
    copies, drives, splits = [], [], []
    for _ in range(repeats):
        copies += [_timed(lambda: dst.copy_(src)) for _ in range(5)]
        drives.append(_timed(run))
        splits.append(_timed(split))
    copy_s, drive_s = statistics.median(copies), statistics.median(drives)
    # where the time goes, from separate runs with the subject's calls timed: the reference
    # (the subject) against the driver (drafting, building rows, validating, committing)
    reference_s = statistics.median(subject_s)
    driver_s = statistics.median(total - inside for total, inside in zip(splits, subject_s))
    samples = result["samples"]
    floor = batch / copy_s
    rate = samples.steps / drive_s
    return dict(vocab=vocab, k=k, batch=batch, states=states, length=length,
                bytes_per_step=step_bytes, copy_s=copy_s, copy_gb_per_s=batch * step_bytes / copy_s / 1e9,
                floor_steps_per_s=floor, drive_s=drive_s, steps=samples.steps, calls=samples.calls,
                steps_per_s=rate, ratio=rate / floor, reference_s=reference_s, driver_s=driver_s,
                compiled=compile, same_sequences_as_eager=same,
                driver_ratio=samples.steps / driver_s / floor, reference_ratio=samples.steps / reference_s / floor)


def sweep(device: torch.device, length: int, repeats: int, max_batch: int, compile: bool = False) -> list[dict]:
    rows = []
    for vocab in SWEEP_VOCABS:
        for k in SWEEP_DRAFT_LENGTHS:
            per_trial = (k + 1) * vocab
            elements = device_max_elements(device)
            batch = max(1, min(max_batch, elements // per_trial))
            while True:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    row = measure(vocab, k, batch, length, device, repeats, max_elements=batch * per_trial,
                                  compile=compile)
                    break
                except torch.OutOfMemoryError:
                    if batch == 1:
                        raise
                    print(f"V={vocab:,} k={k}: out of memory at B={batch:,}; halving", flush=True)
                    batch //= 2
            if device.type == "cuda":  # what a call really held per target_probs element
                row["peak_bytes_per_element"] = torch.cuda.max_memory_allocated(device) / (batch * per_trial)
            rows.append(row)
            print(f"V={vocab:>7,} k={k}  B={batch:>8,}  floor {row['floor_steps_per_s']:>14,.0f} steps/s "
                  f"({row['copy_gb_per_s']:6.1f} GB/s)  driver {row['steps_per_s']:>14,.0f} steps/s "
                  f"({row['calls']} calls, {row['drive_s']:.3f} s)  ratio {row['ratio']:.3f}"
                  f"  (reference alone {row['reference_ratio']:.2f}, driver alone {row['driver_ratio']:.2f})"
                  + (f"  peak {row['peak_bytes_per_element']:.0f} B/element" if "peak_bytes_per_element" in row else "")
                  + (f"  same sequences as eager: {row['same_sequences_as_eager']}" if compile else ""),
                  flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=32)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch", type=int, default=200_000)
    parser.add_argument("--length", type=int, default=64, help="tokens generated per trial")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sweep", action="store_true",
                        help="V in {32, 4096, 32000, 152064} x k in {1, 4, 8}, batch sized to the device")
    parser.add_argument("--compile", action="store_true",
                        help="compiled driver (drive_sequences(compile=True)) and the compiled_step subject")
    parser.add_argument("--pairs", type=int, default=0,
                        help="with --compile: N eager and N compiled measurements of one cell, alternating")
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument("--system-allocator", action="store_true",
                        help="leave glibc's allocator as it is (no keep_freed_memory)")
    args = parser.parse_args(argv)
    allocator = "glibc defaults" if args.system_allocator else (
        "glibc, freed blocks kept" if keep_freed_memory() else "unchanged (not glibc)")
    device = torch.device(args.device)
    header = (f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
              + f", torch {torch.__version__}, {torch.get_num_threads()} threads, allocator: {allocator}"
              + (", compiled driver + compiled_step" if args.compile else ", eager driver + reference"))
    print(header)
    if args.pairs:
        rows = []
        for _ in range(args.pairs):
            for compiled in (False, True):
                row = measure(args.vocab, args.k, args.batch, args.length, device, args.repeats, compile=compiled)
                rows.append(row)
                print(f"{'compiled' if compiled else 'eager   '}  floor {row['copy_s'] * 1e3:5.1f} ms  loop "
                      f"{row['drive_s']:.2f} s  ratio {row['ratio']:.3f}  (subject alone {row['reference_ratio']:.2f}, "
                      f"driver alone {row['driver_ratio']:.2f})"
                      + (f"  same sequences as eager: {row['same_sequences_as_eager']}" if compiled else ""),
                      flush=True)
    elif args.sweep:
        rows = sweep(device, length=args.length, repeats=args.repeats, max_batch=args.batch, compile=args.compile)
    else:
        row = measure(args.vocab, args.k, args.batch, args.length, device, args.repeats, compile=args.compile)
        rows = [row]
        print(f"world: context LM, V={row['vocab']}, k={row['k']}, B={row['batch']:,}, {row['length']} tokens "
              f"per trial, {row['states']} states")
        print(f"memory-copy floor (median of {5 * args.repeats}): {row['batch'] * row['bytes_per_step'] / 1e6:.0f} MB "
              f"in {row['copy_s'] * 1e3:.1f} ms = {row['floor_steps_per_s']:,.0f} verify steps/s "
              f"({row['copy_gb_per_s']:.1f} GB/s)")
        print(f"driver + reference (median of {args.repeats}): {row['steps']:,} verify steps "
              f"({row['calls']} calls) in {row['drive_s']:.2f} s = {row['steps_per_s']:,.0f} verify steps/s")
        print(f"ratio to floor: {row['ratio']:.2f} (target >= 0.25)")
        if args.compile:
            print(f"same sequences as the eager driver + reference: {row['same_sequences_as_eager']}")
        print(f"split (median of {args.repeats} timed runs): subject {row['reference_s']:.2f} s "
              f"(alone {row['reference_ratio']:.2f} of the floor), driver {row['driver_s']:.2f} s "
              f"(alone {row['driver_ratio']:.2f} of the floor)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=header, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
