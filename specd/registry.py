"""Finding plugins: one plugin manager, the entry-point group ``specd``, and lookups by name."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from . import hookspecs
from .api import Drafter, ExitPolicy, Verifier
from .errors import BadInputError, UnknownPluginError

#: Set to a comma-separated list of entry-point names to load only those plugins
#: (``SPECD_LOAD_PLUGINS=""`` loads none, ``builtin`` only specd's own); unset loads every
#: installed plugin.
LOAD_PLUGINS_ENV = "SPECD_LOAD_PLUGINS"
BUILTIN_PREFIX = "specd.plugins."

_pm: pluggy.PluginManager | None = None
log = logging.getLogger("specd.plugins")

KINDS = {
    "drafters": ("specd_register_drafters", Drafter),
    "verifiers": ("specd_register_verifiers", Verifier),
    "exit_policies": ("specd_register_exit_policies", ExitPolicy),
}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, created and loaded on first use.

    A plugin whose module fails to import is logged with its traceback and skipped, so one
    broken installation cannot take every command down.
    """
    global _pm
    if _pm is None:
        from importlib.metadata import entry_points

        pm = pluggy.PluginManager("specd")
        pm.add_hookspecs(hookspecs)
        only = os.environ.get(LOAD_PLUGINS_ENV)
        wanted = None if only is None else {n.strip() for n in only.split(",") if n.strip()}
        for ep in entry_points(group="specd"):
            if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            if wanted is not None:
                builtin = "builtin" in wanted and ep.value.startswith(BUILTIN_PREFIX)
                if not (builtin or ep.name in wanted):
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


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    cls: type

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "module": self.module}


def registered(kind: str, pm: pluggy.PluginManager | None = None) -> dict[str, PluginInfo]:
    """Everything of one kind ("drafters", "verifiers", "exit_policies"), by name.

    Each plugin's hook runs on its own: one that raises, or registers something that is
    not a subclass of the kind's base class or has no name, is logged and skipped. When two
    plugins register the same name, the first keeps it and the clash is logged.
    """
    hook_name, base = KINDS[kind]
    pm = pm or get_plugin_manager()
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
        singular = {"drafters": "drafter", "verifiers": "verifier", "exit_policies": "exit policy"}[
            kind
        ]
        raise UnknownPluginError(f"unknown {singular} {name!r} (installed: {known})")
    return infos[name].cls


def make(kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
    """Instantiate the plugin class called ``name``, passing ``options`` to its constructor."""
    cls = _lookup(kind, name)
    try:
        return cls(**(options or {}))
    except TypeError as e:
        raise BadInputError(f"bad options for {name!r}: {e}") from e


def drafter_class(name: str) -> type[Drafter]:
    return _lookup("drafters", name)


def verifier_class(name: str) -> type[Verifier]:
    return _lookup("verifiers", name)


def exit_policy_class(name: str) -> type[ExitPolicy]:
    return _lookup("exit_policies", name)


RegisterFn = Callable[[type], None]
