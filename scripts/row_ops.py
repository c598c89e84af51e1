"""A 1k-token editor prefill with the CPU kernels' row-wise operations
(specd/forward/row_ops.py) against the same prefill with PyTorch's, alternating prefill by
prefill in one process: the median milliseconds of each and the median of their ratios.

    python scripts/row_ops.py --rounds 8
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specd import Engine, allocator
from specd.bench import workloads
from specd.forward import cpu_kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--prompts", type=int, default=2)
    args = p.parse_args()
    allocator.keep_freed_memory()  # as the specd command does
    engine = Engine.load(None)
    if cpu_kernels.row_ops(cpu_kernels.MIN_TOKENS, torch.float32, torch.device("cpu")) is None:
        raise SystemExit(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    prompts = workloads.build("editor", engine.target, limit=args.prompts)
    real = cpu_kernels.row_ops
    times: dict[str, list[float]] = {"row ops": [], "PyTorch": []}
    for _ in range(args.rounds):
        for prompt in prompts:
            for side, ts in times.items():
                cpu_kernels.row_ops = real if side == "row ops" else (lambda *a: None)  # type: ignore[assignment]
                cache = engine.target.new_cache()
                t = time.perf_counter()
                engine.target.prefill(cache, prompt.ids)
                ts.append(time.perf_counter() - t)
    cpu_kernels.row_ops = real  # type: ignore[assignment]
    for side, ts in times.items():
        print(f"{side}: median {statistics.median(ts) * 1e3:.0f} ms, fastest {min(ts) * 1e3:.0f}")
    ratios = [a / b for a, b in zip(times["row ops"], times["PyTorch"])]
    print(f"row ops / PyTorch, prefill by prefill: median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
