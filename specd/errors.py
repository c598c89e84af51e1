"""Named errors. Everything a user can cause raises a subclass of :class:`SpecdError`."""

from __future__ import annotations


class SpecdError(Exception):
    """Base class for every error specd raises on purpose."""


class BadInputError(SpecdError, ValueError):
    """An argument, option or configuration value is not acceptable."""


class ModelNotFoundError(SpecdError):
    """The requested model is not available locally."""


class UnknownPluginError(BadInputError):
    """No installed plugin has the requested name."""


class PluginError(SpecdError):
    """A plugin raised, returned garbage, or overran its time budget."""
