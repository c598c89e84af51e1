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


class DrafterUnavailable(PluginError):
    """A drafter cannot draft for this target at all, e.g. no EAGLE head exists for the
    model. Raised from :meth:`Drafter.start`: the engine disables the drafter for the session
    (plain decoding, the reason logged in one line); ``hybrid`` drafts with its other parts."""
