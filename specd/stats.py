"""Per-request statistics, with the JSON field names other tools rely on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
