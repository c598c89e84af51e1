"""The memory floor of a decode step, and how far the target's one-token step is above it.

A one-token decode step of a small model is memory-bound: it must read every weight once,
as stored (float32, or the quantized blocks the kernel decodes as it reads them), and the
keys and values of the cached context. The floor is therefore ``(weight bytes + cache
bytes) ÷ read bandwidth``, with the read bandwidth measured on this machine by summing a
tensor much larger than the caches. The copy bandwidth (STREAM's convention: a copy of B
bytes moves 2·B, B read and B written) is reported beside it. All are measured in the same
process with the same thread setting as the benchmark.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..forward.target import Target
from ..kvcache import KVCache

#: Trials of the floor measurement (bandwidth, then steps), of which the median counts.
TRIALS = 5
#: Tokens in the verify passes timed beside the one-token step: what drafting a few tokens
#: costs on top of the step it saves.
PASS_TOKENS = (2, 4, 8)


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


def read_bandwidth_gb_s(
    nbytes: int = 256 * 2**20, repeats: int = 7, device: torch.device | str = "cpu"
) -> float:
    """Bytes read per second by summing a large, warmed tensor, in GB/s: what a step that
    streams its weights can reach.

    :returns: the best of ``repeats`` sums (the least disturbed by other processes).
    """
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    for _ in range(2):  # warm: page it in
        src.sum()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        src.sum()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    del src
    return nbytes // 4 * 4 / best / 1e9


@torch.inference_mode()
def decode_step_times(
    target: Target,
    context: int = 1024,
    repeats: int = 20,
    warmup: int = 3,
    eager: bool = False,
    prepared: tuple[KVCache, int] | None = None,
    tokens: int = 1,
) -> list[float]:
    """Seconds of each of ``repeats`` forwards of ``tokens`` tokens (a chain, as a verify
    pass feeds) on top of ``context`` cached tokens (with ``eager``, without the compiled
    step even where the target has one).

    :param prepared: a cache already holding the context and the next token, from
        :func:`prepare` (prefilled here otherwise).
    """
    cache, token = prepared or prepare(target, context)
    ctx = cache.length
    times = []
    for i in range(warmup + repeats):
        _sync(target.device)
        t = time.perf_counter()
        target.forward(cache, [token] * tokens, eager=eager)
        _sync(target.device)
        if i >= warmup:
            times.append(time.perf_counter() - t)
        cache.crop(ctx)
    return times


@torch.inference_mode()
def prepare(target: Target, context: int) -> tuple[KVCache, int]:
    """A cache holding ``context`` random tokens (fewer where the model's positions end),
    and one more token to step with."""
    ctx = min(context, target.max_positions - 2)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, target.vocab_size, (ctx + 1,), generator=gen).tolist()
    cache = target.new_cache(capacity=ctx + 2 * max(PASS_TOKENS))
    target.prefill(cache, tokens[:ctx])
    return cache, tokens[ctx]


def measure(
    target: Target, context: int = 1024, trials: int = TRIALS, repeats: int = 8
) -> dict[str, Any]:
    """The ``floor`` section of the report, from ``trials`` trials.

    The copy bandwidth of this (virtual, shared) machine moves by a third between runs, so
    one reading makes a ratio nobody can repeat. Each trial measures the bandwidth and then
    ``repeats`` steps right after it, so a trial's ratio pairs figures taken under the same
    conditions; the report gives the median trial and the spread of the trials. Where the
    target has a compiled step (:mod:`specd.forward.compiled`), each trial times the eager step too,
    in the same trial.

    :returns: ``step_s`` (median over trials of each trial's median step), ``floor_s``
        (weight and cache bytes ÷ the median read bandwidth), ``read_gb_s``, ``copy_gb_s``
        (the median copy bandwidth, for comparison with earlier reports), ``ratio`` (median of
        the trials' step ÷ floor), ``ratio_lo`` and ``ratio_hi`` (the least and greatest
        trial), ``trials`` (each trial's ``read_gb_s``, ``copy_gb_s``, ``step_s``, ``ratio``),
        ``step_min_s`` and ``ratio_min`` (the fastest step of all), ``compiled`` (whether
        the step timed was the compiled one), ``backend`` (its compile backend),
        ``compile_s`` (what compiling it took),
        ``eager_step_s`` and ``compiled_speedup``
        (eager ÷ compiled median, None without a compiled step), ``weight_bytes``,
        ``kv_bytes`` (the cache a step also reads at that context), ``context``, and
        ``pass_ratio``: for each of :data:`PASS_TOKENS`, the median over trials of a pass of
        that many tokens ÷ the same trial's one-token step.
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    weights = target.weight_bytes()
    reads = weights + kv_bytes(target, context)
    compiled = target.compiled is not None and target.compiled.ready
    rows: list[dict[str, float]] = []
    all_times: list[float] = []
    eager: list[float] = []
    passes: dict[int, list[float]] = {n: [] for n in PASS_TOKENS}
    prepared = prepare(target, context)
    for _ in range(trials):
        copy = copy_bandwidth_gb_s(repeats=3, device=target.device)
        bw = read_bandwidth_gb_s(repeats=3, device=target.device)
        times = decode_step_times(target, context, repeats, prepared=prepared)
        all_times += times
        step = statistics.median(times)
        ratio = step * bw * 1e9 / reads
        rows.append({"read_gb_s": bw, "copy_gb_s": copy, "step_s": step, "ratio": ratio})
        if compiled:
            times = decode_step_times(target, context, repeats, eager=True, prepared=prepared)
            eager.append(statistics.median(times))
        for n in PASS_TOKENS:
            times = decode_step_times(target, context, repeats, prepared=prepared, tokens=n)
            passes[n].append(statistics.median(times) / step)
    # A step that turned itself off mid-measurement ran eager: say so.
    compiled = compiled and target.compiled is not None and target.compiled.ready
    ratios = [r["ratio"] for r in rows]
    bw = statistics.median(r["read_gb_s"] for r in rows)
    step = statistics.median(r["step_s"] for r in rows)
    floor = reads / (bw * 1e9)
    eager_step = statistics.median(eager) if eager else None
    return {
        "step_s": step,
        "floor_s": floor,
        "read_gb_s": bw,
        "copy_gb_s": statistics.median(r["copy_gb_s"] for r in rows),
        "ratio": statistics.median(ratios),
        "ratio_lo": min(ratios),
        "ratio_hi": max(ratios),
        "trials": rows,
        # On a shared machine the fastest step is the one least slowed by other processes.
        "step_min_s": min(all_times),
        "ratio_min": min(all_times) / floor,
        "compiled": compiled,
        "compile_s": target.compiled.compile_s if compiled and target.compiled else None,
        "backend": target.compiled.backend if compiled and target.compiled else None,
        "eager_step_s": eager_step,
        "compiled_speedup": eager_step / step if eager_step else None,
        "weight_bytes": weights,
        "kv_bytes": kv_bytes(target, context),
        "context": context,
        "pass_ratio": {n: statistics.median(r) for n, r in passes.items()},
    }


def kv_bytes(target: Target, context: int) -> int:
    """Bytes of keys and values a step reads at ``context`` cached tokens."""
    cfg = target.config.get_text_config(decoder=True)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    elem = torch.empty((), dtype=target.kv_dtype).element_size()
    return 2 * target.num_layers * heads * head_dim * context * elem


def _sync(device: torch.device | str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
