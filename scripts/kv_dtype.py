"""Passes of the step that serves the default model over a float32 KV cache and over one of
halves (``--kv-dtype float32`` against ``float16``), alternating in one process: the median
milliseconds of a forward of T tokens (a chain, as a verify pass feeds) on top of a cached
context, for each T, and the ratio.

    python scripts/kv_dtype.py
    python scripts/kv_dtype.py --context 4096 --widths 1,8 --rounds 8
"""

from __future__ import annotations

import argparse
import statistics

import torch

from specd import Engine, allocator
from specd.bench import floor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--widths", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    allocator.keep_freed_memory()  # as the specd command does
    torch.set_num_threads(args.threads)
    target = Engine.load(args.model, drafter="none").target
    step = target.compiled.backend if target.compiled is not None else "eager"
    kinds = (torch.float32, torch.float16)
    prepared = {}
    for kv in kinds:
        target.kv_dtype = kv
        prepared[kv] = floor.prepare(target, args.context)
    widths = [int(w) for w in args.widths.split(",")]
    times: dict[tuple[int, torch.dtype], list[float]] = {}
    for _ in range(args.rounds):
        for t in widths:
            for kv in kinds:
                target.kv_dtype = kv
                runs = floor.decode_step_times(
                    target, args.context, args.repeats, prepared=prepared[kv], tokens=t
                )
                times.setdefault((t, kv), []).append(statistics.median(runs))
    print(
        f"{args.context} cached tokens, {args.threads} threads, the {step} step, "
        f"medians of {args.rounds} rounds"
    )
    print("| tokens | float32 cache ms | float16 cache ms | float32 / float16 |")
    print("|---:|---:|---:|---:|")
    for t in widths:
        a, b = (statistics.median(times[t, kv]) * 1e3 for kv in kinds)
        print(f"| {t} | {a:.2f} | {b:.2f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
