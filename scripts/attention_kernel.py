"""specd's CPU attention kernel against PyTorch's, side by side, at the shapes a prefill and a
verify pass give it (the default model: 9 query heads, 3 key/value heads of 64).

Each row times both on the same inputs, alternating, and prints the medians, the ratio and
each one's largest difference from a float64 reference. PyTorch's side is what the lean
forward ran before: ``scaled_dot_product_attention`` with ``is_causal`` from an empty
cache, with a boolean mask on top of one.

    python scripts/attention_kernel.py --threads 2
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
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit(f"the CPU attention kernel is not available: {cpu_kernels.reason}")
    print(f"threads {args.threads}, {args.heads} query heads, {args.kv_heads} key/value heads")
    print(
        "| new tokens | cached | kernel ms | PyTorch ms | PyTorch / kernel | kernel err | PyTorch err |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    for t, past in SHAPES:
        print(_row(t, past, args, gen))


def _row(t: int, past: int, args: argparse.Namespace, gen: torch.Generator) -> str:
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
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for _ in range(3):
        ours(), theirs()
    for _ in range(args.repeats):
        for name, fn in (("ours", ours), ("theirs", theirs)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    a, b = statistics.median(times["ours"]), statistics.median(times["theirs"])
    ea = (ours().double() - ref).abs().max().item()
    eb = (theirs().double() - ref).abs().max().item()
    return f"| {t} | {past} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.2f} | {ea:.1e} | {eb:.1e} |"


if __name__ == "__main__":
    main()
