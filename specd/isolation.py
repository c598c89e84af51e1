"""Running plugin code so that it cannot take a request down.

A plugin call that raises, returns garbage (its caller validates and raises
:class:`PluginError`) or runs past its time limit counts as a failure: the error is logged
once per plugin with its traceback, the caller falls back to plain decoding, and after
``failure_limit`` failures the plugin is disabled for the session. A call that times out
disables the plugin at once, since its thread may still be running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import PluginError

log = logging.getLogger("specd.plugins")

T = TypeVar("T")


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


class PluginGuard:
    def __init__(self, *, failure_limit: int = 3, timeout_s: float | None = 5.0) -> None:
        self.failure_limit = failure_limit
        self.timeout_s = timeout_s
        self._health: dict[str, Health] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

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

    def call(self, key: str, fn: Callable[..., T], *args: Any, timeout_s: float | None = None) -> T:
        """Run ``fn(*args)`` for plugin ``key``. :raises PluginFailed: on any failure."""
        h = self.health(key)
        if h.disabled:
            raise PluginFailed(f"{key} is disabled")
        h.calls += 1
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            if limit is None:
                return fn(*args)
            future = self._pool().submit(fn, *args)
            try:
                return future.result(timeout=max(limit, 0.0))
            except FutureTimeout:
                # The worker thread is stuck in plugin code: abandon it with its plugin.
                self._abandon_pool()
                h.timeouts += 1
                self.fail(
                    key, PluginError(f"{key} did not return within {limit:.3g} s"), disable=True
                )
                raise PluginFailed(f"{key} timed out") from None
        except PluginFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a plugin raises is isolated
            self.fail(key, exc)
            raise PluginFailed(f"{key} failed: {exc}") from exc

    def fail(self, key: str, exc: BaseException, *, disable: bool = False) -> None:
        """Record a failure of plugin ``key``."""
        h = self.health(key)
        h.failures += 1
        h.last_error = f"{type(exc).__name__}: {exc}"
        if not h.logged:
            h.logged = True
            log.error(
                "plugin %s failed; the request falls back to plain decoding", key, exc_info=exc
            )
        if (disable or h.failures >= self.failure_limit) and not h.disabled:
            h.disabled = True
            log.error("plugin %s disabled for this session after %d failure(s)", key, h.failures)

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="specd-plugin"
                )
            return self._executor

    def _abandon_pool(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
