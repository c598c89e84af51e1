"""The prompt side of the engine: bringing a cache to hold a prompt, reusing the longest
prefix the prefix cache holds (:class:`specd.prefix_cache.PrefixCache`), warming a prompt
into it before it is asked for, and telling what a prompt would reuse.
:class:`Prompts` is that part of :class:`specd.engine.Engine`; it reads the engine's
``target``, ``prefix_cache`` and ``_lock``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .errors import BadInputError
from .forward.passes import FIRST_CHUNK, PREFILL_CHUNK
from .kvcache import KVCache

#: Tokens a warm-up prefills between two looks at its cancel check: a request waits at
#: most this long for the warm-up it interrupts.
WARM_CHUNK = 64
#: At most this many uncached prompt tokens are fed with the first step's draft instead
#: of being prefilled first: the next keystroke's request costs one forward, not two.
FEED_TOKENS = 16


class Prompts:
    """Prefill, warm-ups and cached prefixes (a part of ``Engine``)."""

    target: Any
    prefix_cache: Any
    _lock: threading.Lock
    _prompt_ids: Callable[[str | Sequence[int]], list[int]]

    def prefill(
        self,
        prompt: Sequence[int],
        stop: Callable[[], str] | None = None,
        hidden: list[torch.Tensor] | None = None,
        leave: int = 0,
        hidden_rows: int | None = None,
    ) -> tuple[KVCache, int, str]:
        """Bring a cache to hold ``prompt[:-1]``, reusing the longest cached prefix, with
        ``stop`` checked between prefill chunks (:data:`specd.forward.passes.PREFILL_CHUNK`);
        ``leave`` or fewer tokens left are not computed (the first step feeds them).

        :param hidden: receives the last hidden states of the tokens computed, by chunk.
        :param hidden_rows: only those of the last this many tokens (``Drafter.feature_rows``).
        :returns: (cache, tokens reused from an earlier request, why it stopped early or "").
        """
        extend = self.target.prefill
        if hidden_rows is not None:
            extend = functools.partial(extend, hidden_rows=hidden_rows)
        return self.prefix_cache.prefill(prompt[:-1], extend, stop, hidden, leave)

    def warm(
        self,
        prompt: str | Sequence[int],
        cancel: Callable[[], bool] | threading.Event | None = None,
        *,
        chunk: int = WARM_CHUNK,
        request: bool = False,
    ) -> tuple[int, int]:
        """Prefill ``prompt`` into the prefix cache before it is asked for, so a request
        for it (or one extending it) computes only what follows. ``cancel`` is checked
        between chunks; what was computed stays, so a cancelled warm-up is continued.
        ``request``: a request's own prefill before :meth:`stream` (only a newer request for
        the prompt interrupts it): in a prefill's chunks, the last few tokens (fewer than
        :data:`FEED_TOKENS`) left to the first step.

        :returns: (tokens that were already cached, tokens computed now).
        """
        if chunk < 1:
            raise BadInputError(f"chunk must be >= 1, got {chunk}")
        ids = self._prompt_ids(prompt)
        if isinstance(cancel, threading.Event):
            cancel = cancel.is_set
        sizes = (PREFILL_CHUNK, FEED_TOKENS - 1, FIRST_CHUNK) if request else (chunk, 0, None)
        with self._lock:  # a request keeps all of its prompt but the pending token cached
            return self.prefix_cache.fill(ids[:-1], self.target.prefill, cancel, *sizes)

    def cached_tokens(self, prompt: Sequence[int]) -> int:
        """How many of ``prompt``'s tokens a request would reuse, computing nothing."""
        return self.prefix_cache.cached(list(prompt[:-1]))
