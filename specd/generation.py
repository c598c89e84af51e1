"""What a generation gives back: streamed :class:`Delta` pieces, the final
:class:`Completion`, and the emit step that turns committed tokens into them."""

from __future__ import annotations

import time
from collections.abc import Collection, Generator
from dataclasses import dataclass
from typing import Any

from .sampling import SamplingParams
from .stats import Stats
from .textstream import TextStream


@dataclass
class Delta:
    """A piece of streamed output: final text and the tokens it came from."""

    text: str
    token_ids: list[int]


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    stats: Stats

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "stats": self.stats.as_json()}


class Generation:
    """A running generation: iterate for :class:`Delta` objects; ``completion`` is set at the end.

    :param steps: the decode loop, yielding deltas and returning the completion.
    """

    def __init__(self, steps: Generator[Delta, None, Completion]) -> None:
        self._steps = steps
        self.completion: Completion | None = None

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> Delta:
        try:
            return next(self._steps)
        except StopIteration as end:
            if end.value is not None:
                self.completion = end.value
            raise

    def close(self) -> None:
        """Stop early (the completion stays None); the engine releases what it holds."""
        self._steps.close()

    def result(self) -> Completion:
        """Run to the end and return the completion."""
        for _ in self:
            pass
        assert self.completion is not None
        return self.completion


class Emitter:
    """The emit step: what a request streams, from the tokens each step commits.

    EOS and ``max_tokens`` cut the committed tokens, :class:`TextStream` turns them into
    final text (never half a character, never the start of a possible stop string) and cuts
    at a stop string. The cache may hold a few tokens more than were emitted, which is
    harmless: the prefix cache records exactly what it holds.

    :param stats: gets ``new_tokens``, ``ttft_s`` and the time per token of each step.
    :param t_start: when the request started (``time.perf_counter()``), for ``ttft_s``.
    """

    def __init__(
        self,
        tokenizer: Any,
        params: SamplingParams,
        eos_token_ids: Collection[int],
        stats: Stats,
        t_start: float,
    ) -> None:
        self.text = TextStream(tokenizer, params.stop)
        self.max_tokens = params.max_tokens
        self.eos = eos_token_ids
        self.stats = stats
        self.t_start = t_start
        self.token_ids: list[int] = []
        #: why the generation ends ("eos", "length", "stop", ...); "" while it goes on
        self.finish = ""

    @property
    def room(self) -> int:
        """Tokens still to emit before ``max_tokens``."""
        return self.max_tokens - len(self.token_ids)

    def emit(self, new: list[int], t_step: float) -> Delta | None:
        """Emit one step's committed tokens (the step began at ``t_step``).

        :returns: the delta to stream, or None when the step adds nothing visible yet.
        """
        emit = new
        for i, t in enumerate(emit):
            if t in self.eos:
                emit, self.finish = emit[:i], "eos"
                break
        if len(emit) >= self.room:
            emit = emit[: self.room]
            self.finish = self.finish or "length"
        piece, kept = self.text.push(emit)
        emit = emit[:kept]
        if self.text.stopped:
            self.finish = "stop"
        self.token_ids.extend(emit)
        now = time.perf_counter()
        if emit and self.stats.new_tokens == 0:
            self.stats.ttft_s = now - self.t_start
        self.stats.new_tokens = len(self.token_ids)
        self.stats.step_s.append((now - t_step) / max(len(emit), 1))
        return Delta(piece, emit) if piece or emit else None

    def flush(self) -> Delta | None:
        """The text held back for a stop string that never came; call once at the end."""
        tail = self.text.flush()
        return Delta(tail, []) if tail else None
