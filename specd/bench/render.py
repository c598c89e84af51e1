"""The report drawn for people: a markdown table per configuration and the plots."""

from __future__ import annotations

from typing import Any

from .targets import TARGET_VS_HF_PLAIN


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
    lines += _llamacpp_lines(report["results"])
    fl = report.get("floor")
    if fl:
        lines += [
            "",
            f"**Floor**: read bandwidth {fl.get('read_gb_s', fl['copy_gb_s']):.1f} GB/s (copy "
            f"{fl['copy_gb_s']:.1f}); a step reads {fl['weight_bytes'] / 2**20:.0f} MiB of weights "
            f"as stored ({report['machine'].get('weights', '?')}) and "
            f"{fl.get('kv_bytes', 0) / 2**20:.0f} MiB of cached keys and values "
            f"({report['machine'].get('kv_dtype', 'float32')}) "
            f"→ floor {fl['floor_s'] * 1e3:.1f} ms; target one-token step at {fl['context']} tokens "
            f"{fl['step_s'] * 1e3:.1f} ms = {fl['ratio']:.2f}× the floor.",
        ]
        if fl.get("ratio_lo") is not None:
            lines[-1] += (
                f" Median of {len(fl['trials'])} trials (bandwidth, then steps), spread "
                f"{fl['ratio_lo']:.2f}–{fl['ratio_hi']:.2f}×; step "
                f"{'compiled' if fl.get('compiled') else 'eager'}"
                + (f", {fl['backend']}" if fl.get("backend") else "")
                + (f" (ready in {fl['compile_s']:.1f} s)." if fl.get("compile_s") else ".")
            )
        if fl.get("compiled_speedup"):
            lines[-1] += (
                f" Eager step {fl['eager_step_s'] * 1e3:.1f} ms: the compiled step is "
                f"{fl['compiled_speedup']:.2f}× faster."
            )
        if fl.get("pass_ratio"):
            lines[-1] += (
                " Verify passes of "
                + ", ".join(f"{n} tokens {r:.2f}×" for n, r in fl["pass_ratio"].items())
                + " the one-token step."
            )
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
            goal = "–" if t["goal"] is None else f"{op} {t['goal']}"
            met = "–" if t["met"] is None else ("yes" if t["met"] else "no")
            note = f" ({t['note']})" if t["note"] else ""
            lines.append(f"| {t['target']}{note} | {_f(t['value'], '.3f')} | {goal} | {met} |")
    if report.get("skipped"):
        lines += [
            "",
            "Skipped: " + "; ".join(f"{s['config']} ({s['reason']})" for s in report["skipped"]),
        ]
    return "\n".join(lines) + "\n"


def _llamacpp_lines(results: list[dict[str, Any]]) -> list[str]:
    """The ratios to llama.cpp's configurations, where they ran."""
    llama = [r for r in results if r.get("kind") == "llamacpp"]
    if not llama:
        return []
    best = llama[0].get("best_llamacpp_speculation")
    lines = [
        "",
        "llama.cpp (`llama-cpp-python`, the same GGUF file, prompts and threads; identical and "
        "common prefix: its tokens against specd plain's, information rather than a check, "
        "the arithmetic differs):",
        "",
        f"| config | tok/s | × llama.cpp plain | × {best or 'best llama.cpp speculation'} "
        "| accept len | TTFT ms | TPOT p50 ms | load s | identical | common prefix |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.get("kind") == "hf":
            continue  # the Hugging Face baselines have their own columns above
        lines.append(
            f"| {r['config']} | {_f(r['tokens_per_s'], '.1f')} "
            f"| {_f(r.get('speedup_vs_llamacpp_plain'), '.2f')} "
            f"| {_f(r.get('speedup_vs_best_llamacpp_speculation'), '.2f')} "
            f"| {_f(r['mean_acceptance_length'], '.2f')} | {_f(r['ttft_s'], '.0f', 1e3)} "
            f"| {_f(r['tpot_p50_s'], '.1f', 1e3)} | {_f(r.get('load_s'), '.2f')} "
            f"| {_f(r.get('identical_rate_vs_specd_plain'), '.0%')} "
            f"| {_f(r.get('common_prefix_vs_specd_plain'), '.0%')} |"
        )
    return lines


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
        "#999999"
        if r.get("kind") == "hf"
        else "#55a868"
        if r.get("kind") == "llamacpp"
        else ("#4c72b0" if r["drafter"] == "none" else "#dd8452")
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
