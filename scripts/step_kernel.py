"""specd's step kernel against the eager lean forward, pass by pass, alternating in one
process: the median seconds of a forward of T tokens (a chain, as a verify pass feeds) on
top of a cached context, for each T, and the kernel's passes over its one-token step.

    python scripts/step_kernel.py --threads 2 --context 1024

The eager side runs as `specd bench --packed-weights on` runs it (prepacked weights for
every pass); the kernel is the `kernel` compile backend (specd/forward/csrc/decode_step.cpp).
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
    p.add_argument("--widths", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--packed-weights", choices=("auto", "on", "off"), default="on")
    args = p.parse_args()
    allocator.keep_freed_memory()  # as the specd command does
    torch.set_num_threads(args.threads)
    target = Engine.load(
        args.model, drafter="none", compile="on", packed_weights=args.packed_weights
    ).target
    step = target.compiled
    if step is None or not step.ready or step.backend != "kernel":
        raise SystemExit(f"the step kernel is not in use here: {step and step.reason}")
    widths = [int(w) for w in args.widths.split(",")]
    prepared = floor.prepare(target, args.context)
    times: dict[tuple[int, bool], list[float]] = {}
    for _ in range(args.rounds):
        for t in widths:
            for eager in (False, True):
                runs = floor.decode_step_times(
                    target, args.context, args.repeats, prepared=prepared, tokens=t, eager=eager
                )
                times.setdefault((t, eager), []).append(statistics.median(runs))
    one = statistics.median(times[(widths[0], False)])
    print(f"{args.context} cached tokens, {args.threads} threads, medians of {args.rounds} rounds")
    print("| tokens | kernel ms | eager ms | eager / kernel | kernel / its one-token step |")
    print("|---:|---:|---:|---:|---:|")
    for t in widths:
        k, e = (statistics.median(times[(t, eager)]) for eager in (False, True))
        print(f"| {t} | {k * 1e3:.2f} | {e * 1e3:.2f} | {e / k:.2f} | {k / one:.2f} |")


if __name__ == "__main__":
    main()
