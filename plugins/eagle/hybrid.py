"""The ``hybrid`` drafter: several drafters, one draft, one target pass.

The parts are registered drafters named in order (default ``ngram,eagle``), built through
:func:`specd.make_drafter`, so any installed drafter can take part. Each step asks them in
order, each with what is left of the budget: the first draft that reaches ``min_len`` nodes
ends the asking (when the context repeats, the n-gram continuation is long and the head is
not run). Deterministic drafts asked so far are merged into one token tree, earlier parts'
nodes first, equal paths shared; a draft that carries q (sampled decoding) cannot share a
tree with others, so it is used alone. Every part hears of every request
start, commit and finish, so each keeps its own state in step.

Parts named in :data:`PART_DEFAULTS` get those options unless given others, when parts come
after them: the n-gram part matches at least two tokens, so a one-token match (a weak
guess) leaves the step to the parts after it. Where no part drafts a step (those after it
priced out, or drafting nothing), such a part is asked again for its weak guess
(``propose_weak``), as it would have drafted alone.

A part that cannot draft for the target (its ``start`` raises :class:`DrafterUnavailable`,
e.g. ``eagle`` for a model with no head) is dropped for good, the reason logged once, and
the rest draft as if named alone: ``hybrid`` on a model without a head drafts as ``ngram``.

A part after the first is asked only while it pays on this host: its accepted draft tokens
per call must outweigh what its nodes add to the verify pass (the target's pass prices,
``Target.pass_cost``) and its own time in target steps (timed here, against the time of the
steps between two proposals). The exit policy prices ``hybrid`` as
one drafter, so a head whose drafts do not pay would otherwise make it pause the n-gram
drafts too. A part priced out is still asked after :data:`PROBE_EVERY` steps, so that it
comes back where it starts to pay; each probe that leaves it priced out doubles the wait
(up to :data:`PROBE_MAX` steps), and a call that wins its price sets it back, so that a head
that does not pay on this host costs a probe every few requests, not one every few steps.

A part that reads the target's features (``eagle``) costs a request more than its calls:
the prefill computes the prompt's features for it (the last layer over its window of
prompt tokens) and every verify pass returns its rows' features. While such a part is
priced out at the end of a request it rests: the next requests read no features and draft
without it. After :data:`REST_EVERY` - 1 of them one reads them and asks it at its first step,
so that it comes back where it starts to pay; each such request that ends with it still priced
out doubles the next run of rests (up to :data:`REST_MAX` - 1), as for ``eagle`` alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar

from specd import (
    MAX_DRAFT,
    BadInputError,
    Draft,
    DraftContext,
    Drafter,
    DrafterUnavailable,
    checks,
    make_drafter,
)

from . import rest

log = logging.getLogger("specd.plugins")

#: The most parts one ``hybrid`` combines.
MAX_PARTS = 8
#: Options of parts that differ from the part's own defaults inside ``hybrid``.
PART_DEFAULTS: dict[str, dict[str, Any]] = {"ngram": {"min_n": 2}}
#: Options every part of these names gets unless given others, wherever it stands: hybrid
#: decides itself when its head part rests (:meth:`HybridDrafter._rest`), and the head drafts
#: only the nodes whose probability covers what they add to the verify pass (a call that
#: drafts nothing is priced as one: its time for no tokens).
PART_ALWAYS: dict[str, dict[str, Any]] = {"eagle": {"rest": False, "min_prob": "price"}}
#: A part priced out is asked again after this many steps without it, then after twice as
#: many each time it still does not pay, up to PROBE_MAX.
PROBE_EVERY = 8
PROBE_MAX = 128
#: A feature-reading part priced out rests in the next REST_EVERY - 1 requests, then in runs
#: twice as long each time it is still priced out, up to REST_MAX - 1 (as the ``eagle``
#: drafter named alone does, :mod:`.rest`).
REST_EVERY = rest.REST_EVERY
REST_MAX = rest.REST_MAX
#: The weight of the latest call in a part's record and of the latest step in the step time.
EMA = 0.3
#: Seconds, for timing parts and steps (tests set a clock of their own).
clock = time.perf_counter


class Record:
    """What a part after the first has been worth lately, per call: its accepted draft
    tokens, the nodes it drafted, the seconds it took (averages following the recent calls)."""

    def __init__(self) -> None:
        self.tokens: float | None = None  # None: never asked yet
        self.nodes = 0.0
        self.seconds = 0.0
        self.skipped = 0  # steps it was priced out since it was last asked
        self.rested = 0  # requests rested in the current run
        self.run = 0  # the current run's length (0: it paid at the end of the last request)
        self.asked = False  # it was asked in this request
        self.wait = PROBE_EVERY  # steps priced out before it is asked again
        self.price = 0.0  # what its last call had to win, in steps

    def add(self, tokens: float, nodes: int, seconds: float) -> None:
        self.asked = True
        if self.tokens is None:
            self.tokens, self.nodes, self.seconds = tokens, float(nodes), seconds
            return
        self.tokens += EMA * (tokens - self.tokens)
        self.nodes += EMA * (nodes - self.nodes)
        self.seconds += EMA * (seconds - self.seconds)

    def probed(self, tokens: float) -> None:
        """A call that won its price brings the next probe back to PROBE_EVERY steps (the
        average may need more than one such call to catch up)."""
        if tokens >= self.price:
            self.wait = PROBE_EVERY


class HybridDrafter(Drafter):
    """:param drafters: comma-separated drafter names, asked in this order.
    :param min_len: a draft at least this long ends the asking.
    :param part_options: ``PART.KEY=VALUE`` constructor options of the parts, e.g.
        ``eagle.head=HEAD`` (``--drafter-option eagle.head=HEAD``)."""

    name = "hybrid"
    conformance_options: ClassVar[dict[str, object]] = {"eagle.head": "random"}

    def __init__(
        self,
        drafters: str = "ngram,eagle",
        min_len: int = 2,
        **part_options: Any,
    ) -> None:
        names = [n.strip() for n in str(drafters).split(",") if n.strip()]
        if not names or self.name in names:
            raise BadInputError(f"hybrid needs other drafters to combine, got {drafters!r}")
        if len(set(names)) < len(names) or len(names) > MAX_PARTS:
            raise BadInputError(
                f"hybrid option drafters={drafters!r}: expected up to {MAX_PARTS} different "
                "drafter names"
            )
        given: dict[str, dict[str, Any]] = {n: {} for n in names}
        for key, value in part_options.items():
            part, _, option = key.partition(".")
            if part not in given or not option:
                raise BadInputError(
                    f"hybrid option {key!r}: expected PART.KEY with PART one of {', '.join(names)}"
                )
            given[part][option] = value
        self._given = given
        self.min_len = checks.integer("hybrid", "min_len", min_len, hi=MAX_DRAFT)
        self._build(names)

    def _build(self, names: list[str]) -> None:
        """(Re)build the parts ``names``, in this order, with their options."""
        self.names = names
        self.records = [Record() for _ in names]  # the first part's is never read
        self._step_s: float | None = None  # a one-token target step's recent seconds
        self._last: tuple[float, float, int] | None = None  # start, seconds, nodes of a proposal
        self._asked: list[tuple[int, int, float]] = []  # the last proposal's parts: i, nodes, s
        # the last proposal's parts after the first that were priced out / asked to probe /
        # asked as paying: their records move on at the commit, once a step, however often
        # propose is called
        self._skipped: set[int] = set()
        self._probes: set[int] = set()
        self._paid: set[int] = set()
        self._commits = 0
        self._resting: set[int] = set()  # feature-reading parts left out of this request
        last = len(names) - 1
        self.parts = [
            make_drafter(n, self._options(n, i == last) or None) for i, n in enumerate(names)
        ]
        # parts holding PART_DEFAULTS' options, asked for their weak guess where none drafts
        self._weak = [
            i
            for i, n in enumerate(names)
            if i != last
            and not set(PART_DEFAULTS.get(n, {})) & set(self._given[n])
            and callable(getattr(self.parts[i], "propose_weak", None))
        ]
        self.reads_cache = any(p.reads_cache for p in self.parts)
        self._features()

    def _features(self) -> None:
        """Whether the next request reads the target's features, and how many of the
        prompt's: what the parts that do not rest read (the engine reads both as a request
        starts)."""
        reading = [p for i, p in enumerate(self.parts) if p.wants_hidden and i not in self._resting]
        self.wants_hidden = bool(reading)
        # the prompt's last features its parts read: the most any reads (None: all)
        rows = [getattr(p, "feature_rows", None) for p in reading]
        self.feature_rows = None if None in rows or not rows else max(rows)  # type: ignore[type-var]

    def _options(self, name: str, last: bool) -> dict[str, Any]:
        given = self._given[name]
        opts = dict(PART_ALWAYS.get(name, {})) | ({} if last else PART_DEFAULTS.get(name, {}))
        if name == "ngram" and "max_n" in given and "min_n" in opts:
            # the default never contradicts what was given: ngram.max_n=1 matches one token
            opts["min_n"] = min(opts["min_n"], checks.integer("ngram", "max_n", given["max_n"]))
        return opts | given

    def start(self, ctx: DraftContext) -> None:
        self._last, self._asked, self._commits = None, [], 0  # the records outlast requests
        self._skipped, self._probes, self._paid = set(), set(), set()
        hidden = ctx.hidden
        i = 0
        while i < len(self.parts):
            ctx.hidden = hidden  # each part may take it
            try:
                self.parts[i].start(ctx)
            except DrafterUnavailable as e:
                rest = self.names[:i] + self.names[i + 1 :]
                if not rest:
                    raise
                log.warning("hybrid drafts without %s: %s", self.names[i], e)
                self._build(rest)  # the others as if named alone, started afresh
                i = 0
                continue
            i += 1
        ctx.hidden = None

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        if len(self.parts) == 1:
            return self.parts[0].propose(ctx, budget)
        start = clock()
        self._time_step(ctx, start)
        drafts: list[Draft] = []
        self._asked, self._skipped, self._probes, self._paid = [], set(), set(), set()
        left = budget
        for i, part in enumerate(self.parts):
            if left <= 0:
                break
            if i in self._resting:  # no features this request: it cannot draft
                continue
            if i > 0 and not self._pays(ctx, i, budget - left):
                self._skipped.add(i)
                continue
            t = clock()
            draft = part.propose(ctx, left)
            nodes = 0 if draft is None else len(draft)
            # a call's price is what it costs asked at every step: not a catch-up on the
            # entries of the steps it was priced out of (which a probe pays once)
            self._asked.append((i, nodes, clock() - t - getattr(part, "catch_up_s", 0.0)))
            if draft is None or nodes == 0:
                continue
            if not draft.deterministic:
                self._asked = []  # used alone, priced by the exit policy alone
                return draft  # the parts asked before it drafted too little
            drafts.append(draft)
            left -= nodes
            if nodes >= self.min_len:
                break
        if not drafts:  # no part drafted: a weak guess, as the part alone would make it
            for i in self._weak:
                t = clock()
                draft = self.parts[i].propose_weak(ctx, budget)  # type: ignore[attr-defined]
                nodes = 0 if draft is None else len(draft)
                self._asked.append((i, nodes, clock() - t))
                if draft is not None and nodes:
                    drafts.append(draft)
                    break
        out = merge(drafts, budget) if drafts else None
        self._last = (start, clock() - start, 0 if out is None else len(out))
        return out

    def _time_step(self, ctx: DraftContext, now: float) -> None:
        """The seconds of the target step between the last proposal and this one, over
        that pass's price: one step's time (only where one step came between them)."""
        last, commits = self._last, self._commits
        self._commits = 0
        if last is None or commits != 1 or ctx.target is None:
            return
        start, drafting, nodes = last
        step = (now - start - drafting) / ctx.target.pass_cost(1 + nodes)
        if step > 0:
            self._step_s = (
                step if self._step_s is None else self._step_s + EMA * (step - self._step_s)
            )

    def _pays(self, ctx: DraftContext, i: int, nodes_before: int) -> bool:
        """Whether part ``i`` is worth asking after ``nodes_before`` nodes drafted: its
        accepted draft tokens per call against the pass width its nodes add and its own time,
        in one-token steps (asked where never asked, and to probe after ``rec.wait`` steps
        without it). The same answer for every call on one step: the record moves on at the
        commit (:meth:`_step_records`)."""
        rec = self.records[i]
        if rec.tokens is None or ctx.target is None:
            return True
        cost = ctx.target.pass_cost(1 + nodes_before + round(rec.nodes)) - ctx.target.pass_cost(
            1 + nodes_before
        )
        if self._step_s:
            cost += rec.seconds / self._step_s
        rec.price = cost
        if rec.tokens >= cost:
            self._paid.add(i)
            return True
        if rec.skipped >= rec.wait:  # a probe
            self._probes.add(i)
            return True
        return False

    def _step_records(self) -> None:
        """A step's move of the records of the parts after the first: one priced out counts
        the step; one asked to probe waits twice as long for the next probe (unless its call
        wins its price, :meth:`Record.probed`); one asked because it pays waits the least."""
        for i in range(1, len(self.records)):
            rec = self.records[i]
            if i in self._skipped:
                rec.skipped += 1
            elif i in self._probes:
                rec.skipped, rec.wait = 0, min(2 * rec.wait, PROBE_MAX)
            elif i in self._paid:
                rec.skipped, rec.wait = 0, PROBE_EVERY
        self._skipped, self._probes, self._paid = set(), set(), set()

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        self._commits += 1
        self._step_records()
        # the accepted draft tokens past the nodes of the parts asked before each part:
        # merged in the order asked, a part's nodes follow theirs
        before = 0
        for i, nodes, seconds in self._asked:
            if i > 0:
                won = max(0, min(accepted - before, nodes))
                self.records[i].add(won, nodes, seconds)
                self.records[i].probed(won)
            before += nodes
        self._asked = []
        hidden = ctx.hidden
        for part in self.parts:
            ctx.hidden = hidden
            part.commit(ctx, new_tokens, accepted)
        ctx.hidden = None

    def finish(self, ctx: DraftContext) -> None:
        for part in self.parts:
            part.finish(ctx)
        self._rest()

    def _rest(self) -> None:
        """After a request: a feature-reading part after the first that ends it priced out
        rests in the next requests (a run of them, longer after each request that asks it
        again and ends with it still priced out), then reads the features and is asked at
        the first step of one; one that pays reads them in every request."""
        rested, self._resting = self._resting, set()
        for i, part in enumerate(self.parts):
            rec = self.records[i]
            if i == 0 or not part.wants_hidden:
                continue
            asked, rec.asked = rec.asked, False
            if rec.tokens is None or rec.tokens >= rec.price:
                rec.rested = rec.run = 0
                continue
            if i in rested:
                rec.rested += 1
            elif asked:  # it read features and was asked this request, and ends it priced out
                rec.rested, rec.run = 0, rest.next_run(rec.run)
            # (read but never asked, the n-gram drafts long enough: the next request probes)
            if rec.rested < rec.run:
                self._resting.add(i)
            else:
                rec.skipped = rec.wait  # a probe at the first step it can draft
        self._features()


def merge(drafts: Sequence[Draft], budget: int) -> Draft | None:
    """One deterministic token tree of at most ``budget`` nodes holding the drafts' paths;
    nodes with the same parent and token are shared. Earlier drafts keep their nodes first."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for draft in drafts:
        mapped: list[int | None] = []
        for t, p in zip(draft.tokens, draft.parents):
            parent = -1 if p < 0 else mapped[p]
            if parent is None:  # its parent did not fit
                mapped.append(None)
                continue
            key = (parent, t)
            if key not in node_of and len(tokens) < budget:
                node_of[key] = len(tokens)
                tokens.append(t)
                parents.append(parent)
            mapped.append(node_of.get(key))
    return Draft(tokens=tokens, parents=parents) if tokens else None
