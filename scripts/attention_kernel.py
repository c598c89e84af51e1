"""specd's CPU attention kernel against PyTorch's, side by side, at the shapes a prefill and a
verify pass give it (the default model: 9 query heads, 3 key/value heads of 64).

Each row times both on the same inputs, alternating, and prints the medians, the ratio and
each one's largest difference from a float64 reference. PyTorch's side is what the lean
forward ran before: ``scaled_dot_product_attention`` with ``is_causal`` from an empty
cache, with a boolean mask on top of one. ``--isa`` compares builds of the kernel (the
instruction sets this CPU runs: cpu_kernels.runnable_isas), side by side in each row.

    python scripts/attention_kernel.py --threads 2
    python scripts/attention_kernel.py --isa avx512,avx2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from specd.forward import cpu_kernels

SHAPES = [(1024, 0), (512, 0), (256, 0), (64, 0), (256, 768), (64, 1024), (16, 1024), (9, 1024)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--isa", default=None, help="builds to compare, e.g. avx512,avx2")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit(f"the CPU attention kernel is not available: {cpu_kernels.reason}")
    isas = args.isa.split(",") if args.isa else [cpu_kernels.isa()]
    for name in isas:
        try:
            cpu_kernels.use(name)
        except (ValueError, RuntimeError) as e:
            raise SystemExit(f"--isa {name}: {e}") from None
    print(f"threads {args.threads}, {args.heads} query heads, {args.kv_heads} key/value heads")
    print(
        "| new tokens | cached | "
        + " | ".join(f"{k} ms | PyTorch / {k} | {k} err" for k in isas)
        + " | PyTorch ms | PyTorch err |"
    )
    print("|---:|---:|" + "---:|---:|---:|" * len(isas) + "---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for t, past in SHAPES:
        print(_row(t, past, args, gen, isas))


def _row(t: int, past: int, args: argparse.Namespace, gen: torch.Generator, isas: list[str]) -> str:
    q = torch.randn(1, t, args.heads, 64, generator=gen).transpose(1, 2)
    cap = past + t + 64
    keys = torch.randn(1, args.kv_heads, cap, 64, generator=gen)[:, :, : past + t]
    values = torch.randn(1, args.kv_heads, cap, 64, generator=gen)[:, :, : past + t]
    seen = torch.ones(t, past + t, dtype=torch.bool).tril_(past)

    def ours() -> torch.Tensor:
        return cpu_kernels.attention(q, keys, values, 0.125)

    def theirs() -> torch.Tensor:
        if past == 0:
            return F.scaled_dot_product_attention(
                q, keys, values, is_causal=True, scale=0.125, enable_gqa=True
            )
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=seen, scale=0.125, enable_gqa=True
        )

    ref = F.scaled_dot_product_attention(
        q.double(), keys.double(), values.double(), attn_mask=seen, scale=0.125, enable_gqa=True
    )
    times: dict[str, list[float]] = {name: [] for name in (*isas, "PyTorch")}
    errs: dict[str, float] = {}
    for name in isas:
        cpu_kernels.use(name)
        for _ in range(3):
            ours()
        errs[name] = (ours().double() - ref).abs().max().item()
    for _ in range(3):
        theirs()
    errs["PyTorch"] = (theirs().double() - ref).abs().max().item()
    for _ in range(args.repeats):
        for name in times:
            if name != "PyTorch":
                cpu_kernels.use(name)
            t0 = time.perf_counter()
            ours() if name != "PyTorch" else theirs()
            times[name].append(time.perf_counter() - t0)
    ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    cells = [f"{ms[k]:.3f} | {ms['PyTorch'] / ms[k]:.2f} | {errs[k]:.1e}" for k in isas]
    return (
        f"| {t} | {past} | "
        + " | ".join(cells)
        + f" | {ms['PyTorch']:.3f} | {errs['PyTorch']:.1e} |"
    )


if __name__ == "__main__":
    main()
