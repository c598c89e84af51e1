"""Running plugin code so that it cannot take a request down.

A plugin call that raises, returns garbage (its caller validates and raises
:class:`PluginError`) or runs past its time limit counts as a failure: the error is logged
once per plugin with its traceback, the caller falls back to plain decoding, and after
``failure_limit`` failures the plugin is disabled for the session. A call that overruns its
limit disables the plugin at once, as does a :class:`DrafterUnavailable` (logged as its
message: the drafter cannot serve this target, which is no bug).

Calls run inline, on the decoding thread: no thread hop per draft step. A watchdog thread
interrupts a call that overruns its limit by raising :class:`PluginTimeout` inside it
(``PyThreadState_SetAsyncExc``), which stops Python code at its next bytecode; a plugin
blocked inside a single C call (a sleep, a long tensor operation) is stopped when that
call returns. A call that returns after its limit counts as an overrun either way.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import DrafterUnavailable, PluginError

log = logging.getLogger("specd.plugins")

T = TypeVar("T")


class PluginTimeout(BaseException):
    """Raised inside a plugin call that overran its time limit.

    A BaseException, so that a plugin's own ``except Exception`` cannot swallow it.
    """


@dataclass
class Health:
    calls: int = 0
    failures: int = 0
    timeouts: int = 0
    disabled: bool = False
    logged: bool = False


class PluginFailed(Exception):
    """Raised by :meth:`PluginGuard.call` when the plugin failed; the cause is attached."""


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Watchdog:
    """One daemon thread that interrupts the armed call once its deadline has passed.

    The calling thread takes no lock here: an interruption can land at any bytecode of
    that thread, and one landing inside a lock's ``__enter__`` would leave the lock held.
    The two threads agree through single assignments instead (atomic under the GIL), and
    the caller waits out a firing in progress before it goes on (see :meth:`disarm`).
    """

    IDLE_POLL_S = 0.05

    def __init__(self) -> None:
        self._armed: tuple[int, float, int] | None = None  # (thread id, deadline, serial)
        self._firing: int | None = None
        self._fired: int | None = None
        self._serial = 0
        self._thread: threading.Thread | None = None

    def arm(self, limit_s: float) -> int:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="specd-watchdog", daemon=True)
            self._thread.start()
        self._serial += 1
        self._armed = (threading.get_ident(), time.monotonic() + limit_s, self._serial)
        return self._serial

    def disarm(self, serial: int) -> bool:
        """Stop watching. :returns: whether the watchdog fired for this call. An
        interruption not delivered yet is withdrawn; one delivered while disarming
        surfaces here as PluginTimeout, and calling again finishes the job."""
        self._armed = None
        while self._firing == serial:
            time.sleep(0)  # let the watchdog finish: it decided before it saw the disarm
        if self._fired == serial:
            _async_raise(threading.get_ident(), None)
            return True
        return False

    def _run(self) -> None:
        while True:
            armed = self._armed
            if armed is None:
                time.sleep(self.IDLE_POLL_S)
                continue
            tid, deadline, serial = armed
            left = deadline - time.monotonic()
            if left > 0:
                time.sleep(min(left, self.IDLE_POLL_S))
                continue
            self._firing = serial
            if self._armed is armed:  # still running: interrupt it
                self._fired = serial
                _async_raise(tid, PluginTimeout)
            self._firing = None


class PluginGuard:
    def __init__(self, *, failure_limit: int = 3, timeout_s: float | None = 5.0) -> None:
        self.failure_limit = failure_limit
        self.timeout_s = timeout_s
        self._health: dict[str, Health] = {}
        self._watchdog = _Watchdog()

    def health(self, key: str) -> Health:
        return self._health.setdefault(key, Health())

    def disabled(self, key: str) -> bool:
        h = self._health.get(key)
        return h is not None and h.disabled

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {
            k: {
                "calls": h.calls,
                "failures": h.failures,
                "timeouts": h.timeouts,
                "disabled": h.disabled,
            }
            for k, h in self._health.items()
        }

    def call(self, key: str, fn: Callable[..., T], *args: Any, deadline: float | None = None) -> T:
        """Run ``fn(*args)`` for plugin ``key``.

        :param deadline: the request's own deadline (``time.monotonic()``), if any: the call
            is cut off there too, but that is the request running out of time, not a fault
            of the plugin, so it is not counted against it.
        :raises PluginFailed: on any failure.
        """
        h = self.health(key)
        if h.disabled:
            raise PluginFailed(f"{key} is disabled")
        h.calls += 1
        limit = self.timeout_s
        cut = limit
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0.0)
            cut = left if cut is None else min(cut, left)
        if cut is None:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - whatever a plugin raises is isolated
                self.fail(key, exc)
                raise PluginFailed(f"{key} failed: {exc}") from exc
        serial = self._watchdog.arm(cut)
        start = time.monotonic()
        fired = False
        try:
            try:
                result = fn(*args)
            finally:
                fired = self._disarm(serial)
        except PluginTimeout:
            fired = True
        except Exception as exc:  # noqa: BLE001
            if not fired:
                self.fail(key, exc)
                raise PluginFailed(f"{key} failed: {exc}") from exc
        elapsed = time.monotonic() - start
        # A call that returned late counts as an overrun even if it was not interrupted.
        if limit is not None and (elapsed > limit or (fired and cut >= limit)):
            h.timeouts += 1
            self.fail(key, PluginError(f"{key} did not return within {limit:.3g} s"), disable=True)
            raise PluginFailed(f"{key} timed out")
        if fired or elapsed > cut:
            raise PluginFailed(f"{key} stopped: the request ran out of time")
        return result

    def _disarm(self, serial: int) -> bool:
        # The interruption may arrive while disarming; finish disarming regardless.
        while True:
            try:
                return self._watchdog.disarm(serial)
            except PluginTimeout:
                continue

    def fail(self, key: str, exc: BaseException, *, disable: bool = False) -> None:
        """Record a failure of plugin ``key``."""
        h = self.health(key)
        h.failures += 1
        if isinstance(exc, DrafterUnavailable):  # it never will for this target: say why once
            if not h.disabled:
                h.disabled = h.logged = True
                log.error("plugin %s disabled for this session: %s", key, exc)
            return
        if not h.logged:
            h.logged = True
            log.error(
                "plugin %s failed; the request falls back to plain decoding", key, exc_info=exc
            )
        if (disable or h.failures >= self.failure_limit) and not h.disabled:
            h.disabled = True
            log.error("plugin %s disabled for this session after %d failure(s)", key, h.failures)
