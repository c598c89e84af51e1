"""The HTTP server's metrics, in Prometheus' text format (``GET /metrics``).

Counters only grow; the acceptance per draft position is given as the two counters it is
made of (``drafted`` and ``accepted`` per position), so a rate over any window is exact.
Aggregates only: no request carries text or code into a metric.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence

from specd import Stats

#: Latency buckets in seconds: from a cached keystroke to a long block.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        out.append(f"{name}_sum {self.sum:.6f}")
        out.append(f"{name}_count {self.count}")
        return out


class HttpMetrics:
    """What ``GET /metrics`` reports. Written from the event loop and the generation
    thread, so every update holds one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status)
        self.generations: Counter[str] = Counter()  # finish reason
        self.totals: Counter[str] = Counter()
        self.position_drafted: list[int] = []
        self.position_accepted: list[int] = []
        self.waiting = 0
        self.running = 0
        self.request_s = Histogram(LATENCY_BUCKETS)
        self.ttft_s = Histogram(LATENCY_BUCKETS)
        self.tpot_s = Histogram(TOKEN_TIME_BUCKETS)

    def request(self, endpoint: str, status: int, seconds: float | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if seconds is not None:
                self.request_s.observe(seconds)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.totals[name] += n

    def queue(self, *, waiting: int, running: int) -> None:
        with self._lock:
            self.waiting, self.running = waiting, running

    def generation(self, stats: Stats) -> None:
        """One generation ended (finished, stopped, cancelled or out of time)."""
        with self._lock:
            self.generations[stats.finish_reason or "unknown"] += 1
            t = self.totals
            t["prompt_tokens"] += stats.prompt_tokens
            t["reused_tokens"] += stats.reused_tokens
            t["generated_tokens"] += stats.new_tokens
            t["target_steps"] += stats.target_steps
            t["drafted"] += stats.drafted
            t["accepted"] += stats.accepted
            _add(self.position_drafted, stats.position_drafted)
            _add(self.position_accepted, stats.position_accepted)
            if stats.new_tokens:
                self.ttft_s.observe(stats.ttft_s)
            if stats.new_tokens > 1:
                self.tpot_s.observe(stats.tpot_s)

    def render(self) -> str:
        with self._lock:
            out: list[str] = []

            def family(name: str, kind: str, help_text: str) -> None:
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {kind}")

            family("specd_http_requests_total", "counter", "HTTP requests by endpoint and status")
            for (endpoint, status), n in sorted(self.requests.items()):
                out.append(
                    f'specd_http_requests_total{{endpoint="{endpoint}",code="{status}"}} {n}'
                )
            family("specd_generations_total", "counter", "generations by finish reason")
            for reason, n in sorted(self.generations.items()):
                out.append(f'specd_generations_total{{finish_reason="{reason}"}} {n}')
            for name, help_text in _TOTALS:
                family(f"specd_{name}_total", "counter", help_text)
                out.append(f"specd_{name}_total {self.totals[name]}")
            family("specd_position_drafted_total", "counter", "draft tokens verified per position")
            for i, n in enumerate(self.position_drafted, 1):
                out.append(f'specd_position_drafted_total{{position="{i}"}} {n}')
            family("specd_position_accepted_total", "counter", "draft tokens accepted per position")
            for i, n in enumerate(self.position_accepted, 1):
                out.append(f'specd_position_accepted_total{{position="{i}"}} {n}')
            family("specd_position_acceptance", "gauge", "acceptance rate per draft position")
            for i, (d, a) in enumerate(zip(self.position_drafted, self.position_accepted), 1):
                out.append(f'specd_position_acceptance{{position="{i}"}} {a / d if d else 0.0:.6f}')
            family("specd_queue_waiting", "gauge", "requests waiting for the engine")
            out.append(f"specd_queue_waiting {self.waiting}")
            family("specd_generating", "gauge", "generations running (0 or 1)")
            out.append(f"specd_generating {self.running}")
            for name, hist, help_text in (
                ("specd_request_seconds", self.request_s, "request latency"),
                ("specd_ttft_seconds", self.ttft_s, "time to first token"),
                ("specd_tpot_seconds", self.tpot_s, "time per output token after the first"),
            ):
                family(name, "histogram", help_text)
                out.extend(hist.lines(name))
            return "\n".join(out) + "\n"


_TOTALS = (
    ("prompt_tokens", "prompt tokens"),
    ("reused_tokens", "prompt tokens taken from the prefix cache"),
    ("generated_tokens", "tokens generated"),
    ("target_steps", "target forward passes while decoding"),
    ("drafted", "draft tokens verified"),
    ("accepted", "draft tokens accepted"),
    ("disconnects", "clients that went away before their answer was complete"),
    ("rejected_queue_full", "requests refused with 503 because the queue was full"),
)


def _add(into: list[int], values: list[int]) -> None:
    while len(into) < len(values):
        into.append(0)
    for i, v in enumerate(values):
        into[i] += v
