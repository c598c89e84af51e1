"""How fast the step kernel's product reads each block format: one token times a matrix of
random blocks (the K-quants' as tests/test_decode_step.py makes them, the others quantized
from normal values), the median of 30 calls, in billions of values and GB a second.

    python scripts/block_products.py --rows 8192 --cols 1536
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from specd.forward import blocks, cpu_kernels

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_decode_step import k_quant  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--cols", type=int, default=1536, help="a multiple of 256")
    p.add_argument("--formats", default="q4_0,q4_1,q5_0,q5_1,q8_0,q4_k,q5_k,q6_k")
    args = p.parse_args()
    if not cpu_kernels.available():
        raise SystemExit(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    torch.manual_seed(0)
    n, k = args.rows, args.cols
    x = torch.randn(1, k)
    print(f"kernel {cpu_kernels.isa()}, {torch.get_num_threads()} threads, {n} x {k}")
    for name in args.formats.split(","):
        if name in blocks.QUANTIZABLE:
            w = blocks.quantize(torch.randn(n, k), name)
        else:
            w = k_quant((n, k), name)
        for _ in range(3):
            blocks.product(x, w)
        times = []
        for _ in range(30):
            t = time.perf_counter()
            blocks.product(x, w)
            times.append(time.perf_counter() - t)
        med = statistics.median(times)
        print(
            f"{name}: {w.nbytes / 1e6:.1f} MB, {med * 1e3:.3f} ms, "
            f"{n * k / med / 1e9:.1f} billion values/s, {w.nbytes / med / 1e9:.1f} GB/s"
        )


if __name__ == "__main__":
    main()
