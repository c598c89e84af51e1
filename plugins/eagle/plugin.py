"""The ``eagle`` entry point: the ``eagle`` and ``hybrid`` drafters and ``specd train eagle``."""

from __future__ import annotations

from specd import hookimpl

from .command import specd_register_commands
from .drafter import EagleDrafter
from .hybrid import HybridDrafter

__all__ = ["specd_register_commands", "specd_register_drafters"]


@hookimpl
def specd_register_drafters(register):
    register(EagleDrafter)
    register(HybridDrafter)
