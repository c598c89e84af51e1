"""What every session of the language server shares: the engine, the generation worker,
the metrics and the settings read at start."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from typing import Any, cast

from specd import Completion, Constraint, ContextLimits, SamplingParams

from .completer import Completer
from .config import Settings
from .engines import CacheCounters, Cancel, CompletionEngine, GenerationStream
from .metrics import Metrics
from .prompter import PrefixSize
from .runner import Runner

log = logging.getLogger(__name__)


class WhenLoaded:
    """The service's engine while the model loads (a
    :class:`~.engines.CompletionEngine`): each member waits for the load, then is the
    loaded engine's. So a session can be built and ``initialize`` answered before the model
    is there, and whatever a session keeps from the start works once it is.

    :raises RuntimeError: from any member, when the model failed to load.
    """

    def __init__(self, service: Service) -> None:
        self._service = service

    def _loaded(self) -> CompletionEngine:
        self._service.wait_loaded()
        engine = self._service._engine
        assert engine is not None  # wait_loaded raised otherwise
        return engine

    @property
    def tokenizer(self) -> Any:
        return self._loaded().tokenizer

    @property
    def limits(self) -> ContextLimits:
        return self._loaded().limits

    @property
    def prefix_cache(self) -> CacheCounters | None:
        return self._loaded().prefix_cache

    def tokenize(self, text: str) -> list[int]:
        return self._loaded().tokenize(text)

    def heal(self, prompt: Sequence[int]) -> tuple[list[int], Constraint | None]:
        return self._loaded().heal(prompt)

    def cached_tokens(self, prompt: Sequence[int]) -> int:
        return self._loaded().cached_tokens(prompt)

    def warm(
        self, prompt: str | Sequence[int], cancel: Cancel = None, *, request: bool = False
    ) -> tuple[int, int]:
        return self._loaded().warm(prompt, cancel, request=request)

    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        cancel: Cancel = None,
        time_budget_s: float | None = None,
        corpus: Any = None,
        constraint: Constraint | None = None,
    ) -> GenerationStream:
        return self._loaded().stream(
            prompt,
            params,
            cancel=cancel,
            time_budget_s=time_budget_s,
            corpus=corpus,
            constraint=constraint,
        )

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kw: Any
    ) -> Completion:
        return self._loaded().generate(prompt, params, **kw)


class _CompleterWhenLoaded:
    """The completion pipeline while the model loads: reading an attribute waits for the
    load (a session may keep the pipeline from the start: its calls run on the worker)."""

    def __init__(self, service: Service) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        self._service.wait_loaded()
        return getattr(self._service._completer, name)


class Service:
    """What every session shares: one engine, one generation worker, the metrics, the
    settings read from the settings file, and what was measured at load.

    :param params: base sampling parameters for completions.
    :param settings: defaults for every session (from the TOML file).
    :param settings_messages: problems found in the file, shown to each client.
    """

    def __init__(
        self,
        engine: CompletionEngine | None,
        params: SamplingParams | None = None,
        *,
        settings: Settings | None = None,
        settings_messages: list[str] | None = None,
    ) -> None:
        self.metrics = Metrics()
        self.params = params
        #: what ``prefix-tokens = "auto"`` stands for: measured at load (``serve.warm_up``)
        #: and again by a request whose prefill was faster
        self.prefix_size = PrefixSize()
        self._engine: CompletionEngine | None = None
        self._completer: Completer | None = None
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        if engine is not None:
            self.attach(engine)
        self.worker = Runner(
            on_start=self.metrics.generation_started, on_end=self.metrics.generation_ended
        )
        self.settings = settings or Settings()
        self.settings_messages = list(settings_messages or [])
        #: document text may appear in debug logs (any session's ``log-code`` turns it on)
        self.log_code = self.settings.log_code
        self._session_ids = itertools.count(1)
        self._failures: set[str] = set()

    # -- the model, loaded behind the first messages ---------------------------------------

    def attach(self, engine: CompletionEngine) -> None:
        """The engine is loaded: requests waiting for it go ahead."""
        self._completer = Completer(engine, self.params, self.metrics, self.prefix_size)
        self._engine = engine
        self._loaded.set()

    def load_failed(self, exc: BaseException) -> None:
        """The engine could not be loaded: requests waiting for it fail with ``exc``."""
        self._load_error = exc
        self._loaded.set()

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def loading(self) -> bool:
        """The model is still loading (neither attached nor failed)."""
        return not self._loaded.is_set()

    @property
    def engine(self) -> CompletionEngine:
        """The engine; while it loads, a stand-in whose attributes wait for it."""
        if self._engine is not None:
            return self._engine
        return WhenLoaded(self)

    @property
    def completer(self) -> Completer:
        """The completion pipeline; while the engine loads, a stand-in whose attributes wait
        for it (a session may keep it from the start: its calls run on the worker)."""
        if self._completer is not None:
            return self._completer
        return cast(Completer, _CompleterWhenLoaded(self))

    def wait_loaded(self) -> None:
        """Wait for the engine. :raises RuntimeError: the model failed to load."""
        self._loaded.wait()
        if self._load_error is not None:
            raise RuntimeError("the model failed to load") from self._load_error

    def tokenize(self, text: str) -> list[int]:
        return self.engine.tokenize(text)

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
        report = self.metrics.snapshot(self._engine.prefix_cache if self._engine else None)
        # what ``prefix-tokens = "auto"`` stands for on this machine (measured at load)
        report["prompt"] = {"auto_prefix_tokens": self.prefix_size.tokens}
        return report

    def close(self) -> None:
        self.worker.stop()
