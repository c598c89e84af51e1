"""Running plugin code so that it cannot take a request down.

A plugin call that raises, returns garbage (its caller validates and raises
:class:`PluginError`) or runs past its time limit counts as a failure: the error is logged
once per plugin with its traceback, the caller falls back to plain decoding, and after
``failure_limit`` failures the plugin is disabled for the session. A call that overruns its
limit disables the plugin at once.

Calls run inline, on the decoding thread: no thread hop per draft step. A watchdog thread
interrupts a call that overruns its limit by raising :class:`PluginTimeout` inside it
(``PyThreadState_SetAsyncExc``), which stops Python code at its next bytecode; a plugin
blocked inside a single C call (a sleep, a long tensor operation) is stopped when that
call returns.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import PluginError

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
    last_error: str = ""


class PluginFailed(Exception):
    """Raised by :meth:`PluginGuard.call` when the plugin failed; the cause is attached."""


def _async_raise(thread_id: int, exc: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc is not None else None
    )


class _Watchdog:
    """One daemon thread that interrupts the armed call when its deadline passes."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: tuple[int, float, int] | None = None  # (thread id, deadline, serial)
        self._fired: set[int] = set()
        self._serial = 0
        self._thread: threading.Thread | None = None

    def arm(self, limit_s: float) -> int:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="specd-watchdog", daemon=True)
                self._thread.start()
            self._serial += 1
            self._armed = (threading.get_ident(), time.monotonic() + limit_s, self._serial)
            self._cond.notify()
            return self._serial

    def disarm(self, serial: int) -> bool:
        """Stop watching; :returns: whether the watchdog fired for this call. A pending
        interruption that was not delivered yet is withdrawn."""
        with self._cond:
            if self._armed is not None and self._armed[2] == serial:
                self._armed = None
            fired = serial in self._fired
            if fired:
                self._fired.discard(serial)
                _async_raise(threading.get_ident(), None)
            return fired

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._armed is None:
                    self._cond.wait()
                    continue
                tid, deadline, serial = self._armed
                left = deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._armed = None
                self._fired.add(serial)
                _async_raise(tid, PluginTimeout)


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
            k: {"calls": h.calls, "failures": h.failures, "timeouts": h.timeouts, "disabled": h.disabled}
            for k, h in self._health.items()
        }

    def call(self, key: str, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """Run ``fn(*args)`` for plugin ``key``. :raises PluginFailed: on any failure."""
        h = self.health(key)
        if h.disabled:
            raise PluginFailed(f"{key} is disabled")
        h.calls += 1
        limit = self.timeout_s if timeout_s is None else timeout_s
        if limit is None:
            try:
                return fn(*args)
            except Exception as exc:  # noqa: BLE001 - whatever a plugin raises is isolated
                self.fail(key, exc)
                raise PluginFailed(f"{key} failed: {exc}") from exc
        serial = self._watchdog.arm(max(limit, 0.0))
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
        if fired:
            h.timeouts += 1
            self.fail(key, PluginError(f"{key} did not return within {limit:.3g} s"), disable=True)
            raise PluginFailed(f"{key} timed out")
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
        h.last_error = f"{type(exc).__name__}: {exc}"
        if not h.logged:
            h.logged = True
            log.error("plugin %s failed; the request falls back to plain decoding", key, exc_info=exc)
        if (disable or h.failures >= self.failure_limit) and not h.disabled:
            h.disabled = True
            log.error("plugin %s disabled for this session after %d failure(s)", key, h.failures)
