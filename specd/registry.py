"""Finding plugins: one plugin manager, the entry-point group ``specd``, and lookups by name."""

from __future__ import annotations

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

KINDS = {
    "drafters": ("specd_register_drafters", Drafter),
    "verifiers": ("specd_register_verifiers", Verifier),
    "exit_policies": ("specd_register_exit_policies", ExitPolicy),
}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, created and loaded on first use."""
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager("specd")
        pm.add_hookspecs(hookspecs)
        only = os.environ.get(LOAD_PLUGINS_ENV)
        if only is None:
            pm.load_setuptools_entrypoints("specd")
        else:
            from importlib.metadata import entry_points

            wanted = {n.strip() for n in only.split(",") if n.strip()}
            for ep in entry_points(group="specd"):
                builtin = "builtin" in wanted and ep.value.startswith(BUILTIN_PREFIX)
                if (builtin or ep.name in wanted) and not pm.has_plugin(ep.name):
                    pm.register(ep.load(), name=ep.name)
        _pm = pm
    return _pm


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
    """Everything of one kind ("drafters", "verifiers", "exit_policies"), by name."""
    hook_name, base = KINDS[kind]
    pm = pm or get_plugin_manager()
    found: dict[str, PluginInfo] = {}

    def register(cls: type) -> None:
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise TypeError(f"{hook_name} registered {cls!r}, which is not a {base.__name__}")
        name = getattr(cls, "name", "")
        if not name:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__} has no name")
        found.setdefault(name, PluginInfo(name=name, module=cls.__module__, cls=cls))

    getattr(pm.hook, hook_name)(register=register)
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
