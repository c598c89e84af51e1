"""The hooks a specd plugin can implement.

The class hooks receive a ``register`` callback; call it once per class you provide. The
command hook receives the command line's subparsers. Plugins are found through the ``specd``
entry-point group, the same way for first- and third-party code. Every implementation is
called (no hook is ``firstresult``), and a class hook is called again whenever the set of
installed plugins changes, so an implementation only registers and does no other work.
docs/plugins.md documents each hook and the contracts of the classes registered.
"""

from __future__ import annotations

import argparse
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


@hookspec
def specd_register_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add subcommands to the ``specd`` command line.

    :param subparsers: the command line's subparsers: call ``subparsers.add_parser(NAME,
        help=...)`` for each command, and ``set_defaults(func=...)`` on it with a function
        that takes the parsed arguments and returns an exit code (``specd.options``:
        ``EXIT_OK``, ``EXIT_CHECK_FAILED``, ``EXIT_BAD_INPUT``). ``specd.options`` also has the
        model and decoding options every command shares and the one engine builder. A
        :class:`specd.BadInputError` raised by the function exits 2 with its message. A
        name that is already taken is refused and the plugin's commands are skipped.
    :returns: nothing; commands are added through ``subparsers``.
    """
