"""Exit policies: how many tokens to draft, and when to stop speculating.

``fixed`` always asks for the full budget. ``adaptive`` tracks acceptance: it grows the
budget when drafts are accepted whole, shrinks it when they are not, falls back to plain
decoding when acceptance collapses, and probes again after a while. Within that budget it
drafts the length that yields the most tokens per unit of target time on this host
(``ExitPolicy.pass_cost``): a draft of ``k`` tokens is verified by a pass over ``k + 1``,
which costs ``pass_cost(k + 1)`` one-token steps, and yields ``1 + a1 + a1*a2 + ...``
tokens, ``aj`` the recent rate at which draft position ``j`` was accepted once the ones
before it were. Drafting is paid for too (``ExitPolicy.draft_cost``: a drafter with a
network of its own costs time a lookup does not). Where a wide pass costs about a step that
is the whole budget; where it costs several, a shorter draft; where no draft is worth its
cost against a plain step's one token, plain steps, with a short probe now and then: after
``probe_every`` plain steps, then twice as many after each probe whose draft is rejected and
leaves drafting at a loss (up to ``probe_max``), so that a drafter that does not pay on this
host costs a probe every few dozen steps. Each request starts hopeful, since its text may
repeat where the last one's did not. It only chooses lengths: the output is the verifier's.
"""

from __future__ import annotations

from specd import MAX_DRAFT, ExitPolicy, checks, hookimpl

#: The longest wait between probes, in steps.
MAX_PROBE = 1 << 16


class FixedPolicy(ExitPolicy):
    """:param budget: tokens to draft per step (capped by the engine's max_draft).
    :param min_confidence: drafters that report confidence stop below this."""

    name = "fixed"

    def __init__(self, budget: int | None = None, min_confidence: float = 0.0) -> None:
        self.budget = checks.optional_integer("fixed", "budget", budget, lo=0, hi=MAX_DRAFT)
        self.min_confidence = checks.number("fixed", "min_confidence", min_confidence, lo=0, hi=1)
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
    :param probe_every: plain steps between probes while paused.
    :param probe_max: the longest wait between probes where no draft pays (priced passes).
    :param ema: the weight of the latest step in the acceptance rates it tracks."""

    name = "adaptive"
    prices_drafts = True

    def __init__(
        self,
        start_budget: int = 4,
        min_confidence: float = 0.3,
        collapse: float = 0.1,
        probe_every: int = 8,
        probe_max: int = 64,
        ema: float = 0.3,
    ) -> None:
        self.start_budget = checks.integer("adaptive", "start_budget", start_budget, hi=MAX_DRAFT)
        self.min_confidence = checks.number(
            "adaptive", "min_confidence", min_confidence, lo=0, hi=1
        )
        self.collapse = checks.number("adaptive", "collapse", collapse, lo=0, hi=1)
        self.probe_every = checks.integer("adaptive", "probe_every", probe_every, hi=MAX_PROBE)
        # a longer wait between probes than the default's never shortens the longest
        probe_max = checks.integer("adaptive", "probe_max", probe_max, hi=MAX_PROBE)
        self.probe_max = max(self.probe_every, probe_max)
        self.ema = checks.number("adaptive", "ema", ema, lo=0, hi=1, above=True)
        self._max = 0
        self._budget = 0
        self._rate = 1.0
        self._paused_for = 0
        self._accept: list[float] = []  # per draft position, given the ones before it
        self._token_rate = 1.0  # per draft token tried, given the ones before it
        self._asked: int | None = None  # the last budget chosen by price (None: a probe)
        self._wait = self.probe_every  # plain steps before a probe where no draft pays
        self._probing = False  # the last budget was a probe
        self._probe_whole = False  # and its draft was accepted whole

    def start(self, max_budget: int) -> None:
        self._max = max_budget
        self._budget = min(self.start_budget, max_budget)
        self._rate = 1.0
        self._paused_for = 0
        self._accept = [1.0] * max_budget  # untried positions: hoped for, then measured
        self._token_rate = 1.0
        self._wait = self.probe_every
        self._asked = None
        self._probing = False
        self._probe_whole = False

    def draft_budget(self) -> int:
        if self._paused_for > 0:
            self._paused_for -= 1
            self._asked = None
            if self._paused_for > 0:
                return 0
            self._probing = True
            return max(1, min(2, self._max))  # probe
        probed, self._probing = self._probing, False
        self._asked = self._priced(self._budget)
        if self._asked == 0:  # no draft pays here now: plain steps, then a probe
            if probed and not self._probe_whole:  # a probe rejected: wait longer for the next
                self._wait = min(2 * self._wait, self.probe_max)
            elif probed:  # accepted whole, yet drafting still at a loss: the shortest wait
                self._wait = self.probe_every
            self._paused_for = self._wait
        else:
            self._wait = self.probe_every
        return self._asked

    def _priced(self, budget: int) -> int:
        """The draft length up to ``budget`` with the most expected tokens per unit of
        time, the draft's own included (the shorter one on a tie); 0 where a plain step's
        one token per step beats them all; ``budget`` where passes are not priced."""
        if self.pass_cost is None:
            return budget
        drafting = self.draft_cost or (lambda k: 0.0)
        best_k, best, expected, reach = 0, 1.0 / self.pass_cost(1), 1.0, 1.0
        for k in range(1, budget + 1):
            reach *= self._accept[k - 1]  # P(the first k draft tokens are all accepted)
            expected += reach  # tokens a k-token draft yields, the verifier's own included
            value = expected / (self.pass_cost(k + 1) + drafting(k))
            if value > best:
                best_k, best = k, value
        return best_k

    def continue_drafting(self, position: int, confidence: float) -> bool:
        return confidence >= self.min_confidence

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self._probe_whole = self._probing and accepted == drafted
        # Positions tried: the accepted ones and the first rejected (none after it was
        # judged). The others drift toward the rate of the tried ones, so that a position
        # not drafted for a while is judged by recent acceptance, not by its last outcome.
        tried = min(accepted + 1, drafted)
        self._token_rate += self.ema * (
            accepted / (accepted + (tried > accepted)) - self._token_rate
        )
        for j in range(len(self._accept)):
            rate = (1.0 if j < accepted else 0.0) if j < tried else self._token_rate
            self._accept[j] += self.ema * (rate - self._accept[j])
        rate = accepted / drafted
        self._rate = (1 - self.ema) * self._rate + self.ema * rate
        if accepted == drafted:
            self._budget = min(self._max, max(self._budget, drafted) * 2)
        elif accepted < drafted // 2:
            self._budget = max(1, (self._budget + 1) // 2)
        if accepted < drafted and self._asked is not None:
            # the priced choice may have been shorter than the budget; a rejection must not
            # let the next one grow past it (the rates of the accepted positions just rose)
            self._budget = min(self._budget, self._asked)
        if self._rate < self.collapse:
            self._paused_for = self.probe_every + 1  # probe_every plain steps, then a probe
            self._rate = self.collapse  # a probe's success lifts it back above the line


@hookimpl
def specd_register_exit_policies(register):
    register(FixedPolicy)
    register(AdaptivePolicy)
