"""What the servers need of an engine: :class:`CompletionEngine`.

Three things generate for the language server and the HTTP server: the local
:class:`specd.Engine`, the remote :class:`~.backend.Backend` (a serving engine over HTTP)
and :class:`~.service.WhenLoaded` (the engine's stand-in while the model loads). Each has
every member below; a member that means nothing for one of them returns a neutral value,
documented on that class, so callers never ask whether a member is there.

The HTTP server also reads the served model itself (``target``: its name and vocabulary)
and ``request_memory``, which only a local model has: it takes a :class:`specd.Engine`.

Not ``runtime_checkable``: on Python 3.11 ``isinstance`` against a protocol reads its
properties, and reading one on the loading stand-in waits for the model.
tests/lsp/test_engines.py holds each of the three to this protocol, member by member and
signature by signature.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from specd import Completion, Constraint, ContextLimits, Delta, SamplingParams

#: What ``cancel`` may be: checked before every target step (or prefill chunk).
Cancel = Callable[[], bool] | threading.Event | None


class CacheCounters(Protocol):
    """The prefix cache as the servers see it: its hit counts, and emptying it."""

    @property
    def lookups(self) -> int: ...

    @property
    def hits(self) -> int: ...

    def clear(self) -> None: ...


class GenerationStream(Protocol):
    """A running generation: iterate it for deltas; ``completion`` is set at its end."""

    @property
    def completion(self) -> Completion | None: ...

    def __iter__(self) -> Iterator[Delta]: ...

    def close(self) -> None: ...


class CompletionEngine(Protocol):
    """What the language server, its completion pipeline, its warm-ups and the HTTP server
    ask of an engine (the names and meanings are :class:`specd.Engine`'s)."""

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer (``decode``; prompts are built with its special tokens)."""
        ...

    @property
    def limits(self) -> ContextLimits:
        """The model's context window and longest token."""
        ...

    @property
    def prefix_cache(self) -> CacheCounters | None:
        """The cache of earlier prompts' keys and values; None where it is not this
        process's to count or clear."""
        ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        ...

    def heal(self, prompt: Sequence[int]) -> tuple[list[int], Constraint | None]:
        """Token healing: the prompt backed up to a clean token boundary and the
        constraint that writes the removed text again (None: nothing to write)."""
        ...

    def cached_tokens(self, prompt: Sequence[int]) -> int:
        """How many of ``prompt``'s tokens a request would reuse, computing nothing."""
        ...

    def warm(
        self, prompt: str | Sequence[int], cancel: Cancel = None, *, request: bool = False
    ) -> tuple[int, int]:
        """Prefill ``prompt`` ahead of a request for it.

        :returns: (tokens already cached, tokens computed now)."""
        ...

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
        """Start a generation; iterate the result for :class:`specd.Delta` objects."""
        ...

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kw: Any
    ) -> Completion:
        """Generate to the end; keyword arguments are those of :meth:`stream`."""
        ...
