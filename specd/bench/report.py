"""From raw runs to the report's ``results``: per-configuration figures and the ratios
between configurations.

Every ratio divides two figures of the same run: tokens/s of a configuration by tokens/s of
a reference, each the sum of new tokens over the sum of wall time on the same prompts.
:mod:`~specd.bench.targets` checks the results against the targets and
:mod:`~specd.bench.render` draws them as markdown and plots.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..stats import percentile
from .configs import HF_PLAIN, HF_PROMPT_LOOKUP, LLAMACPP_PLAIN, SPECD_PLAIN, Config
from .runners import Run


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def identical_rate(runs: list[Run], reference: list[Run]) -> float | None:
    """Fraction of prompts whose tokens equal the reference's exactly."""
    if not runs or len(runs) != len(reference):
        return None
    return sum(r.token_ids == ref.token_ids for r, ref in zip(runs, reference)) / len(runs)


def tokens_per_step(runs: list[Run]) -> dict[str, int]:
    """Histogram: how many target steps produced 1, 2, ... tokens (one event per step)."""
    hist: Counter[int] = Counter()
    for r in runs:
        hist.update(n for _, n in r.events if n > 0)
    return {str(k): hist[k] for k in sorted(hist)}


def _decode_rate(runs: list[Run]) -> float | None:
    """Tokens after the first per second after the first token."""
    new = sum(max(r.new_tokens - 1, 0) for r in runs)
    secs = sum(r.total_s - r.ttft_s for r in runs)
    return new / secs if secs > 0 else None


def summarize(cfg: Config, runs: list[Run]) -> dict[str, Any]:
    """A configuration's figures that need no other configuration."""
    new = sum(r.new_tokens for r in runs)
    secs = sum(r.total_s for r in runs)
    steps = sum(r.steps for r in runs)
    gaps = [g for r in runs for g in r.token_gaps()]
    out: dict[str, Any] = {
        "config": cfg.name,
        "drafter": cfg.drafter,
        "tokens_per_s": new / secs if secs > 0 else 0.0,
        "cpu_tokens_per_s": new / cpu if (cpu := sum(r.cpu_s for r in runs)) > 0 else None,
        # Without the prompt's prefill, which speculation cannot speed up.
        "decode_tokens_per_s": _decode_rate(runs),
        "mean_acceptance_length": new / steps if steps else None,
        "ttft_s": percentile([r.ttft_s for r in runs], 50),
        "tpot_p50_s": percentile(gaps, 50),
        "tpot_p95_s": percentile(gaps, 95),
        "prompts": len(runs),
        "new_tokens": new,
        "total_s": secs,
        "target_steps": steps,
        "tokens_per_step": tokens_per_step(runs),
        # In prompt order, for reading the noise: one entry per prompt.
        "per_prompt": [
            {
                "new_tokens": r.new_tokens,
                "total_s": r.total_s,
                "ttft_s": r.ttft_s,
                "cpu_s": r.cpu_s,
                "steps": r.steps,
            }
            for r in runs
        ],
    }
    if cfg.kind == "specd":
        drafted = [0] * max((len(r.position_drafted) for r in runs), default=0)
        accepted = [0] * len(drafted)
        for r in runs:
            for i, (d, a) in enumerate(zip(r.position_drafted, r.position_accepted)):
                drafted[i] += d
                accepted[i] += a
        d_all = sum(r.drafted for r in runs)
        out["position_acceptance"] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
        out["drafted"] = d_all
        out["accepted"] = sum(r.accepted for r in runs)
        out["acceptance_rate"] = out["accepted"] / d_all if d_all else None
        falls = sorted({r.fallback for r in runs if r.fallback})
        out["fallbacks"] = falls
    else:
        out["position_acceptance"] = None  # generate does not expose it
    if cfg.kind == "llamacpp" and cfg.prompt_lookup_tokens:
        out["drafted"] = sum(r.drafted for r in runs)
        out["accepted"] = sum(r.accepted for r in runs)
        out["acceptance_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else None
    out.update(cfg.as_json())
    return out


def common_prefix_rate(runs: list[Run], reference: list[Run]) -> float | None:
    """Share of the reference's tokens each run repeats before it first differs, pooled
    over the prompts: how far two kinds of arithmetic agree, where identity is too coarse."""
    if not runs or len(runs) != len(reference):
        return None
    same = total = 0
    for r, ref in zip(runs, reference):
        n = 0
        while n < min(len(r.token_ids), len(ref.token_ids)) and r.token_ids[n] == ref.token_ids[n]:
            n += 1
        same, total = same + n, total + len(ref.token_ids)
    return same / total if total else None


def best_llamacpp_speculation(rows: dict[str, dict[str, Any]]) -> str | None:
    """The llama.cpp speculation configuration with the most tokens/s in this run."""
    spec = [r for r in rows.values() if r["kind"] == "llamacpp" and r["config"] != LLAMACPP_PLAIN]
    return max(spec, key=lambda r: r["tokens_per_s"])["config"] if spec else None


def aggregate(
    configs: list[Config],
    runs: dict[str, list[Run]],
    rss: dict[str, dict[str, float]] | None = None,
    *,
    load_s: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """The ``results`` list of the report, one entry per configuration, in run order.

    :param load_s: seconds a configuration took to load, for those loaded apart from the
        target (llama.cpp's); reported, never counted in a rate.
    """
    rss = rss or {}
    rows = {c.name: summarize(c, runs[c.name]) for c in configs}
    best_spec = best_llamacpp_speculation(rows)
    ref_tps = {
        n: rows[n]["tokens_per_s"] if n in rows else None
        for n in (HF_PLAIN, HF_PROMPT_LOOKUP, SPECD_PLAIN)
    }
    out = []
    for c in configs:
        row = rows[c.name]
        tps = row["tokens_per_s"]
        row["speedup_vs_hf_plain"] = _ratio(tps, ref_tps[HF_PLAIN])
        row["speedup_vs_hf_prompt_lookup"] = _ratio(tps, ref_tps[HF_PROMPT_LOOKUP])
        row["speedup_vs_specd_plain"] = _ratio(tps, ref_tps[SPECD_PLAIN])
        for ref, key in (
            (HF_PLAIN, "cpu_speedup_vs_hf_plain"),
            (HF_PROMPT_LOOKUP, "cpu_speedup_vs_hf_prompt_lookup"),
            (SPECD_PLAIN, "cpu_speedup_vs_specd_plain"),
        ):
            row[key] = _ratio(
                row["cpu_tokens_per_s"], rows[ref]["cpu_tokens_per_s"] if ref in rows else None
            )
        row["speedup_vs_llamacpp_plain"] = _ratio(
            tps, rows[LLAMACPP_PLAIN]["tokens_per_s"] if LLAMACPP_PLAIN in rows else None
        )
        row["best_llamacpp_speculation"] = best_spec
        row["speedup_vs_best_llamacpp_speculation"] = _ratio(
            tps, rows[best_spec]["tokens_per_s"] if best_spec else None
        )
        if c.kind == "llamacpp":
            row["load_s"] = (load_s or {}).get(c.name)
            row["common_prefix_vs_specd_plain"] = (
                common_prefix_rate(runs[c.name], runs[SPECD_PLAIN]) if SPECD_PLAIN in runs else None
            )
        row["decode_speedup_vs_hf_plain"] = _ratio(
            row["decode_tokens_per_s"],
            rows[HF_PLAIN]["decode_tokens_per_s"] if HF_PLAIN in rows else None,
        )
        row["identical_rate"] = (
            identical_rate(runs[c.name], runs[HF_PLAIN]) if HF_PLAIN in runs else None
        )
        row["identical_rate_vs_specd_plain"] = (
            identical_rate(runs[c.name], runs[SPECD_PLAIN]) if SPECD_PLAIN in runs else None
        )
        probe = rss.get(c.name)
        inproc = [r.peak_rss_kb for r in runs[c.name] if r.peak_rss_kb is not None]
        if probe is not None:
            row["peak_rss_mb"] = probe["peak_rss_mb"]
            row["base_rss_mb"] = probe.get("base_rss_mb")
            row["loaded_rss_mb"] = probe.get("loaded_rss_mb")
        elif inproc:
            row["peak_rss_mb"] = max(inproc) / 1024
        else:
            row["peak_rss_mb"] = None
        gpu = [r.peak_gpu_bytes for r in runs[c.name] if r.peak_gpu_bytes is not None]
        if gpu:
            row["peak_gpu_mb"] = max(gpu) / 2**20
        out.append(_ordered(row))
    return out


_CONTRACT = (
    "config",
    "drafter",
    "tokens_per_s",
    "speedup_vs_hf_plain",
    "speedup_vs_hf_prompt_lookup",
    "speedup_vs_specd_plain",
    "mean_acceptance_length",
    "position_acceptance",
    "ttft_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "peak_rss_mb",
    "identical_rate",
)


def _ordered(row: dict[str, Any]) -> dict[str, Any]:
    """The contract's fields first, in the contract's order, then the rest."""
    return {
        **{k: row.get(k) for k in _CONTRACT},
        **{k: v for k, v in row.items() if k not in _CONTRACT},
    }
