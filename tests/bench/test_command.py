"""The command line: bad input is refused before any model loads; isolated peak RSS."""

from __future__ import annotations

import pytest

from specd.bench import configs, harness
from specd.cli import main


def test_unknown_config_is_exit_2(capsys):
    assert main(["bench", "--workload", "random", "--configs", "specd-nosuch-fixed-k4"]) == 2
    assert "nosuch" in capsys.readouterr().err


def test_draft_model_config_without_draft_model_is_exit_2(capsys):
    assert main(["bench", "--workload", "random", "--configs", "hf-assisted"]) == 2
    assert "--draft-model" in capsys.readouterr().err


def test_unwritable_output_is_exit_2(tmp_path, capsys):
    out = tmp_path / "missing" / "r.json"
    assert main(["bench", "--workload", "random", "--json", str(out)]) == 2
    assert "directory does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_isolated_peak_rss_runs_in_a_fresh_process(tiny_spec, prompts):
    cfg = configs.parse("specd-ngram-fixed-k4")
    got = harness.probe_rss(tiny_spec, cfg, prompts[:1], harness.BenchOptions())
    assert 0 < got["base_rss_mb"] <= got["loaded_rss_mb"] <= got["peak_rss_mb"]


def test_bad_numbers_are_exit_2(capsys):
    assert main(["bench", "--workload", "random", "--repeats", "0"]) == 2
    assert main(["bench", "--workload", "random", "--limit", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err
    for flag in ("--rss-prompts", "--prefix-prompts"):  # -1 read as all prompts but the last
        assert main(["bench", "--workload", "random", flag, "-1"]) == 2
        assert f"{flag} must be >= 1, got -1" in capsys.readouterr().err
    for workload in ("random", "session"):  # thousands of torch threads were started
        assert main(["bench", "--workload", workload, "--threads", "100000"]) == 2
        assert "--threads must be from 1 to" in capsys.readouterr().err


@pytest.mark.slow
def test_repeats_keep_the_fastest_run(tiny, prompts):
    cfgs, _ = configs.resolve(["specd-ngram-fixed-k4"])
    opts = harness.BenchOptions(
        rss="off", floor=False, prefix=False, warmup=False, progress=False, repeats=2
    )
    rep = harness.run("humaneval", prompts[:2], cfgs, tiny, None, opts)
    for r in rep["results"]:
        assert r["prompts"] == 2
        assert r["identical_rate"] == 1.0
    assert rep["floor"] is None and rep["prefix_cache"] is None


def test_command_line_records_what_differs_from_the_defaults():
    from specd.bench.command import command_line
    from specd.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--workload", "editor", "--limit", "6", "--threads", "1", "--json", "x.json"]
    )
    assert command_line(args) == "specd bench --workload editor --limit 6 --threads 1"


def test_a_failing_configuration_is_left_out_with_its_reason(tiny, prompts):
    cfgs, _ = configs.resolve(["specd-ngram-fixed-k4+no_such_option=1", "specd-ngram-fixed-k4"])
    opts = harness.BenchOptions(rss="off", floor=False, prefix=False, progress=False)
    rep = harness.run("humaneval", prompts[:1], cfgs, tiny, None, opts)
    names = [r["config"] for r in rep["results"]]
    assert "specd-ngram-fixed-k4" in names
    assert "specd-ngram-fixed-k4+no_such_option=1" not in names
    (skip,) = [s for s in rep["skipped"] if s["config"].endswith("no_such_option=1")]
    assert "no_such_option" in skip["reason"]


def test_the_bench_prices_passes_as_the_engine_does(tiny_spec):
    """Guards against a bench whose exit policy goes unpriced: the adaptive policy then
    drafts its whole budget whatever a wide pass costs on this host, and the bench times
    drafts that `specd generate` and the daemon never make."""
    target = tiny_spec.load()
    assert target.pass_costs is not None and target.pass_costs(1) == 1.0
