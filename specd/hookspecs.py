"""The hooks a specd plugin can implement.

Each hook receives a ``register`` callback; call it once per class you provide. Plugins are
found through the ``specd`` entry-point group, the same way for first- and third-party code.
Every implementation is called (no hook is ``firstresult``), and a hook is called again
whenever the set of installed plugins changes, so an implementation only registers and does
no other work. docs/plugins.md documents each hook and the contracts of the classes
registered. Commands are not a hook: they join through the ``specd.commands`` entry-point
group (:mod:`specd.cli`).
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("specd")
hookimpl = pluggy.HookimplMarker("specd")


@hookspec
def specd_register_drafters(register: Callable[[type], None]) -> None:
    """Register drafter classes.

    :param register: call ``register(cls)`` for each :class:`specd.Drafter` subclass; its
        ``name`` attribute is what ``--drafter`` accepts. Keyword options given with
        ``--drafter-option key=value`` are passed to the constructor; one instance serves
        every request of an engine.
    :returns: nothing; results are collected through ``register``.
    """


@hookspec
def specd_register_verifiers(register: Callable[[type], None]) -> None:
    """Register verifier classes.

    :param register: call ``register(cls)`` for each :class:`specd.Verifier` subclass; its
        ``name`` attribute is what ``--verifier`` accepts, and its ``exact_for`` lists the
        decoding modes ("greedy", "sampled") it keeps exact. It is constructed without
        arguments.
    :returns: nothing; results are collected through ``register``.
    """


@hookspec
def specd_register_exit_policies(register: Callable[[type], None]) -> None:
    """Register exit-policy classes.

    :param register: call ``register(cls)`` for each :class:`specd.ExitPolicy` subclass;
        its ``name`` attribute is what ``--exit-policy`` accepts. A new instance is
        constructed, without arguments, for every request.
    :returns: nothing; results are collected through ``register``.
    """
