"""The report's JSON contract, its ratios and its identical rate, on a tiny random model."""

from __future__ import annotations

import json

import pytest

from specd.bench import report as report_mod
from specd.bench.runners import Run

CONTRACT = (
    "config",
    "drafter",
    "tokens_per_s",
    "speedup_vs_hf_plain",
    "speedup_vs_hf_prompt_lookup",
    "speedup_vs_specd_plain",
    "mean_acceptance_length",
    "ttft_s",
    "tpot_p50_s",
    "tpot_p95_s",
    "peak_rss_mb",
    "identical_rate",
)


def test_top_level_contract(report):
    assert {"workload", "machine", "floor", "results"} <= set(report)
    assert report["workload"] == "humaneval"
    assert {"step_s", "floor_s", "copy_gb_s"} <= set(report["floor"])
    assert (
        report["floor"]["step_s"] > 0
        and report["floor"]["floor_s"] > 0
        and report["floor"]["copy_gb_s"] > 0
    )
    assert report["machine"]["weight_bytes"] > 0
    json.loads(json.dumps(report))  # serialisable as it is


def test_every_result_has_the_contract_fields(report):
    names = [r["config"] for r in report["results"]]
    assert names == [
        "hf-plain",
        "hf-prompt-lookup",
        "specd-plain",
        "specd-ngram-fixed-k4",
        "specd-ngram-adaptive-k8",
        "specd-early_exit-fixed-k4",
    ]
    for r in report["results"]:
        assert list(r)[: len(report_mod._CONTRACT)] == list(report_mod._CONTRACT)  # contract first
        for key in CONTRACT:
            assert key in r, (r["config"], key)
        assert r["tokens_per_s"] > 0
        assert r["ttft_s"] > 0
        assert r["tpot_p50_s"] <= r["tpot_p95_s"]
        assert r["peak_rss_mb"] > 0


def test_drafter_is_the_generate_flag(report):
    by = {r["config"]: r for r in report["results"]}
    assert by["hf-plain"]["drafter"] is None
    assert by["hf-prompt-lookup"]["drafter"] is None
    assert by["specd-plain"]["drafter"] == "none"
    assert by["specd-ngram-fixed-k4"]["drafter"] == "ngram"
    assert (
        by["specd-ngram-fixed-k4"]["generate_args"]
        == "--drafter ngram --exit-policy fixed --max-draft 4"
    )


def test_ratios_come_from_the_same_run(report):
    by = {r["config"]: r for r in report["results"]}
    for ref, key in (
        ("hf-plain", "speedup_vs_hf_plain"),
        ("hf-prompt-lookup", "speedup_vs_hf_prompt_lookup"),
        ("specd-plain", "speedup_vs_specd_plain"),
    ):
        assert by[ref][key] == pytest.approx(1.0)
        for r in report["results"]:
            assert r[key] == pytest.approx(r["tokens_per_s"] / by[ref]["tokens_per_s"])
    for r in report["results"]:
        assert r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["total_s"])


def test_greedy_is_token_identical_in_float64(report):
    for r in report["results"]:
        assert r["identical_rate"] == 1.0, r["config"]
        assert r["identical_rate_vs_specd_plain"] == 1.0, r["config"]


def test_acceptance_fields(report):
    by = {r["config"]: r for r in report["results"]}
    assert by["specd-plain"]["mean_acceptance_length"] == pytest.approx(1.0)
    assert by["hf-plain"]["mean_acceptance_length"] == pytest.approx(1.0)
    for name in ("specd-ngram-fixed-k4", "specd-ngram-adaptive-k8", "specd-early_exit-fixed-k4"):
        r = by[name]
        assert r["mean_acceptance_length"] >= 1.0
        assert all(0.0 <= a <= 1.0 for a in r["position_acceptance"])
        assert len(r["position_acceptance"]) <= r["max_draft"]
        hist = r["tokens_per_step"]
        assert sum(int(k) * n for k, n in hist.items()) == r["new_tokens"]
        assert sum(hist.values()) == r["target_steps"]


def test_prefix_cache_section(report):
    pc = report["prefix_cache"]
    for where in ("cursor", "middle"):
        e = pc[where]
        assert e["cold_ttft_s"] > 0 and e["warm_ttft_s"] > 0
        assert e["ratio"] == pytest.approx(e["warm_ttft_s"] / e["cold_ttft_s"])
    assert pc["cursor"]["reused_tokens"] >= pc["cursor"]["prompt_tokens"] - 2
    assert pc["middle"]["reused_tokens"] < pc["cursor"]["reused_tokens"]


def test_targets_are_checked(report):
    names = [t["target"] for t in report["targets"]]
    assert any("HF plain" in n for n in names)
    assert any("floor" in n for n in names)
    assert any("identical" in n for n in names)
    for t in report["targets"]:
        assert t["met"] in (True, False, None)


def test_markdown_has_a_row_per_config(report):
    md = report_mod.markdown(report)
    for r in report["results"]:
        assert f"| {r['config']} |" in md
    assert "Floor" in md and "Prefix cache" in md


def test_plot_writes_a_png(report, tmp_path):
    out = tmp_path / "bench.png"
    report_mod.plot(report, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _run(tokens, events):
    return Run(
        token_ids=tokens,
        total_s=sum(g for g, _ in events),
        ttft_s=events[0][0],
        events=events,
        steps=len(events),
    )


def test_identical_rate_counts_prompts():
    ref = [_run([1, 2, 3], [(1.0, 3)]), _run([4, 5], [(1.0, 2)])]
    same = [_run([1, 2, 3], [(0.5, 3)]), _run([4, 5], [(0.5, 2)])]
    one_off = [_run([1, 2, 3], [(0.5, 3)]), _run([4, 6], [(0.5, 2)])]
    assert report_mod.identical_rate(same, ref) == 1.0
    assert report_mod.identical_rate(one_off, ref) == 0.5
    assert report_mod.identical_rate(one_off[:1], ref) is None


def test_token_gaps_and_histogram():
    r = _run([1, 2, 3, 4, 5, 6], [(0.5, 1), (0.2, 1), (0.3, 3), (0.1, 1)])
    assert r.token_gaps() == pytest.approx([0.2, 0.1, 0.1, 0.1, 0.1])
    assert report_mod.tokens_per_step([r]) == {"1": 3, "3": 1}


def test_percentile():
    assert report_mod.percentile([], 50) is None
    assert report_mod.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert report_mod.percentile([0.0, 10.0], 95) == pytest.approx(9.5)
