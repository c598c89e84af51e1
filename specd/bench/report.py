"""From raw runs to the report: per-configuration figures, the issue's targets, a markdown
table and the plots.

Every ratio divides two figures of the same run: tokens/s of a configuration by tokens/s of
a reference, each the sum of new tokens over the sum of wall time on the same prompts.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from .configs import HF_PLAIN, HF_PROMPT_LOOKUP, SPECD_PLAIN, Config
from .runners import Run

#: The issue's targets (CPU, greedy, editor workload).
TARGET_VS_HF_PLAIN = 3.0
TARGET_VS_HF_PROMPT_LOOKUP = 1.8
TARGET_STEP_VS_FLOOR = 2.0
TARGET_IDENTICAL = 0.99
TARGET_RSS_VS_WEIGHTS = 2.0


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile, ``q`` in [0, 100]; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


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
        "ttft_s": statistics.median(r.ttft_s for r in runs) if runs else None,
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
    out.update(cfg.as_json())
    return out


def aggregate(
    configs: list[Config],
    runs: dict[str, list[Run]],
    rss: dict[str, dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """The ``results`` list of the report, one entry per configuration, in run order."""
    rss = rss or {}
    rows = {c.name: summarize(c, runs[c.name]) for c in configs}
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
    """The contract's fields first, in the issue's order, then the rest."""
    return {
        **{k: row.get(k) for k in _CONTRACT},
        **{k: v for k, v in row.items() if k not in _CONTRACT},
    }


def best_speculative(
    results: list[dict[str, Any]], key: str = "tokens_per_s"
) -> dict[str, Any] | None:
    """The fastest specd configuration that drafts, by ``key``."""
    spec = [
        r
        for r in results
        if r.get("kind") == "specd" and r["drafter"] not in (None, "none") and r.get(key)
    ]
    return max(spec, key=lambda r: r[key], default=None)


def check_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets against this run: value, target and whether it is met."""
    results = report["results"]
    by_name = {r["config"]: r for r in results}
    out: list[dict[str, Any]] = []

    def add(
        name: str, value: float | None, target: float, higher_is_better: bool, note: str = ""
    ) -> None:
        met = None if value is None else (value >= target if higher_is_better else value <= target)
        out.append(
            {
                "target": name,
                "value": value,
                "goal": target,
                "higher_is_better": higher_is_better,
                "met": met,
                "note": note,
            }
        )

    best = best_speculative(results)
    if best is not None:
        add(
            "best specd vs HF plain (x)",
            best["speedup_vs_hf_plain"],
            TARGET_VS_HF_PLAIN,
            True,
            best["config"],
        )
        add(
            "best specd vs HF prompt lookup (x)",
            best["speedup_vs_hf_prompt_lookup"],
            TARGET_VS_HF_PROMPT_LOOKUP,
            True,
            best["config"],
        )
        add(
            "best specd vs HF plain, decode only (x)",
            best.get("decode_speedup_vs_hf_plain"),
            TARGET_VS_HF_PLAIN,
            True,
            f"{best['config']}; informational: the prefill excluded",
        )
    best_cpu = best_speculative(results, key="cpu_tokens_per_s")
    if best_cpu is not None and best_cpu.get("cpu_speedup_vs_hf_plain"):
        note = f"{best_cpu['config']}; informational: CPU time, steady on a shared machine"
        add(
            "best specd vs HF plain, CPU time (x)",
            best_cpu["cpu_speedup_vs_hf_plain"],
            TARGET_VS_HF_PLAIN,
            True,
            note,
        )
        add(
            "best specd vs HF prompt lookup, CPU time (x)",
            best_cpu["cpu_speedup_vs_hf_prompt_lookup"],
            TARGET_VS_HF_PROMPT_LOOKUP,
            True,
            note,
        )
    floor = report.get("floor")
    plain = by_name.get(SPECD_PLAIN)
    if floor and floor.get("floor_s"):
        if plain and plain.get("tpot_p50_s"):
            add(
                "specd plain step / memory floor",
                plain["tpot_p50_s"] / floor["floor_s"],
                TARGET_STEP_VS_FLOOR,
                False,
                "engine step: specd-plain TPOT p50",
            )
        add(
            "target forward step / memory floor",
            floor["step_s"] / floor["floor_s"],
            TARGET_STEP_VS_FLOOR,
            False,
            f"bare Target.forward at {floor.get('context')} tokens",
        )
        if floor.get("step_min_s"):
            add(
                "fastest target forward step / memory floor",
                floor["step_min_s"] / floor["floor_s"],
                TARGET_STEP_VS_FLOOR,
                False,
                "best of the repeats, like the bandwidth",
            )
    dtype = report["machine"].get("dtype", "")
    for key, label in (
        ("identical_rate", "token-identical rate vs HF greedy (worst specd config)"),
        (
            "identical_rate_vs_specd_plain",
            "token-identical rate vs specd plain greedy (worst drafting config)",
        ),
    ):
        rates = [
            r[key]
            for r in results
            if r.get("kind") == "specd" and r.get(key) is not None and r["drafter"] != "none"
        ]
        if rates:
            add(label, min(rates), TARGET_IDENTICAL, True, dtype)
    weights_mb = report["machine"].get("weight_bytes", 0) / 2**20
    spec_rss = [
        r["peak_rss_mb"] for r in results if r.get("kind") == "specd" and r.get("peak_rss_mb")
    ]
    if spec_rss and weights_mb:
        add(
            "peak RSS / weights (worst specd config)",
            max(spec_rss) / weights_mb,
            TARGET_RSS_VS_WEIGHTS,
            False,
            f"weights {weights_mb:.0f} MiB; {report.get('rss_method')}",
        )
    return out


# -- markdown -----------------------------------------------------------------------------------


def _f(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "–" if x is None else format(x * scale, fmt)


def markdown(report: dict[str, Any]) -> str:
    """The report as markdown: a table per configuration, the floor, prefix reuse, targets."""
    m = report["machine"]
    lines = [
        f"**Workload** `{report['workload']}`, {len(report.get('prompts', []))} prompts · "
        f"**model** {m.get('model')} ({m.get('dtype')}, {m.get('device')}) · "
        f"**machine** {m.get('cpu')}, {m.get('cpu_count')} CPUs, {m.get('torch_threads')} torch threads, "
        f"load average {m.get('load_avg_start')} → {m.get('load_avg_end')}",
        "",
        "| config | drafter | tok/s | × HF plain | × HF prompt lookup | × specd plain | accept len "
        "| TTFT ms | TPOT p50 ms | TPOT p95 ms | peak RSS MB | identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['config']} | {r['drafter'] or '–'} | {_f(r['tokens_per_s'], '.1f')} "
            f"| {_f(r['speedup_vs_hf_plain'], '.2f')} | {_f(r['speedup_vs_hf_prompt_lookup'], '.2f')} "
            f"| {_f(r['speedup_vs_specd_plain'], '.2f')} | {_f(r['mean_acceptance_length'], '.2f')} "
            f"| {_f(r['ttft_s'], '.0f', 1e3)} | {_f(r['tpot_p50_s'], '.1f', 1e3)} | {_f(r['tpot_p95_s'], '.1f', 1e3)} "
            f"| {_f(r['peak_rss_mb'], '.0f')} | {_f(r['identical_rate'], '.0%')} |"
        )
    if any(r.get("cpu_tokens_per_s") for r in report["results"]):
        lines += [
            "",
            "CPU time of this process (steadier than wall time when other processes share the cores):",
            "",
            "| config | CPU tok/s | × HF plain | × HF prompt lookup | × specd plain |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in report["results"]:
            lines.append(
                f"| {r['config']} | {_f(r.get('cpu_tokens_per_s'), '.1f')} "
                f"| {_f(r.get('cpu_speedup_vs_hf_plain'), '.2f')} "
                f"| {_f(r.get('cpu_speedup_vs_hf_prompt_lookup'), '.2f')} "
                f"| {_f(r.get('cpu_speedup_vs_specd_plain'), '.2f')} |"
            )
    fl = report.get("floor")
    if fl:
        lines += [
            "",
            f"**Floor**: copy bandwidth {fl['copy_gb_s']:.1f} GB/s; weights {fl['weight_bytes'] / 2**20:.0f} MiB "
            f"→ floor {fl['floor_s'] * 1e3:.1f} ms; target one-token step at {fl['context']} tokens "
            f"{fl['step_s'] * 1e3:.1f} ms = {fl['ratio']:.2f}× the floor.",
        ]
    pc = report.get("prefix_cache")
    if pc:
        lines += ["", "**Prefix cache** (TTFT after a one-character edit, specd plain):", ""]
        lines += [
            "| edit | prompt tokens | reused | cold TTFT ms | warm TTFT ms | warm / cold |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for where in ("cursor", "middle"):
            e = pc.get(where)
            if e:
                lines.append(
                    f"| {where} | {e['prompt_tokens']} | {e['reused_tokens']} | {e['cold_ttft_s'] * 1e3:.0f} "
                    f"| {e['warm_ttft_s'] * 1e3:.0f} | {_f(e['ratio'], '.2f')} |"
                )
    if report.get("targets"):
        lines += ["", "**Targets**:", "", "| target | value | goal | met |", "|---|---:|---:|---|"]
        for t in report["targets"]:
            op = "≥" if t["higher_is_better"] else "≤"
            met = "–" if t["met"] is None else ("yes" if t["met"] else "no")
            note = f" ({t['note']})" if t["note"] else ""
            lines.append(
                f"| {t['target']}{note} | {_f(t['value'], '.3f')} | {op} {t['goal']} | {met} |"
            )
    if report.get("skipped"):
        lines += [
            "",
            "Skipped: " + "; ".join(f"{s['config']} ({s['reason']})" for s in report["skipped"]),
        ]
    return "\n".join(lines) + "\n"


# -- plots --------------------------------------------------------------------------------------


def plot(report: dict[str, Any], path: str) -> None:
    """Two panels: speedup over HF plain per configuration, and tokens per target step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.1, 1]})
    names = [r["config"] for r in results]
    speed = [r["speedup_vs_hf_plain"] or 0.0 for r in results]
    colors = [
        "#999999" if r.get("kind") == "hf" else ("#4c72b0" if r["drafter"] == "none" else "#dd8452")
        for r in results
    ]
    y = range(len(names))
    ax1.barh(list(y), speed, color=colors)
    ax1.set_yticks(list(y), names, fontsize=8)
    ax1.invert_yaxis()
    ax1.axvline(1.0, color="black", lw=0.8)
    ax1.axvline(
        TARGET_VS_HF_PLAIN, color="#c44e52", lw=0.8, ls="--", label=f"target {TARGET_VS_HF_PLAIN}×"
    )
    for i, s in enumerate(speed):
        ax1.text(s, i, f" {s:.2f}×", va="center", fontsize=7)
    ax1.set_xlabel("tokens/s ÷ HF generate (greedy), same run")
    ax1.set_title(f"speedup, {report['workload']} workload", fontsize=10)
    ax1.legend(fontsize=7, loc="lower right")

    drafting = [
        r
        for r in results
        if r["tokens_per_step"]
        and (r["drafter"] not in (None, "none") or r.get("prompt_lookup_num_tokens"))
    ]
    max_k = max((int(k) for r in drafting for k in r["tokens_per_step"]), default=1)
    width = 0.8 / max(len(drafting), 1)
    for j, r in enumerate(drafting):
        total = sum(r["tokens_per_step"].values())
        xs = [k + (j - (len(drafting) - 1) / 2) * width for k in range(1, max_k + 1)]
        ys = [r["tokens_per_step"].get(str(k), 0) / total for k in range(1, max_k + 1)]
        ax2.bar(xs, ys, width=width, label=r["config"])
    ax2.set_xticks(range(1, max_k + 1))
    ax2.set_xlabel("tokens per target step (accepted drafts + 1)")
    ax2.set_ylabel("fraction of steps")
    ax2.set_title("acceptance histogram", fontsize=10)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
