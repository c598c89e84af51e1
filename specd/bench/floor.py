"""The memory floor of a decode step, and how far the target's one-token step is above it.

A one-token decode step of a small model is memory-bound: it must read every weight once.
The floor is therefore ``weight bytes ÷ memory bandwidth``, with the bandwidth measured on
this machine by copying a tensor much larger than the caches (STREAM's convention: a copy
of B bytes moves 2·B — B read, B written). Both are measured in the same process with the
same thread setting as the benchmark.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..target import Target


def copy_bandwidth_gb_s(
    nbytes: int = 256 * 2**20, repeats: int = 7, device: torch.device | str = "cpu"
) -> float:
    """Bytes moved (read + written) per second by a large, warmed tensor copy, in GB/s.

    :returns: the best of ``repeats`` copies (the least disturbed by other processes).
    """
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):  # warm: page in both buffers
        dst.copy_(src)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    del src, dst
    return 2 * n * 4 / best / 1e9


@torch.inference_mode()
def decode_step_times(
    target: Target, context: int = 1024, repeats: int = 20, warmup: int = 3
) -> list[float]:
    """Seconds of each of ``repeats`` one-token forwards on top of ``context`` cached tokens."""
    ctx = min(context, _max_positions(target) - 2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (ctx + 1,), generator=gen).tolist()
    cache = target.new_cache(capacity=ctx + 8)
    target.prefill(cache, tokens[:ctx])
    times = []
    for i in range(warmup + repeats):
        _sync(target.device)
        t = time.perf_counter()
        target.forward(cache, [tokens[ctx]])
        _sync(target.device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
        cache.crop(ctx)
    return times


def measure(target: Target, context: int = 1024) -> dict[str, Any]:
    """The ``floor`` section of the report.

    :returns: ``step_s`` (median target one-token step at ``context``), ``floor_s`` (weight
        bytes ÷ copy bandwidth), ``copy_gb_s``, and for reading them: ``ratio`` (step ÷
        floor), ``step_min_s`` and ``ratio_min`` (the fastest step),
        ``weight_bytes``, ``kv_bytes`` (the cache a step also reads at that context) and
        ``context``.
    """
    bw = copy_bandwidth_gb_s(device=target.device)
    times = decode_step_times(target, context)
    step = statistics.median(times)
    weights = target.weight_bytes()
    floor = weights / (bw * 1e9)
    return {
        "step_s": step,
        "floor_s": floor,
        "copy_gb_s": bw,
        "ratio": step / floor if floor > 0 else None,
        # On a shared machine the fastest step is the one least slowed by other processes,
        # measured like the bandwidth (best of several).
        "step_min_s": min(times),
        "ratio_min": min(times) / floor if floor > 0 else None,
        "weight_bytes": weights,
        "kv_bytes": kv_bytes(target, context),
        "context": context,
    }


def kv_bytes(target: Target, context: int) -> int:
    """Bytes of keys and values a step reads at ``context`` cached tokens."""
    cfg = target.config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = torch.empty((), dtype=target.dtype).element_size()
    return 2 * target.num_layers * heads * head_dim * context * elem


def _max_positions(target: Target) -> int:
    cfg = target.config.get_text_config(decoder=True)
    return int(getattr(cfg, "max_position_embeddings", 0) or 1 << 20)


def _sync(device: torch.device | str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
