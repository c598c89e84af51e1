"""The CLI contract: JSON fields, exit codes, messages naming what was wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

STATS_FIELDS = {
    "prompt_tokens",
    "new_tokens",
    "target_steps",
    "drafted",
    "accepted",
    "mean_acceptance_length",
    "position_acceptance",
    "draft_s",
    "verify_s",
    "ttft_s",
    "tpot_s",
    "tokens_per_s",
}


def specd(*args: str) -> subprocess.CompletedProcess:
    """``specd ARGS`` as a user runs it: its own process, exit code and streams (torch on
    one thread, which the tests' busy machine runs several times faster)."""
    return subprocess.run(
        [sys.executable, "-m", "specd.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def specd_here(capsys, *args: str) -> tuple[int, str, str]:
    """``specd ARGS`` run by :func:`specd.cli.main` in this process, for what does not
    depend on the process boundary: exit code, stdout, stderr."""
    from specd.cli import main

    try:
        code = main(list(args))
    except SystemExit as e:  # argparse's own exits: usage errors and --help
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
def test_generate_json_contract():
    r = specd("generate", "def add(a, b):", "--max-tokens", "12", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"text", "token_ids", "stats"}
    assert STATS_FIELDS <= set(out["stats"])
    assert 0 < len(out["token_ids"]) <= 12
    assert out["stats"]["new_tokens"] == len(out["token_ids"])


@pytest.mark.slow
def test_generate_streams_text(tmp_path):
    f = tmp_path / "p.py"
    f.write_text("def square(x):\n")
    r = specd("generate", "--file", str(f), "--max-tokens", "8", "--drafter", "none")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


@pytest.mark.parametrize(
    "args, needle",
    [
        # the names are looked up before the model is loaded: a typo costs no load
        (["generate", "x", "--drafter", "nope"], "unknown drafter 'nope'"),
        (["generate", "x", "--exit-policy", "nope"], "unknown exit policy 'nope'"),
        (["generate", "x", "--verifier", "nope"], "unknown verifier 'nope'"),
        (["generate", "x", "--top-p", "2"], "top_p"),
        (["generate", "x", "--max-tokens", "0"], "max_tokens"),
        (["generate", "x", "--dtype", "int3"], "unknown dtype 'int3'"),
        (["generate", "x", "--device", "tpu"], "unknown device 'tpu'"),
        (["generate", "x", "--model", "/nonexistent/model"], "unknown model"),
        (["generate", "--file", "/nonexistent/file.py"], "cannot read --file"),
        (["generate", "x", "--max-tokens", "many"], "invalid int value"),
        (["generate", "x", "--drafter-option", "novalue"], "KEY=VALUE"),
        (["nosuchcommand"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_naming_the_problem(args, needle, capsys):
    code, out, err = specd_here(capsys, *args)
    assert code == 2, (out, err)
    assert needle in err


@pytest.mark.slow
def test_bad_input_exits_2_from_the_process():
    """Bug guarded: ``main``'s exit code dropped on the way out of the process (``python -m
    specd.cli`` calling ``main()`` without ``sys.exit``), so scripts saw success."""
    r = specd("generate", "x", "--top-p", "2")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "top_p" in r.stderr


@pytest.mark.slow
def test_plugins_json_lists_builtins():
    r = specd("plugins", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"drafters", "verifiers", "exit_policies"}
    names = {kind: {e["name"] for e in entries} for kind, entries in out.items()}
    assert "ngram" in names["drafters"]
    assert "greedy" in names["verifiers"]
    assert {"fixed", "adaptive"} <= names["exit_policies"]
    assert all(e["module"].startswith("specd.") for entries in out.values() for e in entries)


def test_help_for_every_command(capsys):
    code, out, _ = specd_here(capsys, "--help")
    assert code == 0
    for cmd in ["generate", "plugins", "verify", "bench", "serve", "complete", "stats", "train"]:
        assert f"    {cmd} " in out, f"specd --help does not list {cmd}"
        code, out_cmd, _ = specd_here(capsys, cmd, "--help")
        assert code == 0 and "usage" in out_cmd, cmd
    code, out, _ = specd_here(capsys, "train", "eagle", "--help")
    assert code == 0 and "--data" in out


def test_the_tiny_model_is_a_model_name(capsys):
    """``--model tiny:SEED`` loads a tiny random target through the one loader (seed 0
    when none is given), in every command that takes --model."""
    from specd.cli import main
    from specd.forward.models import load_target

    for model in ("tiny", "tiny:0", "tiny:3"):
        assert main(["generate", "abc", "--model", model, "--max-tokens", "4", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["stats"]["new_tokens"] == len(out["token_ids"]) == 4
    weights = [load_target(m).model.lm_head.weight for m in ("tiny", "tiny:0", "tiny:3")]
    assert weights[0].equal(weights[1]) and not weights[0].equal(weights[2])
    assert main(["generate", "abc", "--model", "tiny:x"]) == 2
    assert "tiny:SEED" in capsys.readouterr().err


def test_only_the_daemon_keeps_prepacked_weights_by_default():
    """The long-lived daemon trades the weights' size in memory for faster verify passes
    where that measures faster; one-off commands keep the memory."""
    from specd.cli import build_parser
    from specd.options import build_engine

    parser = build_parser()
    assert parser.parse_args(["serve", "--stdio"]).packed_weights == "auto"
    assert (
        parser.parse_args(["serve", "--stdio", "--packed-weights", "off"]).packed_weights == "off"
    )
    args = parser.parse_args(["generate", "x", "--model", "tiny"])
    assert args.packed_weights is None
    assert not build_engine(args).target.fast._packed


def test_the_commands_that_load_a_model_import_torch_first_as_the_command(monkeypatch):
    """``specd generate`` (and ``serve``, whose parser says so too) as the command imports the
    model library with the collector off (:func:`specd.cli._import_model_library`);
    :func:`specd.cli.main` called with arguments, in a process of its caller's, or another
    command leaves the caller's collector alone."""
    from specd import cli

    parser = cli.build_parser()
    assert parser.parse_args(["serve", "--stdio"]).loads_model
    assert not getattr(parser.parse_args(["plugins"]), "loads_model", False)

    calls: list[object] = []
    monkeypatch.setattr(cli, "_import_model_library", lambda: calls.append("import"))
    monkeypatch.setattr(cli, "_exit_now", lambda code: calls.append(code))
    argv = ["generate", "def f(x):", "--model", "tiny", "--max-tokens", "1"]
    assert cli.main(argv) == 0
    assert calls == []
    monkeypatch.setattr(sys, "argv", ["specd", *argv])
    cli.main()
    assert calls == ["import", 0]
    calls.clear()
    monkeypatch.setattr(sys, "argv", ["specd", "plugins", "--json"])
    cli.main()
    assert calls == []
