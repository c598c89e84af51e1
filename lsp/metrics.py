"""Server metrics since start, answered by the ``specd/stats`` request.

Aggregates only: counts, rates, percentiles. Nothing here ever holds document text or
completion text, so the report is safe to paste into a bug report.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from specd import Stats, percentile

CANCEL_REASONS = ("client", "superseded", "changed", "preempted", "shutdown")


class Metrics:
    """Thread-safe counters. Latency percentiles are over the last ``window`` requests, so
    memory stays flat however long the server runs."""

    def __init__(self, window: int = 2048) -> None:
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.requests = 0
        self.completed = 0
        self.empty = 0
        self.errors = 0
        self.fallbacks = 0
        self.clamped_positions = 0
        self.cancelled = dict.fromkeys(CANCEL_REASONS, 0)
        self.generations = 0
        self.running = 0
        self.max_running = 0
        self.new_tokens = 0
        self.target_steps = 0
        self.drafted = 0
        self.accepted = 0
        self.prompt_tokens = 0
        self.reused_tokens = 0
        self._position_drafted: list[int] = []
        self._position_accepted: list[int] = []
        # the pipeline (docs/editors.md, "How suggestions are produced")
        self.first_line_answers = 0  # answered at the first line, the rest generated after
        self.from_cache = 0  # answered from the completion cache, no model step
        self.cache_waits = 0  # of those, answered after waiting for a running generation
        self.debounced = 0  # requests that waited for a keystroke that might make them stale
        self.cold_prompts = 0  # requests answered from a short prompt while the full one warms
        self.prefetches = 0  # completions generated after the user typed one through
        self.warmups = 0  # prompts prefilled before they were asked for
        self.warmed_tokens = 0  # tokens those warm-ups computed
        self.read_ahead = 0  # warm-ups that also read the window after its next move down
        self.background_stopped = 0  # background jobs stopped by a request or an edit
        self._histogram: list[int] = []  # [k]: target steps that produced k + 1 tokens
        self._ttft: deque[float] = deque(maxlen=window)
        self._tpot: deque[float] = deque(maxlen=window)

    def count(self, name: str, n: int = 1) -> None:
        """Add to one of the plain counters (requests, errors, clamped_positions...)."""
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def cancel(self, reason: str) -> None:
        with self._lock:
            self.cancelled[reason] = self.cancelled.get(reason, 0) + 1

    def generation_started(self) -> None:
        with self._lock:
            self.generations += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)

    def generation_ended(self) -> None:
        with self._lock:
            self.running -= 1

    def record(self, stats: Stats, *, text: str) -> None:
        """Fold one finished generation in (``text``: what was shown, only its emptiness
        is kept)."""
        with self._lock:
            self.completed += 1
            self.empty += not text
            self.fallbacks += stats.fallback is not None
            self.new_tokens += stats.new_tokens
            self.target_steps += stats.target_steps
            self.drafted += stats.drafted
            self.accepted += stats.accepted
            self.prompt_tokens += stats.prompt_tokens
            self.reused_tokens += stats.reused_tokens
            _add(self._position_drafted, stats.position_drafted)
            _add(self._position_accepted, stats.position_accepted)
            # Steps that accepted at least k+1 draft tokens = position_accepted[k], so
            # the steps that accepted exactly k are the difference of neighbours.
            pa = list(stats.position_accepted)
            at_least = [stats.target_steps, *pa, 0]
            _add(self._histogram, [at_least[k] - at_least[k + 1] for k in range(len(pa) + 1)])
            if stats.new_tokens:
                self._ttft.append(stats.ttft_s)
            if stats.new_tokens > 1:
                self._tpot.append(stats.tpot_s)

    def snapshot(self, prefix_cache: Any = None) -> dict[str, Any]:
        """The report, as JSON-ready data."""
        with self._lock:
            ttft, tpot = list(self._ttft), list(self._tpot)
            lookups = getattr(prefix_cache, "lookups", 0)
            hits = getattr(prefix_cache, "hits", 0)
            return {
                "uptime_s": round(time.monotonic() - self.started, 3),
                "requests": self.requests,
                "completed": self.completed,
                "empty": self.empty,
                "errors": self.errors,
                "fallbacks": self.fallbacks,
                "clamped_positions": self.clamped_positions,
                "cancellations": {"total": sum(self.cancelled.values()), **self.cancelled},
                "generations": {
                    "started": self.generations,
                    "running": self.running,
                    "max_running": self.max_running,
                },
                "acceptance": {
                    "mean_length": self.new_tokens / self.target_steps
                    if self.target_steps
                    else 0.0,
                    "new_tokens": self.new_tokens,
                    "target_steps": self.target_steps,
                    "drafted": self.drafted,
                    "accepted": self.accepted,
                    "position_rates": [
                        a / d if d else 0.0
                        for a, d in zip(self._position_accepted, self._position_drafted)
                    ],
                    "histogram": {str(k + 1): n for k, n in enumerate(self._histogram) if n},
                },
                "latency": {"ttft_s": _latency(ttft), "tpot_s": _latency(tpot)},
                "pipeline": {
                    "first_line_answers": self.first_line_answers,
                    "from_cache": self.from_cache,
                    "cache_waits": self.cache_waits,
                    "from_cache_rate": self.from_cache / self.requests if self.requests else 0.0,
                    "debounced": self.debounced,
                    "cold_prompts": self.cold_prompts,
                    "prefetches": self.prefetches,
                    "warmups": self.warmups,
                    "warmed_tokens": self.warmed_tokens,
                    "read_ahead": self.read_ahead,
                    "background_stopped": self.background_stopped,
                },
                "prefix_cache": {
                    "lookups": lookups,
                    "hits": hits,
                    "hit_rate": hits / lookups if lookups else 0.0,
                    "prompt_tokens": self.prompt_tokens,
                    "reused_tokens": self.reused_tokens,
                    "reused_fraction": self.reused_tokens / self.prompt_tokens
                    if self.prompt_tokens
                    else 0.0,
                },
            }


def _latency(samples: list[float]) -> dict[str, Any]:
    """p50, p95 and the sample count; the percentiles read 0.0 before any sample."""
    return {
        "p50": percentile(samples, 50) or 0.0,
        "p95": percentile(samples, 95) or 0.0,
        "n": len(samples),
    }


def _add(into: list[int], values: list[int]) -> None:
    while len(into) < len(values):
        into.append(0)
    for i, v in enumerate(values):
        into[i] += v
