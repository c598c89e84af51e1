"""Plugin discovery survives broken plugins."""

from __future__ import annotations

import importlib.metadata
import logging

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
    """``builtin`` means what ships in the specd distribution (its plugins and the language
    server's commands), and nothing another distribution installs, whatever its module."""
    real = importlib.metadata.entry_points
    specd_eps = list(real(group="specd"))
    assert {ep.name for ep in specd_eps} >= {"ngram", "lsp"}
    outsider = importlib.metadata.EntryPoint("outsider", "specd.plugins.ngram", "specd")

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [*specd_eps, outsider])
    monkeypatch.setenv("SPECD_LOAD_PLUGINS", "builtin")
    pm = registry.get_plugin_manager()
    assert pm.has_plugin("lsp") and pm.has_plugin("ngram")
    assert not pm.has_plugin("outsider")


class Commands:
    @hookimpl
    def specd_register_commands(self, subparsers):
        p = subparsers.add_parser("hello", help="say hello")
        p.set_defaults(func=lambda args: 0)


class ClashingCommands:
    @hookimpl
    def specd_register_commands(self, subparsers):
        subparsers.add_parser("generate")


def test_plugins_add_commands_and_a_clash_is_skipped(fresh_manager, caplog):
    from specd.cli import build_parser, main

    pm = registry.get_plugin_manager()
    pm.register(Commands(), name="commands")
    pm.register(ClashingCommands(), name="clashing")
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        parser = build_parser()
    assert parser.parse_args(["hello"]).func is not None
    assert main(["hello"]) == 0
    assert any(
        "'clashing' failed in specd_register_commands" in r.getMessage() for r in caplog.records
    )
    # the core's generate is still the core's
    assert parser.parse_args(["generate", "x"]).prompt == "x"
