"""Which entry points specd loads: the ``specd`` group (plugin modules, through pluggy) and
the ``specd.commands`` group (the command line's commands).

Both answer to one setting, :data:`LOAD_PLUGINS_ENV`. This module imports nothing but the
standard library, so the command line can read its entry points without loading a model
library.
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

#: Set to a comma-separated list of entry-point names to load only those plugins
#: (``SPECD_LOAD_PLUGINS=""`` loads none, ``builtin`` every entry point of the specd
#: distribution itself); unset loads every installed plugin.
LOAD_PLUGINS_ENV = "SPECD_LOAD_PLUGINS"
DISTRIBUTION = "specd"


def ships_with_specd(ep: Any) -> bool:
    """Whether an entry point belongs to the specd distribution itself."""
    dist = getattr(ep, "dist", None)
    return dist is not None and (dist.name or "").lower() == DISTRIBUTION


def selected(group: str, *, builtin: bool = False) -> list[Any]:
    """The entry points of ``group`` that :data:`LOAD_PLUGINS_ENV` lets load, in the order
    ``importlib.metadata`` lists them.

    :param builtin: keep the specd distribution's own entry points whatever the setting
        says (the core's commands are not optional).
    """
    only = os.environ.get(LOAD_PLUGINS_ENV)
    wanted = None if only is None else {n.strip() for n in only.split(",") if n.strip()}
    out = []
    for ep in importlib.metadata.entry_points(group=group):
        if wanted is not None and ep.name not in wanted:
            own = ships_with_specd(ep)
            if not (own and (builtin or "builtin" in wanted)):
                continue
        out.append(ep)
    return out
