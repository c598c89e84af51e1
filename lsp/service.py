"""What every session of the language server shares: the engine, the generation worker,
the metrics and the settings read at start."""

from __future__ import annotations

import itertools
import logging
from typing import Any

from specd import Engine, SamplingParams

from .completer import Completer
from .config import Settings
from .metrics import Metrics
from .scheduler import Worker

log = logging.getLogger(__name__)


class Service:
    """What every session shares: one engine, one generation worker, the metrics, and the
    settings read from the settings file.

    :param params: base sampling parameters for completions.
    :param settings: defaults for every session (from the TOML file).
    :param settings_messages: problems found in the file, shown to each client.
    """

    def __init__(
        self,
        engine: Engine,
        params: SamplingParams | None = None,
        *,
        settings: Settings | None = None,
        settings_messages: list[str] | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = Metrics()
        self.completer = Completer(engine, params, self.metrics)
        self.worker = Worker(
            on_start=self.metrics.generation_started, on_end=self.metrics.generation_ended
        )
        self.settings = settings or Settings()
        self.settings_messages = list(settings_messages or [])
        #: document text may appear in debug logs (any session's ``log-code`` turns it on)
        self.log_code = self.settings.log_code
        self._session_ids = itertools.count(1)
        self._failures: set[str] = set()

    def new_session_id(self) -> int:
        return next(self._session_ids)

    def failed(self, exc: BaseException) -> None:
        """A completion raised: log it with its traceback the first time per kind."""
        self.metrics.count("errors")
        kind = type(exc).__name__
        if kind not in self._failures:
            self._failures.add(kind)
            log.error("a completion failed; answering with no completion", exc_info=exc)
        else:
            log.debug("a completion failed again (%s)", kind)

    def stats(self) -> dict[str, Any]:
        return self.metrics.snapshot(self.engine.prefix_cache)

    def close(self) -> None:
        self.worker.stop()
