"""Finding plugins: one plugin manager, the entry-point group ``specd``, and lookups by name
(the command line reads its own group, ``specd.commands``: :mod:`specd.cli`).

What the plugins register is collected once per plugin manager and set of plugins, so a
request's lookups by name cost a dictionary read; registering or unregistering a plugin, or
:func:`reset_plugin_manager`, makes the next lookup collect again.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass
from typing import Any

import pluggy

from . import entrypoints, hookspecs
from .api import Drafter, ExitPolicy, Verifier
from .errors import BadInputError, UnknownPluginError

_pm: pluggy.PluginManager | None = None
log = logging.getLogger("specd.plugins")


@dataclass(frozen=True)
class Kind:
    """One kind of plugin class: the hook that registers it, its base class, the prefix
    of its health key (``drafter:ngram``) and its name in messages."""

    hook: str
    base: type
    key: str
    noun: str


KINDS = {
    "drafters": Kind("specd_register_drafters", Drafter, "drafter", "drafter"),
    "verifiers": Kind("specd_register_verifiers", Verifier, "verifier", "verifier"),
    "exit_policies": Kind("specd_register_exit_policies", ExitPolicy, "exit_policy", "exit policy"),
}


def plugin_key(kind: str, name: str) -> str:
    """What a plugin's health is filed under (``Engine.plugin_health()``, ``Stats.fallback``):
    ``drafter:ngram``, ``verifier:rejection``, ``exit_policy:adaptive``.

    :param kind: "drafters", "verifiers" or "exit_policies".
    """
    return f"{KINDS[kind].key}:{name}"


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, created and loaded on first use.

    A plugin whose module fails to import is logged with its traceback and skipped, so one
    broken installation cannot take every command down.
    """
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("specd")
        pm.add_hookspecs(hookspecs)
        for ep in entrypoints.selected("specd"):  # as SPECD_LOAD_PLUGINS says
            if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            try:
                pm.register(ep.load(), name=ep.name)
            except Exception as exc:  # noqa: BLE001 - a broken plugin is skipped, not fatal
                _report(f"plugin {ep.name!r} ({ep.value}) failed to load and is skipped", exc)
        _pm = pm
    return _pm


_reported: set[str] = set()


def _report(message: str, exc: BaseException | None = None) -> None:
    """Log a plugin problem once per process."""
    if message not in _reported:
        _reported.add(message)
        log.error(message, exc_info=exc)


def reset_plugin_manager() -> None:
    """Forget the loaded plugins (tests, or after installing a plugin at run time)."""
    global _pm
    _pm = None
    _scans.clear()


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    cls: type

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "module": self.module}


#: plugin manager -> (the plugins it held, what they registered, by kind and name)
_scans: weakref.WeakKeyDictionary[pluggy.PluginManager, tuple[list[object], dict]] = (
    weakref.WeakKeyDictionary()
)


def registered(kind: str, pm: pluggy.PluginManager | None = None) -> dict[str, PluginInfo]:
    """Everything of one kind ("drafters", "verifiers", "exit_policies"), by name.

    Each plugin's hook runs on its own: one that raises, or registers something that is
    not a subclass of the kind's base class or has no name, is logged and skipped. When two
    plugins register the same name, the first keeps it and the clash is logged.
    """
    pm = pm or get_plugin_manager()
    plugins = [plugin for _, plugin in pm.list_name_plugin()]
    scan = _scans.get(pm)
    if (
        scan is None
        or len(scan[0]) != len(plugins)
        or any(a is not b for a, b in zip(scan[0], plugins))
    ):
        scan = (plugins, {k: _collect(k, pm) for k in KINDS})
        _scans[pm] = scan
    return dict(scan[1][kind])


def _collect(kind: str, pm: pluggy.PluginManager) -> dict[str, PluginInfo]:
    hook_name, base = KINDS[kind].hook, KINDS[kind].base
    found: dict[str, PluginInfo] = {}

    for impl in getattr(pm.hook, hook_name).get_hookimpls():

        def register(cls: type, _plugin: str = impl.plugin_name) -> None:
            if not (isinstance(cls, type) and issubclass(cls, base)):
                _report(
                    f"plugin {_plugin!r} registered {cls!r}, which is not a {base.__name__}; skipped"
                )
                return
            name = getattr(cls, "name", "")
            if not name or not isinstance(name, str):
                _report(f"plugin {_plugin!r} registered {cls.__qualname__} without a name; skipped")
                return
            if name in found:
                if found[name].cls is not cls:
                    _report(
                        f"{kind} name {name!r} is registered by both {found[name].module} and "
                        f"{cls.__module__}; {found[name].module} keeps it"
                    )
                return
            found[name] = PluginInfo(name=name, module=cls.__module__, cls=cls)

        try:
            impl.function(register=register)
        except Exception as exc:  # noqa: BLE001
            _report(f"plugin {impl.plugin_name!r} failed in {hook_name} and is skipped", exc)
    return found


def list_plugins(pm: pluggy.PluginManager | None = None) -> dict[str, list[dict[str, str]]]:
    """What ``specd plugins --json`` prints."""
    out: dict[str, list[dict[str, str]]] = {}
    for kind in KINDS:
        infos = registered(kind, pm)
        out[kind] = [infos[n].as_json() for n in sorted(infos)]
    return out


def _lookup(kind: str, name: str) -> type:
    infos = registered(kind)
    if name not in infos:
        known = ", ".join(sorted(infos)) or "none installed"
        raise UnknownPluginError(f"unknown {KINDS[kind].noun} {name!r} (installed: {known})")
    return infos[name].cls


def make(kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
    """Instantiate the plugin class called ``name``, passing ``options`` to its constructor."""
    cls = _lookup(kind, name)
    try:
        return cls(**(options or {}))
    except BadInputError:
        raise  # a part's own options (a drafter that combines others) say what was wrong
    except TypeError as e:
        raise BadInputError(f"bad options for {name!r}: {e}") from e
    except ValueError as e:
        if not options:
            raise
        # a value the constructor could not read (options from the command line are text)
        given = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise BadInputError(f"bad options for {name!r} ({given}): {e}") from e


def make_drafter(name: str, options: dict[str, Any] | None = None) -> Drafter:
    """A new instance of the drafter registered as ``name`` (what a drafter that combines
    others uses to build them).

    :raises UnknownPluginError: nothing registered ``name``.
    :raises BadInputError: its constructor rejected ``options``.
    """
    return make("drafters", name, options)


def drafter_class(name: str) -> type[Drafter]:
    return _lookup("drafters", name)


def verifier_class(name: str) -> type[Verifier]:
    return _lookup("verifiers", name)


def exit_policy_class(name: str) -> type[ExitPolicy]:
    return _lookup("exit_policies", name)
