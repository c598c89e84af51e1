"""Settings: one schema for the TOML file and initializationOptions; bad fields named."""

from __future__ import annotations

import pytest
from specd.lsp import config
from specd.lsp.prompter import OBSERVE_MIN_TOKENS, PrefixSize

from specd.errors import BadInputError


def test_defaults():
    settings, messages = config.decode(None, source="initializationOptions")
    assert settings == config.Settings() and messages == []


def test_each_bad_field_is_named_and_the_rest_apply():
    raw = {"max-lines": 0, "mode": "blok", "colour": "red", "fim": "none", "prefix-tokens": 100}
    settings, messages = config.decode(raw, source="initializationOptions")
    assert settings.fim == "none" and settings.prefix_tokens == 100
    assert settings.max_lines == config.Settings().max_lines and settings.mode == "auto"
    assert len(messages) == 3
    assert any("`max-lines`" in m and ">= 1" in m for m in messages)
    assert any("`mode`" in m for m in messages)
    assert any("unknown setting `colour`" in m and "max-lines" in m for m in messages)
    assert all(m.startswith("initializationOptions: ") for m in messages)


def test_wrong_types_and_non_tables():
    settings, messages = config.decode({"max-tokens": "many"}, source="s")
    assert settings.max_tokens is None and "`max-tokens`" in messages[0]
    settings, messages = config.decode([1, 2], source="s")
    assert settings == config.Settings() and "expected a table" in messages[0]
    assert config.decode({"log-code": 1}, source="s")[1]  # no silent int -> bool


def test_overlay_keeps_the_file_and_adds_the_editor(tmp_path):
    path = tmp_path / "lsp.toml"
    path.write_text('max-lines = 3\nmode = "block"\n')
    raw, messages = config.read_file(path)
    base, more = config.decode(raw, source=str(path))
    assert messages == more == []
    settings, messages = config.overlay(base, {"mode": "line", "time-budget-ms": -5}, source="init")
    assert (settings.max_lines, settings.mode, settings.time_budget_ms) == (3, "line", 2000)
    assert "`time-budget-ms`" in messages[0]


def test_unreadable_or_invalid_files_fall_back(tmp_path):
    raw, messages = config.read_file(tmp_path / "missing.toml")
    assert raw is None and "cannot read" in messages[0]
    bad = tmp_path / "bad.toml"
    bad.write_text("max-lines = = 3")
    raw, messages = config.read_file(bad)
    assert raw is None and "not valid TOML" in messages[0]


def test_strict_decoding_raises_with_the_field_name():
    with pytest.raises(BadInputError, match="`max-lines`"):
        config.decode_strict({"max-lines": -1}, source="--config x.toml")
    with pytest.raises(BadInputError, match="unknown setting `maxlines`"):
        config.decode_strict({"maxlines": 1}, source="--config x.toml")


def test_auto_prefix_is_sized_by_the_measured_prefill():
    """``prefix-tokens = "auto"`` (the default) follows the prefill speed measured at load,
    in coarse sizes within its bounds; a number is taken as given. Guards against a slow
    machine reading 1,536 tokens before its first suggestion on every file it opens."""
    low, high = config.AUTO_PREFIX_SIZES[0], config.AUTO_PREFIX_SIZES[-1]
    auto = config.Settings()
    size = PrefixSize()
    assert auto.prefix_tokens == "auto"
    assert size.resolve(auto) == high  # nothing measured yet
    assert size.measured(700 / config.COLD_READ_S) == 512
    assert size.resolve(auto) == 512
    assert size.measured(512 / config.COLD_READ_S) == 512
    assert size.measured(511 / config.COLD_READ_S) == 384
    assert size.resolve(config.Settings(prefix_tokens=100)) == 100
    assert size.measured(1.0) == low
    assert size.measured(1e9) == high
    settings, messages = config.decode({"prefix-tokens": "most"}, source="s")
    assert settings.prefix_tokens == "auto" and "`prefix-tokens`" in messages[0]


def test_a_faster_request_prefill_sizes_auto_again():
    """A probe at start that caught a busy moment would keep every prompt of the session
    small; a request's prefill that reads faster sizes ``auto`` again, and a slower one
    (the machine busy now) leaves it. Nothing measured at start (``auto`` is then the
    largest size): requests do not change it."""
    size = PrefixSize()
    assert size.observed(640, 1.0) is None
    assert size.resolve(config.Settings()) == config.AUTO_PREFIX_SIZES[-1]

    assert size.measured(500.0) == 384  # 400 tokens in COLD_READ_S
    assert size.observed(OBSERVE_MIN_TOKENS - 1, 0.01) is None  # too short
    assert size.observed(300, 1.0) is None  # slower: the machine is busy
    assert size.resolve(config.Settings()) == 384
    assert size.observed(640, 1.0) == 512
    assert size.resolve(config.Settings()) == 512
    assert size.observed(650, 1.0) is None  # faster, the same size
    assert size.resolve(config.Settings(prefix_tokens=100)) == 100


def test_each_service_keeps_its_own_measurement():
    """Guards against the measurement living in the settings module again: two services
    (a test's and a server's, or two servers in one process) must not size each other's
    prompts, and the window a request reads follows its own service's size."""
    from specd.lsp.completer import cursor_at
    from specd.lsp.documents import Document

    slow, fast = PrefixSize(), PrefixSize()
    slow.measured(1.0)
    fast.measured(1e9)
    auto = config.Settings()
    assert (slow.resolve(auto), fast.resolve(auto)) == (256, 1536)
    doc = Document("file:///w/a.py", "x = 1\n" * 2000)
    pos = doc.resolve(1999, 0)
    small = cursor_at(doc, pos, auto, 4.0, prefix_size=slow)
    large = cursor_at(doc, pos, auto, 4.0, prefix_size=fast)
    assert len(small.before) < len(large.before)


def test_a_request_prefill_is_timed_for_auto(monkeypatch):
    """The completion pipeline hands each request's prefill to its service's
    ``PrefixSize.observed``: the tokens it computed and the seconds they took."""
    from specd.lsp.completer import Completer, CompletionRequest
    from specd.lsp.documents import Document

    from specd import Engine, SamplingParams
    from specd.forward.tiny import tiny_target

    seen: list[tuple[int, float]] = []
    size = PrefixSize()
    monkeypatch.setattr(size, "observed", lambda n, s: seen.append((n, s)))
    engine = Engine(tiny_target(), drafter="none")
    completer = Completer(engine, SamplingParams(max_tokens=2), prefix_size=size)
    text = "def total(values):\n    return sum(values)\n" * 12
    doc = Document("file:///w/main.py", text)
    cursor = doc.cursor(doc.resolve(24, 0), before_chars=4000, after_chars=400)
    settings = config.Settings(time_budget_ms=120_000, token_healing=False)
    req = CompletionRequest(cursor, "main.py", settings)
    n = len(completer.build_prompt(req).ids)
    completer.complete(req)
    ((computed, seconds),) = seen
    assert n - 16 <= computed < n and seconds > 0  # the last tokens go with the first step
    completer.complete(CompletionRequest(cursor, "main.py", settings))
    assert seen[1][0] == 0  # all of it cached


def test_the_daemon_measures_its_prefill_at_load():
    from specd.lsp import serve

    from specd import Engine
    from specd.forward.tiny import tiny_target

    size = PrefixSize()
    size.tokens = -1
    engine = Engine(tiny_target(96, seed=0), drafter="none")
    serve.warm_up(engine, size)
    low, high = config.AUTO_PREFIX_SIZES[0], config.AUTO_PREFIX_SIZES[-1]
    assert low <= size.resolve(config.Settings()) <= high and size.best_rate > 0
    assert len(engine.prefix_cache) == 0  # the probe's tokens are not kept


def test_drafter_options_the_drafter_rejects_end_the_daemons_start():
    from specd.lsp import serve

    from specd import BadInputError, Engine
    from specd.forward.tiny import tiny_target

    target = tiny_target(96, seed=0)
    engine = Engine(target, drafter="ngram", drafter_options={"ngram": {"max_n": "four"}})
    with pytest.raises(BadInputError, match="max_n='four'"):
        serve.warm_up(engine, PrefixSize())
    # the default drafter's parts take PART.KEY options
    engine = Engine(target, drafter_options={"hybrid": {"max_n": 4}})
    with pytest.raises(BadInputError, match="hybrid option 'max_n': expected PART.KEY"):
        serve.warm_up(engine, PrefixSize())
