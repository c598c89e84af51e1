"""The ``eagle`` entry point of the ``specd`` group: the ``eagle`` and ``hybrid`` drafters
(``specd train eagle`` is the ``eagle`` entry point of ``specd.commands``, :mod:`.command`)."""

from __future__ import annotations

from specd import hookimpl

from .drafter import EagleDrafter
from .hybrid import HybridDrafter

__all__ = ["specd_register_drafters"]


@hookimpl
def specd_register_drafters(register):
    register(EagleDrafter)
    register(HybridDrafter)
