"""A 1k-token editor prefill with the CPU kernels' row-wise operations
(specd/forward/row_ops.py) against the same prefill with PyTorch's, alternating prefill by
prefill in one process: the median milliseconds of each and the median of their ratios.
With ``--against REV``, this checkout's kernels against those built from a git revision's
sources instead (a build without the row functions runs PyTorch's operations).

    python scripts/row_ops.py --rounds 8
    python scripts/row_ops.py --against HEAD~3 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from step_kernel import _sources_at

from specd import Engine, allocator
from specd.bench import workloads
from specd.forward import cpu_kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--against", default=None, help="a git revision's kernels, side by side")
    args = p.parse_args()
    allocator.keep_freed_memory()  # as the specd command does
    engine = Engine.load(None)
    if cpu_kernels.row_ops(cpu_kernels.MIN_TOKENS, torch.float32, torch.device("cpu")) is None:
        raise SystemExit(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    prompts = workloads.build("editor", engine.target, limit=args.prompts)
    real, isa = cpu_kernels.row_ops, cpu_kernels.isa()
    if args.against:
        sources = {"this checkout": None, args.against: _sources_at(args.against)}
        for where in sources.values():
            cpu_kernels.use(isa, where)  # built before the timing
    else:
        sources = {"row ops": None, "PyTorch": None}
    times: dict[str, list[float]] = {side: [] for side in sources}
    for _ in range(args.rounds):
        for prompt in prompts:
            for side, ts in times.items():
                cpu_kernels.use(isa, sources[side])
                cpu_kernels.row_ops = (lambda *a: None) if side == "PyTorch" else real  # type: ignore[assignment]
                cache = engine.target.new_cache()
                t = time.perf_counter()
                engine.target.prefill(cache, prompt.ids)
                ts.append(time.perf_counter() - t)
    cpu_kernels.row_ops = real  # type: ignore[assignment]
    for side, ts in times.items():
        print(f"{side}: median {statistics.median(ts) * 1e3:.0f} ms, fastest {min(ts) * 1e3:.0f}")
    first, second = times
    ratios = [a / b for a, b in zip(times[first], times[second])]
    print(f"{first} / {second}, prefill by prefill: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
