"""The session workload: typing scripts, their replay over LSP, and the scores."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from specd.lsp.config import AUTO_PREFIX_SIZES

from specd.bench import session, session_report, session_run
from specd.bench.session import Ask
from specd.bench.session_run import score, suggestion
from specd.cli import build_parser, main

ORACLE = [sys.executable, str(Path(__file__).with_name("session_oracle.py"))]
# The oracle answers alike whatever a configuration's options: two configurations, one
# daemon each, show each daemon replayed and scored on its own.
TWO_CONFIGS = ("--configs", "default,ngram")


def _source(tmp_path: Path, n_files: int = 2) -> Path:
    """Python files of 80 lines with indented blocks, calls and keywords."""
    root = tmp_path / "src"
    root.mkdir()
    for k in range(n_files):
        body = []
        for i in range(20):
            body += [
                f"def f{k}_{i}(a, b=({i}, 2)):\n",
                f"    if a.x_{i} >= b[0]:\n",
                f"        return g(a, key=b.y)  # {i}\n",
                f"    return [a, b, {i}]\n",
            ]
        (root / f"m{k}.py").write_text("".join(body))
    return root


def _type(script: session.Script) -> str:
    """The document after the script's changes, applied at a cursor that moves as typed."""
    lines = script.text.splitlines(keepends=True)
    head, tail = "".join(lines[: script.line]), "".join(lines[script.line :])
    return head + "".join(step.text for step in script.steps) + tail


def test_typing_a_script_restores_the_file(tmp_path):
    """Guards against a script that drops or repeats characters (the indentation step, the
    step that carries a pause, the newline): the typed document must be the file again."""
    files = session.expand_files([str(_source(tmp_path))])
    for script in session.build(files, limit=2, seed=3, block_lines=5):
        assert _type(script) == script.path.read_text()
        asks = [s.ask for s in script.steps if s.ask is not None]
        assert {a.kind for a in asks} == {"line", "pause"}


def test_a_request_knows_the_rest_of_its_real_line(tmp_path):
    """Guards against scoring against the wrong text: every ask's ``line_rest`` is what the
    file has from the cursor to the end of that line, and ``rest`` starts with it."""
    files = session.expand_files([str(_source(tmp_path))])
    (script,) = session.build(files, limit=1, seed=1, block_lines=6)
    real = script.path.read_text()
    typed = "".join(script.text.splitlines(keepends=True)[: script.line])
    for step in script.steps:
        typed += step.text
        if step.ask is not None:
            rest = real[len(typed) :]
            assert real.startswith(typed)
            assert step.ask.line_rest == rest.split("\n", 1)[0]
            assert rest.startswith(step.ask.rest)


def test_an_item_replacing_text_before_the_cursor_is_scored_after_the_cursor():
    """Guards against ignoring an item's range: an item that rewrites ``    ret`` as
    ``    return x`` suggests ``urn x``; one that changes the typed text suggests nothing."""
    rng = {"start": {"line": 3, "character": 4}, "end": {"line": 3, "character": 7}}
    item = {"items": [{"insertText": "return x", "range": rng}]}
    assert suggestion(item, "    ret", 7) == "urn x"
    other = {"items": [{"insertText": "yield x", "range": rng}]}
    assert suggestion(other, "    ret", 7) == ""
    assert suggestion({"items": []}, "", 0) == "" and suggestion(None, "", 0) == ""


def test_scores_compare_the_first_line_and_count_what_the_user_types():
    ask = Ask("line", "return a + b", "return a + b\n    x = 1\n")
    exact = score("line", 0.1, "return a + b\n    y = 2", ask, False)
    assert exact.exact_line and exact.typed_chars == len("return a + b\n    ")
    near = score("line", 0.1, "return a - b", ask, False)
    assert not near.exact_line and near.typed_chars == len("return a ")


def _args(*extra: str):
    return build_parser().parse_args(["bench", "--workload", "session", "--no-progress", *extra])


@pytest.mark.slow
def test_a_server_that_knows_the_file_scores_exact_on_every_request(tmp_path):
    """Guards the replay: an edit sent to the wrong position (a column not reset after a
    newline, a lost indentation change) makes the oracle's copy of the document differ
    from the file, and its answers empty."""
    src = _source(tmp_path)
    args = _args("--files", str(src), "--limit", "2", "--session-lines", "4", *TWO_CONFIGS)
    args.keystroke_ms = 0
    report = session_report.run(args, server=ORACLE)
    scripts = session.build(session.expand_files([str(src)]), limit=2, block_lines=4)
    rests = [s.ask.rest for sc in scripts for s in sc.steps if s.ask is not None]
    assert len(report["results"]) == 2
    for row in report["results"]:
        assert row["requests"] == len(rests)
        assert row["empty_rate"] == 0 and row["exact_line_rate"] == 1
        assert row["typed_chars_per_request"] == pytest.approx(sum(map(len, rests)) / len(rests))
        assert row["first_request_empty_rate"] == 0
        starts = [sum(sc.asks for sc in scripts[:i]) for i in range(len(scripts))]
        firsts = [row["per_request"][i]["latency_s"] for i in starts]
        assert row["first_request_p50_s"] == pytest.approx(sum(firsts) / 2)  # 2 files
        assert 0 < row["later_p90_s"] <= max(r["latency_s"] for r in row["per_request"])


@pytest.mark.slow
def test_a_server_that_never_suggests_ends_the_run_with_every_request_scored(tmp_path, monkeypatch):
    """Guards against a run that asks the first place again until a suggestion comes: a
    server with nothing to suggest held it for ten minutes. It stops waiting after
    READY_TRIES asks, scores every request empty, and reports no ready time."""
    monkeypatch.setattr(session_run, "READY_TRIES", 3)  # the same stop, sooner
    src = _source(tmp_path, n_files=1)
    args = _args("--files", str(src), "--limit", "1", "--session-lines", "3", *TWO_CONFIGS)
    args.keystroke_ms = 0
    report = session_report.run(args, server=[*ORACLE, "--silent"])
    scripts = session.build(session.expand_files([str(src)]), limit=1, block_lines=3)
    asks = sum(s.ask is not None for sc in scripts for s in sc.steps)
    assert len(report["results"]) == 2
    for row in report["results"]:
        assert row["requests"] == asks and row["empty_rate"] == 1
        assert row["ready_s"] is None


@pytest.mark.slow
def test_the_session_report_carries_the_contract_fields(tmp_path, capsys):
    """``specd bench --workload session --json`` through the real daemon (tiny model):
    the fields DESIGN.md's contract names, per configuration."""
    out = tmp_path / "session.json"
    src = _source(tmp_path, n_files=1)
    argv = ["bench", "--workload", "session", "--model", "tiny", "--files", str(src)]
    argv += ["--limit", "1", "--session-lines", "2", "--configs", "default", "--no-progress"]
    argv += ["--threads", "1"]  # the daemon's torch: a tiny model gains nothing from more
    assert main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["results"]
    for key in (
        "latency_p50_s",
        "latency_p90_s",
        "empty_rate",
        "exact_line_rate",
        "typed_chars_per_request",
        "ready_s",
    ):
        assert key in row
    assert row["requests"] > 0 and row["ready_s"] is not None
    assert row["auto_prefix_tokens"] in AUTO_PREFIX_SIZES
    assert "| default |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--files", "/no/such/dir/*.py"], "--files /no/such/dir/*.py"),
        (["--configs", "fastest"], "unknown session configuration 'fastest'"),
        (["--session-lines", "0"], "--session-lines must be >= 1"),
        # the daemon refuses it: its own one-line reason comes back, still exit 2
        (["--model", "/no/such/model"], "it said: specd: error: unknown model '/no/such/model'"),
    ],
)
def test_bad_session_options_exit_2_naming_them(argv, message, capsys):
    assert main(["bench", "--workload", "session", "--model", "tiny", *argv]) == 2
    assert message in capsys.readouterr().err


def test_scripts_are_the_same_for_the_same_seed(tmp_path):
    files = session.expand_files([str(_source(tmp_path))])
    a = session.build(files, limit=2, seed=5)
    b = session.build(files, limit=2, seed=5)
    assert a == b
    random.seed(0)  # the workload keeps its own generator: the global one changes nothing
    assert session.build(files, limit=2, seed=5) == a
