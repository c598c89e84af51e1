"""Exit policies: how many tokens to draft, and when to stop speculating.

``fixed`` always asks for the full budget. ``adaptive`` tracks acceptance: it grows the
budget when drafts are accepted whole, shrinks it when they are not, falls back to plain
decoding when acceptance collapses, and probes again after a while.
"""

from __future__ import annotations

from specd import ExitPolicy, hookimpl


class FixedPolicy(ExitPolicy):
    """:param budget: tokens to draft per step (capped by the engine's max_draft).
    :param min_confidence: drafters that report confidence stop below this."""

    name = "fixed"

    def __init__(self, budget: int | None = None, min_confidence: float = 0.0) -> None:
        self.budget = budget
        self.min_confidence = float(min_confidence)
        self._max = 0

    def start(self, max_budget: int) -> None:
        self._max = max_budget

    def draft_budget(self) -> int:
        return self._max if self.budget is None else min(self.budget, self._max)

    def continue_drafting(self, position: int, confidence: float) -> bool:
        return confidence >= self.min_confidence


class AdaptivePolicy(ExitPolicy):
    """:param start_budget: first budget. :param min_confidence: stop drafting below it.
    :param collapse: acceptance rate (EMA) under which speculation pauses.
    :param probe_every: plain steps between probes while paused."""

    name = "adaptive"

    def __init__(
        self,
        start_budget: int = 4,
        min_confidence: float = 0.3,
        collapse: float = 0.1,
        probe_every: int = 8,
        ema: float = 0.3,
    ) -> None:
        self.start_budget = int(start_budget)
        self.min_confidence = float(min_confidence)
        self.collapse = float(collapse)
        self.probe_every = int(probe_every)
        self.ema = float(ema)
        self._max = 0
        self._budget = 0
        self._rate = 1.0
        self._paused_for = 0

    def start(self, max_budget: int) -> None:
        self._max = max_budget
        self._budget = min(self.start_budget, max_budget)
        self._rate = 1.0
        self._paused_for = 0

    def draft_budget(self) -> int:
        if self._paused_for > 0:
            self._paused_for -= 1
            return 0 if self._paused_for > 0 else max(1, min(2, self._max))  # probe
        return self._budget

    def continue_drafting(self, position: int, confidence: float) -> bool:
        return confidence >= self.min_confidence

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        rate = accepted / drafted
        self._rate = (1 - self.ema) * self._rate + self.ema * rate
        if accepted == drafted:
            self._budget = min(self._max, max(self._budget, drafted) * 2)
        elif accepted < drafted // 2:
            self._budget = max(1, (self._budget + 1) // 2)
        if self._rate < self.collapse:
            self._paused_for = self.probe_every + 1  # probe_every plain steps, then a probe
            self._rate = self.collapse  # a probe's success lifts it back above the line


@hookimpl
def specd_register_exit_policies(register):
    register(FixedPolicy)
    register(AdaptivePolicy)
