"""What one benchmark configuration did on one prompt: the record every runner returns
(specd's, Hugging Face's and llama.cpp's alike)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Run:
    """What one configuration did on one prompt."""

    token_ids: list[int]
    total_s: float
    ttft_s: float
    #: (seconds since the previous event, tokens in this event) per event; the first
    #: event's gap is the TTFT.
    events: list[tuple[float, int]]
    steps: int
    drafted: int = 0
    accepted: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    peak_rss_kb: int | None = None
    peak_gpu_bytes: int | None = None
    #: CPU time this process spent on the run (all its threads). Unlike wall time it barely
    #: grows when other processes take the cores, so on a shared machine it is the steadier
    #: measure of the work a configuration does.
    cpu_s: float = 0.0
    fallback: str | None = None

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    def token_gaps(self) -> list[float]:
        """Seconds per output token after the first: an event of k tokens after a gap g
        contributes k samples of g / k."""
        out: list[float] = []
        for i, (gap, n) in enumerate(self.events):
            if i == 0 or n == 0:
                continue
            out += [gap / n] * n
        return out
