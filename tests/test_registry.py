"""Plugin discovery survives broken plugins."""

from __future__ import annotations

import importlib.metadata
import logging
import re
from pathlib import Path

import pluggy
import pytest

from specd import Drafter, hookimpl, hookspecs, registry


@pytest.fixture
def fresh_manager(monkeypatch):
    registry.reset_plugin_manager()
    registry._reported.clear()
    yield
    registry.reset_plugin_manager()


def test_a_plugin_that_fails_to_import_is_skipped(fresh_manager, monkeypatch, caplog):
    real = importlib.metadata.entry_points

    def with_broken(**kwargs):
        eps = list(real(**kwargs))
        eps.append(importlib.metadata.EntryPoint("broken", "specd_no_such_module_xyz", "specd"))
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", with_broken)
    monkeypatch.setenv("SPECD_LOAD_PLUGINS", "builtin,broken")
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        found = registry.list_plugins()
    assert "ngram" in {d["name"] for d in found["drafters"]}
    assert any("'broken'" in r.getMessage() and r.exc_info for r in caplog.records)


class Good(Drafter):
    name = "dup"


class Other(Drafter):
    name = "dup"


class Nameless(Drafter):
    pass


class Junk:
    @hookimpl
    def specd_register_drafters(self, register):
        register(int)
        register(Nameless)
        register(Other)


class Raising:
    @hookimpl
    def specd_register_drafters(self, register):
        raise RuntimeError("boom")


class Fine:
    @hookimpl
    def specd_register_drafters(self, register):
        register(Good)


def test_junk_registrations_are_skipped_and_clashes_logged(caplog):
    pm = pluggy.PluginManager("specd")
    pm.add_hookspecs(hookspecs)
    pm.register(Fine(), name="fine")
    pm.register(Raising(), name="raising")
    pm.register(Junk(), name="junk")
    registry._reported.clear()
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        found = registry.registered("drafters", pm)
    assert found["dup"].cls is Good
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "not a Drafter" in messages
    assert "without a name" in messages
    assert "'raising' failed" in messages
    assert "registered by both" in messages


class Counting:
    """Counts how often the plugin manager asks it what it registers."""

    calls = 0

    @hookimpl
    def specd_register_drafters(self, register):
        Counting.calls += 1
        register(Good)


def test_registrations_are_collected_once_per_plugin_set(fresh_manager):
    """Every request looks plugins up by name several times; none of that may call the
    hooks again until the set of plugins changes."""
    from specd import Engine, SamplingParams
    from specd.forward.tiny import tiny_target

    pm = registry.get_plugin_manager()
    Counting.calls = 0
    counting = Counting()
    pm.register(counting, name="counting")
    engine = Engine(tiny_target(seed=1), drafter="ngram")
    for _ in range(3):
        engine.generate([1, 2, 3, 1, 2, 3], SamplingParams(max_tokens=4))
    assert Counting.calls == 1
    assert "dup" in registry.registered("drafters")

    pm.register(Fine(), name="fine")  # a new plugin: collect again
    registry.registered("drafters")
    assert Counting.calls == 2
    pm.unregister(counting)
    assert "dup" in registry.registered("drafters")  # Fine still registers it
    assert Counting.calls == 2


def test_builtin_loads_every_entry_point_of_the_specd_distribution(fresh_manager, monkeypatch):
    """``builtin`` means what ships in the specd distribution (its plugins), and nothing
    another distribution installs, whatever its module."""
    real = importlib.metadata.entry_points
    specd_eps = list(real(group="specd"))
    assert {ep.name for ep in specd_eps} >= {"ngram", "eagle"}
    outsider = importlib.metadata.EntryPoint("outsider", "specd.plugins.ngram", "specd")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [*specd_eps, outsider])
    monkeypatch.setenv("SPECD_LOAD_PLUGINS", "builtin")
    pm = registry.get_plugin_manager()
    assert pm.has_plugin("eagle") and pm.has_plugin("ngram")
    assert not pm.has_plugin("outsider")


# -- commands: the ``specd.commands`` entry-point group ------------------------------------

COMMANDS_MODULE = """
import argparse


def hello(subparsers):
    p = subparsers.add_parser("hello", help="say hello")
    p.set_defaults(func=lambda args: 0)


def clashing(subparsers):
    subparsers.add_parser("goodbye")
    subparsers.add_parser("generate")


def replacing(subparsers):  # what Python 3.10's argparse lets through without an error
    subparsers.add_parser("farewell")
    subparsers.choices["plugins"] = argparse.ArgumentParser()


def raising(subparsers):
    raise RuntimeError("boom")
"""


@pytest.fixture
def third_party_commands(tmp_path, monkeypatch):
    """Entry points of another distribution in the ``specd.commands`` group, added to
    what is installed: returns a function that sets ``SPECD_LOAD_PLUGINS``."""
    (tmp_path / "specd_test_commands.py").write_text(COMMANDS_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points
    group = "specd.commands"
    extra = [
        importlib.metadata.EntryPoint(name, f"specd_test_commands:{name}", group)
        for name in ("hello", "clashing", "replacing", "raising")
    ]
    extra.append(importlib.metadata.EntryPoint("missing", "specd_no_such_module_xyz:f", group))

    def with_extra(**kwargs):
        eps = list(real(**kwargs))
        return [*extra, *eps] if kwargs.get("group") == group else eps

    monkeypatch.setattr(importlib.metadata, "entry_points", with_extra)
    return lambda value: monkeypatch.setenv("SPECD_LOAD_PLUGINS", value)


def test_commands_of_other_distributions_join_and_broken_ones_are_skipped(
    third_party_commands, caplog
):
    from specd.cli import build_parser, main

    third_party_commands("builtin,hello,clashing,replacing,raising,missing")
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        parser = build_parser()
    assert parser.parse_args(["hello"]).func is not None
    assert main(["hello"]) == 0
    failed = {
        name
        for r in caplog.records
        for name in ("clashing", "replacing", "raising", "missing")
        if f"commands {name!r}" in r.getMessage() and r.exc_info
    }
    assert failed == {"clashing", "replacing", "raising", "missing"}
    # the core's commands are still the core's, listed before the others
    assert parser.parse_args(["generate", "x"]).prompt == "x"
    assert parser.parse_args(["plugins", "--json"]).json
    # what a skipped entry point added before it failed is taken out again
    for name in ("goodbye", "farewell"):
        with pytest.raises(SystemExit):
            parser.parse_args([name])
    listing = parser.format_help()
    assert "goodbye" not in listing and "farewell" not in listing
    assert listing.index("generate") < listing.index("hello")


def test_load_plugins_limits_other_commands_but_not_specds_own(third_party_commands):
    from specd.cli import build_parser

    def commands() -> set[str]:
        listing = build_parser().format_help()
        return set(re.findall(r"^    (\w+) ", listing, flags=re.MULTILINE))

    for setting in ("builtin", ""):
        third_party_commands(setting)
        assert "hello" not in commands()
        assert {"generate", "plugins", "verify", "bench", "serve", "train"} <= commands()
    third_party_commands("hello")
    assert "hello" in commands()


def test_a_missing_installation_of_the_commands_is_named(monkeypatch, caplog, capsys):
    """Metadata without specd's own command entry points (an installation older than its
    code) says so, not only that every command is an invalid choice."""
    from specd.cli import main

    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [] if kw.get("group") == "specd.commands" else real(**kw),
    )
    with caplog.at_level(logging.ERROR, logger="specd.plugins"), pytest.raises(SystemExit):
        main(["generate", "x"])
    assert any("install specd again" in r.getMessage() for r in caplog.records)


def test_the_guides_command_example_runs(tmp_path, monkeypatch, capsys):
    """docs/plugins.md's command, installed through its entry point, runs on a tiny model."""
    guide = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    section = guide[guide.index("## Reference: commands") :]
    entry = re.search(r"```toml\n(.*?)```", section, flags=re.DOTALL).group(1)
    name, _, value = entry.splitlines()[-1].partition(" = ")
    module, _, function = value.strip('"').partition(":")
    code = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)
    (tmp_path / f"{module}.py").write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = importlib.metadata.entry_points
    ep = importlib.metadata.EntryPoint(name, f"{module}:{function}", "specd.commands")
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **kw: [*real(**kw), ep] if kw.get("group") == "specd.commands" else real(**kw),
    )
    monkeypatch.setenv("SPECD_LOAD_PLUGINS", f"builtin,{name}")
    from specd.cli import main

    args = ["abc", "--model", "tiny", "--max-tokens", "4", "--drafter", "none"]
    assert main([name, *args]) == 0
    assert capsys.readouterr().out.strip()
