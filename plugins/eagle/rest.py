"""When the ``eagle`` drafter, named alone, rests: a head whose drafts do not pay on this host
(what its accepted tokens save is less than what its nodes add to the verify pass and its
own calls cost, in one-token steps, as the exit policy prices them) still costs every
request the prompt's features (the prefill's last layer over its window) and every pass its
rows' features, and the exit policy, starting each request hopeful, pays for a few of its
drafts before it finds them wanting. A request that ends with its drafts at a loss makes the
next ones rest: they read no features and decode plainly. After :data:`REST_EVERY` - 1 of them
one drafts again, so that a head that starts to pay (another host, other code) comes back;
each such request that still ends at a loss doubles the next run of rests (3, 7, 15, up to
:data:`REST_MAX` - 1), so that a head that never pays here costs one request in a few dozen.
``hybrid`` decides the same for its head part itself (:mod:`.hybrid`)."""

from __future__ import annotations

from specd import DraftContext

#: A drafter priced out at the end of a request rests in the next REST_EVERY - 1 requests.
REST_EVERY = 4
#: The most requests from one that drafts to the next while drafts do not pay.
REST_MAX = 32
#: The weight of the latest draft in the averages.
EMA = 0.3


def next_run(run: int) -> int:
    """Requests to rest after one that drafted and ended at a loss, the last run of rests
    having been ``run`` requests (0: none since drafts last paid)."""
    return REST_EVERY - 1 if run == 0 else min(2 * run + 1, REST_MAX - 1)


class Rest:
    """What a drafter's drafts were worth lately (draft tokens accepted) against what they
    cost (in one-token steps), and whether the next request rests."""

    def __init__(self) -> None:
        self.won: float | None = None  # None: no priced draft yet
        self.price = 0.0
        self.rested = 0  # requests rested in the current run
        self.run = 0  # the current run's length (0: drafts paid at the last count)
        self.resting = False  # this request rests
        self.weighs = True  # this request's exit policy weighs drafts
        self.priced = 0  # drafts priced in this request
        self._pending: float | None = None  # the price of the draft now being verified

    def start(self, ctx: DraftContext) -> bool:
        """A request starts: :returns: whether it rests. One whose exit policy does not weigh
        drafts (``fixed``) never does, whatever the requests before it decided."""
        policy = ctx.exit_policy
        self.weighs = policy is not None and policy.prices_drafts
        if not self.weighs:
            self.resting = False
        return self.resting

    def drafted(self, ctx: DraftContext, nodes: int) -> None:
        """A draft of ``nodes`` nodes was proposed: its price, where the exit policy weighs
        drafts against their cost and passes are priced (none elsewhere: a drafter under
        ``fixed``, or on a target whose passes are not priced, never rests)."""
        policy = ctx.exit_policy
        self._pending = None
        if policy is None or not policy.prices_drafts or policy.pass_cost is None or nodes <= 0:
            return
        cost = policy.pass_cost(1 + nodes) - policy.pass_cost(1)
        if policy.draft_cost is not None:
            cost += policy.draft_cost(nodes)
        self._pending = cost
        self.priced += 1

    def committed(self, accepted: int) -> None:
        """The step after a priced draft accepted ``accepted`` of its tokens."""
        if self._pending is None:
            return
        price, self._pending = self._pending, None
        if self.won is None:
            self.won, self.price = float(accepted), price
            return
        self.won += EMA * (accepted - self.won)
        self.price += EMA * (price - self.price)

    def finished(self) -> bool:
        """A request ended: :returns: whether the next one rests."""
        self._pending = None
        priced, self.priced = self.priced, 0
        if not self.weighs or self.won is None or self.won >= self.price:
            self.rested, self.run, self.resting = 0, 0, False
            return False
        if self.resting:
            self.rested += 1
        elif priced:  # it drafted, at a loss: a run of rests, longer than the last
            self.rested, self.run = 0, next_run(self.run)
        # (a request that drafted nothing, too short or paused throughout: the next one drafts)
        self.resting = self.rested < self.run
        return self.resting
