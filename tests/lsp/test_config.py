"""Settings: one schema for the TOML file and initializationOptions; bad fields named."""

from __future__ import annotations

import pytest
from specd.lsp import config

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
