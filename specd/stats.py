"""Per-request statistics, with the JSON field names other tools rely on, and the one
percentile every report uses."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (``q`` in [0, 100]) of ``values``, in any order; None when
    there are none.

    Linear interpolation between the two nearest ranks (numpy's default, method 7 of
    Hyndman and Fan): with the n values sorted as x[0] <= ... <= x[n-1], the percentile
    sits at fractional index h = (n - 1) * q / 100 and is
    x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). So q = 0 is the
    minimum, q = 100 the maximum, and q = 50 the usual median.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    xs = sorted(values)
    if not xs:
        return None
    h = (len(xs) - 1) * q / 100
    lo = int(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])


@dataclass
class Stats:
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    total_s: float = 0.0
    reused_tokens: int = 0
    drafter: str | None = None
    fallback: str | None = None
    finish_reason: str = ""
    step_s: list[float] = field(default_factory=list, repr=False)

    @property
    def mean_acceptance_length(self) -> float:
        """New tokens per target step: 1.0 for plain decoding."""
        return self.new_tokens / self.target_steps if self.target_steps else 0.0

    @property
    def position_acceptance(self) -> list[float]:
        """For each draft position, the fraction of drafted tokens there that were accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first."""
        if self.new_tokens <= 1:
            return 0.0
        return max(self.total_s - self.ttft_s, 0.0) / (self.new_tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def record_step(self, drafted: int, depth: int, accepted: int) -> None:
        """One target step verified ``drafted`` nodes reaching ``depth`` (== drafted for a
        chain) and accepted ``accepted`` of them."""
        self.target_steps += 1
        self.drafted += drafted
        self.accepted += accepted
        while len(self.position_drafted) < depth:
            self.position_drafted.append(0)
            self.position_accepted.append(0)
        for i in range(depth):
            self.position_drafted[i] += 1
        for i in range(accepted):
            self.position_accepted[i] += 1

    def as_json(self) -> dict:
        d = asdict(self)
        d.pop("step_s")
        d.update(
            mean_acceptance_length=self.mean_acceptance_length,
            position_acceptance=self.position_acceptance,
            tpot_s=self.tpot_s,
            tokens_per_s=self.tokens_per_s,
        )
        return d
