"""The command line: bad input is refused before any model loads; isolated peak RSS."""

from __future__ import annotations

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


def test_isolated_peak_rss_runs_in_a_fresh_process(tiny_spec, prompts):
    cfg = configs.parse("specd-ngram-fixed-k4")
    got = harness.probe_rss(tiny_spec, cfg, prompts[:1], harness.BenchOptions())
    assert 0 < got["base_rss_mb"] <= got["loaded_rss_mb"] <= got["peak_rss_mb"]
