"""The benchmark run: floor, warm-up, interleaved timing, prefix-cache check, peak RSS.

Configurations are interleaved per prompt — every configuration runs on prompt 1, then
every configuration on prompt 2, with the order rotated from prompt to prompt — so load
from other processes and thermal drift fall on all configurations alike, and the ratios
of one run compare like with like.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..forward import cpu_kernels, pricing
from ..forward import weights as stored
from . import floor as floor_mod
from . import prefix as prefix_mod
from .configs import REFERENCES, Config
from .probe import PROBE_ENV, TargetSpec, job
from .report import aggregate
from .runners import Run, Runner
from .targets import check_targets
from .workloads import Prompt

log = logging.getLogger(__name__)


@dataclass
class BenchOptions:
    """:param rss: ``isolated`` (a fresh process per configuration, see
        :mod:`specd.bench.probe`), ``inprocess`` (reset the peak mark around each run in this
        process) or ``off``.
    :param rss_prompts: prompts each isolated probe runs.
    :param repeats: runs of each configuration on each prompt (interleaved); the fastest
        counts.
    """

    rss: str = "isolated"
    rss_prompts: int = 1
    floor: bool = True
    prefix: bool = True
    prefix_prompts: int = 4
    repeats: int = 1
    warmup: bool = True
    context_tokens: int = 1024
    progress: bool = True
    draft_model: str | None = None
    draft_options: dict[str, Any] = field(default_factory=dict)


def run(
    workload: str,
    prompts: list[Prompt],
    configs: list[Config],
    target,
    spec: TargetSpec,
    opts: BenchOptions,
    *,
    skipped: list[dict[str, str]] | None = None,
    draft_lm: torch.nn.Module | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return the report (the JSON contract of ``specd bench``)."""
    skipped = list(skipped or [])
    if any(c.kind == "llamacpp" for c in configs):
        from . import llamacpp

        why = llamacpp.unavailable(target.name)
        if why is not None:
            log.warning("the llama.cpp configurations are skipped: %s", why)
            skipped += [{"config": c.name, "reason": why} for c in configs if c.kind == "llamacpp"]
            configs = [c for c in configs if c.kind != "llamacpp"]
    machine = machine_info(target)
    if any(c.kind == "llamacpp" for c in configs):
        machine["llama_cpp"] = llamacpp.version()
    prefix_prompts = [p for p in prompts if p.text][: opts.prefix_prompts] if opts.prefix else []
    isolated = opts.rss == "isolated"
    total = (
        len(prompts) * len(configs) * opts.repeats
        + len(prefix_prompts) * len(prefix_mod.EDITS)
        + (len(configs) if isolated else 0)
    )
    bar = _progress(total, opts.progress)
    with bar:
        floor = None
        if opts.floor:
            bar.set_description("floor")
            floor = floor_mod.measure(target, opts.context_tokens)

        runner = Runner(
            target,
            draft_lm=draft_lm,
            track_rss=opts.rss == "inprocess",
            llamacpp_ctx=max(len(p.ids) + p.max_tokens for p in prompts),
        )
        failed: dict[str, str] = {}

        def attempt(cfg: Config, prompt: Prompt) -> Run | None:
            """Run ``cfg``; a configuration that raises is dropped from the run (the
            references cannot be: every ratio needs them)."""
            if cfg.name in failed:
                return None
            try:
                return runner.run(cfg, prompt)
            except Exception as exc:
                if cfg.name in REFERENCES:
                    raise
                log.error("configuration %s failed and is left out", cfg.name, exc_info=exc)
                failed[cfg.name] = f"failed: {type(exc).__name__}: {exc}"
                return None

        if opts.warmup:
            bar.set_description("warm-up")
            warm = Prompt("warm-up", prompts[0].ids[-64:], 4)
            for cfg in configs:
                attempt(cfg, warm)

        runs: dict[str, list[Run]] = {c.name: [] for c in configs}
        for i, prompt in enumerate(prompts):
            best: dict[str, Run] = {}
            for rep in range(opts.repeats):
                k = (i * opts.repeats + rep) % len(configs)
                for cfg in configs[k:] + configs[:k]:
                    bar.set_description(cfg.name)
                    run = attempt(cfg, prompt)
                    # The fastest repeat is the one least slowed by other processes; the
                    # tokens are the same in every repeat (greedy).
                    if run is not None and (
                        cfg.name not in best or run.total_s < best[cfg.name].total_s
                    ):
                        best[cfg.name] = run
                    bar.update(1)
            for cfg in configs:
                if cfg.name in best:
                    runs[cfg.name].append(best[cfg.name])
        configs = [c for c in configs if c.name not in failed]
        runs = {c.name: runs[c.name] for c in configs}

        prefix = None
        if prefix_prompts:
            bar.set_description("prefix cache")
            prefix = prefix_mod.measure(target, prefix_prompts, progress=bar)

        rss: dict[str, dict[str, float]] = {}
        if isolated:
            for cfg in configs:
                bar.set_description(f"peak RSS {cfg.name}")
                rss[cfg.name] = probe_rss(spec, cfg, prompts[: opts.rss_prompts], opts)
                bar.update(1)

    machine["load_avg_end"] = _loadavg()
    results = aggregate(configs, runs, rss, load_s=runner.load_times())
    report: dict[str, Any] = {
        "workload": workload,
        "machine": machine,
        "floor": floor,
        "results": results,
        "prompts": [
            {"name": p.name, "prompt_tokens": len(p.ids), "max_tokens": p.max_tokens}
            for p in prompts
        ],
        "prefix_cache": prefix,
        "skipped": skipped + [{"config": n, "reason": r} for n, r in failed.items()],
        "rss_method": opts.rss,
    }
    report["targets"] = check_targets(report)
    return report


def probe_rss(
    spec: TargetSpec, cfg: Config, prompts: list[Prompt], opts: BenchOptions
) -> dict[str, float]:
    """Peak RSS of ``cfg`` in a fresh process (see :mod:`specd.bench.probe`)."""
    payload = job(
        spec,
        cfg.name,
        prompts,
        threads=torch.get_num_threads(),
        draft_model=opts.draft_model,
        draft_options=opts.draft_options,
    )
    env = {**os.environ, **PROBE_ENV}
    proc = subprocess.run(
        [sys.executable, "-m", "specd.bench.probe"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise RuntimeError(
            f"peak-RSS probe for {cfg.name} failed (exit {proc.returncode}): {' | '.join(tail)}"
        )
    return json.loads(lines[-1])


def machine_info(target) -> dict[str, Any]:
    """What the numbers were measured on."""
    import transformers

    info: dict[str, Any] = {
        "cpu": pricing.cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gb": _memory_gb(),
        "cpu_flags": _cpu_flags(),
        "isa": cpu_kernels.isa(),  # the instruction set specd's CPU kernels run, or "none"
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "model": target.name,
        "weights": stored.format_of(target.model),  # how the matrices are stored (--weights)
        "weight_bytes": target.weight_bytes(),
        "kv_dtype": str(target.kv_dtype).removeprefix("torch."),  # what the cache stores
        # whether the step multiplies quantized weights with int8 activations (woven)
        "int8_products": bool(target.compiled is not None and target.compiled.int8_products),
        "load_avg_start": _loadavg(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if str(target.device).startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(target.device)
    return info


def _cpu_flags() -> list[str]:
    """The flags that decide which kernels run: AVX2/AVX-512/bfloat16/AMX."""
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [w for w in wanted if w in have]
    except OSError:
        pass
    return []


def _memory_gb() -> float | None:
    try:
        import psutil

        return round(psutil.virtual_memory().total / 1e9, 1)
    except Exception:  # noqa: BLE001 - informational only
        return None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_description(self, desc: str) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True, mininterval=0.5)
