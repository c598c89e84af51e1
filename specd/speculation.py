"""The plugins serving one request: drafter, verifier and exit policy, every call guarded.

The engine's decode loop never calls a plugin itself; it asks :class:`Speculation` for a
draft, a verdict, and to pass on what a step committed. Each call goes through the
engine's :class:`~specd.isolation.PluginGuard`: when a plugin raises, returns something
malformed (checked here, before the target or the cache sees it) or overruns its time,
the request goes on with plain decoding, so its output is still the target's own, and
``Stats.fallback`` says why. :class:`PluginInstances` builds the instances an engine reuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import registry
from .api import DraftContext, Drafter, ExitPolicy, Verifier
from .draft import Draft, Verdict
from .errors import BadInputError, PluginError
from .healing import Constraint
from .isolation import PluginFailed, PluginGuard
from .ngram_index import Corpus
from .sampling import SamplingParams
from .stats import Stats

#: The drafter name that means plain decoding: no draft, no verifier, no policy budget.
NO_DRAFTER = "none"


@dataclass
class Request:
    """One generation as the engine runs it: the prompt, the plugins chosen for it (by
    name, and the instances built for it), and when it must stop."""

    prompt: list[int]
    params: SamplingParams
    drafter: str
    verifier: str
    exit_policy: str
    cancel: Callable[[], bool] | None = None
    deadline: float | None = None  # time.monotonic() value
    corpus: Corpus | None = None
    constraint: Constraint | None = None  # token healing: the text the output starts with
    # Plugin instances, built when the request is made (None: plain decoding).
    drafter_obj: Drafter | None = None
    verifier_obj: Verifier | None = None
    policy_obj: ExitPolicy | None = None

    def stop_reason(self) -> str:
        """ "cancelled" or "time" when the request must end now, else ""."""
        if self.cancel is not None and self.cancel():
            return "cancelled"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "time"
        return ""


def check_names(drafter: str, verifier: str | None, exit_policy: str) -> None:
    """Raise :class:`~specd.errors.UnknownPluginError` for a name nothing registered."""
    if drafter != NO_DRAFTER:
        registry.drafter_class(drafter)
    if verifier is not None:
        registry.verifier_class(verifier)
    registry.exit_policy_class(exit_policy)


def check_exact(drafter: str, verifier: str, params: SamplingParams) -> None:
    """Refuse a verifier that does not keep this decoding mode exact."""
    if drafter == NO_DRAFTER:
        return
    mode = "greedy" if params.greedy else "sampled"
    if mode not in registry.verifier_class(verifier).exact_for:
        fix = (
            "use a sampling verifier such as 'rejection', or --drafter none"
            if mode == "sampled"
            else "use 'greedy'"
        )
        raise BadInputError(
            f"verifier {verifier!r} is not exact for {mode} decoding "
            f"(temperature={params.temperature}); {fix}"
        )


class PluginInstances:
    """An engine's plugin instances: one drafter and one verifier per name, built on first
    use and shared by every request; a new exit policy for each request.

    A constructor that raises is isolated like any other plugin failure (the instance is
    None and the request decodes plainly); options it rejects are the user's error and
    raise :class:`~specd.errors.BadInputError`.

    :param drafter_options: constructor options per drafter name.
    """

    def __init__(self, guard: PluginGuard, drafter_options: dict[str, dict[str, Any]]) -> None:
        self.guard = guard
        self.drafter_options = drafter_options
        self._drafters: dict[str, Drafter] = {}
        self._verifiers: dict[str, Verifier] = {}

    def for_request(self, req: Request) -> None:
        """Build ``req``'s plugins now, so that bad options fail before it streams."""
        req.drafter_obj = self.drafter(req.drafter)
        if req.drafter_obj is not None:
            req.verifier_obj = self.verifier(req.verifier)
            req.policy_obj = self._build("exit_policies", req.exit_policy)

    def drafter(self, name: str) -> Drafter | None:
        if name == NO_DRAFTER or self.guard.disabled(registry.plugin_key("drafters", name)):
            return None
        if name not in self._drafters:
            drafter = self._build("drafters", name, self.drafter_options.get(name))
            if drafter is None:
                return None
            self._drafters[name] = drafter
        return self._drafters[name]

    def verifier(self, name: str) -> Verifier | None:
        if name not in self._verifiers:
            verifier = self._build("verifiers", name)
            if verifier is None:
                return None
            self._verifiers[name] = verifier
        return self._verifiers[name]

    def _build(self, kind: str, name: str, options: dict[str, Any] | None = None) -> Any:
        key = registry.plugin_key(kind, name)
        if self.guard.disabled(key):
            return None
        try:
            return registry.make(kind, name, options)
        except BadInputError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken constructor is isolated
            self.guard.fail(key, exc)
            return None


class DraftClock:
    """What one drafter's proposals cost on this host, in one-token steps, for the exit
    policy to weigh against what they save (``ExitPolicy.draft_cost``).

    The engine records every step: the seconds the drafter took (none for a plain step),
    the draft's size, and the seconds of the target's pass with its priced cost in steps.
    A step's time is each pass's time over its price; a call's cost, its time over that.
    Both are averages that follow the recent steps (weight ``ema`` for the latest), kept
    across requests: the same drafter on the same target costs the same.

    A request's first call is not timed: a drafter may catch up on the prompt there (the
    EAGLE head reads the prompt's features), a cost of the request, not of each call. A call
    that costs over ``OUTLIER`` times the recent average counts as that much: one slow call
    (a part of ``hybrid`` asked after a long wait, a page fault) does not price drafting out
    for the steps after it, while calls that keep costing more lift the average within a
    few of them.
    """

    OUTLIER = 4.0

    def __init__(self, ema: float = 0.2) -> None:
        self.ema = float(ema)
        self.step_s: float | None = None  # a one-token step's recent time
        self._calls: float | None = None  # a call's recent cost, in steps
        self._size = 0.0  # the recent draft size
        self._first = False  # the next call is a request's first

    def start(self) -> None:
        """A request starts: its first call is not timed."""
        self._first = True

    def _mix(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.ema * (new - old)

    def record(self, draft_s: float | None, size: int, pass_s: float, pass_steps: float) -> None:
        """One step: ``draft_s`` the drafter's seconds (None: a plain step), ``size`` its
        draft's nodes, ``pass_s`` the target pass's seconds, ``pass_steps`` its price."""
        if pass_s > 0 and pass_steps > 0:
            self.step_s = self._mix(self.step_s, pass_s / pass_steps)
        if draft_s is not None and self._first:
            self._first = False
        elif draft_s is not None and self.step_s:
            cost = draft_s / self.step_s
            if self._calls is not None and self._calls > 0:
                cost = min(cost, self.OUTLIER * self._calls)
            self._size = self._mix(None if self._calls is None else self._size, size)
            self._calls = self._mix(self._calls, cost)

    def cost(self, k: int) -> float:
        """A draft of ``k`` tokens' expected cost in one-token steps: the recent calls'
        cost scaled by ``(1 + k) / (1 + recent size)`` (0 before any call was timed)."""
        if self._calls is None:
            return 0.0
        return self._calls * (1 + k) / (1 + self._size)


class Speculation:
    """The plugins serving one request. When one fails, the request goes on with plain
    decoding: :meth:`draft` returns None and :meth:`verify` defers to the target.

    :param guard: runs every plugin call (the engine's, so health spans requests).
    :param req: the request, with its plugin instances and deadline.
    :param max_draft: the most draft nodes one step may verify.
    :param vocab_size: the target's vocabulary; draft tokens and q rows must fit it.
    :param stats: where the reason for falling back is recorded.
    """

    def __init__(
        self, guard: PluginGuard, req: Request, *, max_draft: int, vocab_size: int, stats: Stats
    ) -> None:
        self.guard = guard
        self.params = req.params
        self.deadline = req.deadline
        self.max_draft = max_draft
        self.vocab_size = vocab_size
        self.stats = stats
        self.drafter_key = registry.plugin_key("drafters", req.drafter)
        self.verifier_key = registry.plugin_key("verifiers", req.verifier)
        self.policy_key = registry.plugin_key("exit_policies", req.exit_policy)
        self.drafter = req.drafter_obj
        self.verifier = req.verifier_obj
        self.policy: ExitPolicy = req.policy_obj  # type: ignore[assignment]  # None only with drafter None
        parts = (
            (self.drafter_key, self.drafter),
            (self.verifier_key, self.verifier),
            (self.policy_key, self.policy),
        )
        missing = [key for key, obj in parts if obj is None]
        if req.drafter != NO_DRAFTER and missing:
            self._give_up(f"{', '.join(missing)} disabled or failed to start")
        elif req.params.max_tokens < 2:
            # no room for a draft beside the target's own token: the drafter is not started
            # (no head loaded, no features of the prompt computed for it)
            self.drafter = self.verifier = None

    @property
    def wants_hidden(self) -> bool:
        return self.drafter is not None and self.drafter.wants_hidden

    def _give_up(self, why: str) -> None:
        self.stats.fallback = self.stats.fallback or why
        self.drafter = None
        self.verifier = None

    def start(self, ctx: DraftContext) -> None:
        if self.drafter is None:
            return
        try:
            self.guard.call(self.policy_key, self.policy.start, self.max_draft)
            self.guard.call(self.drafter_key, self.drafter.start, ctx, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))

    def draft(self, ctx: DraftContext, room: int) -> Draft | None:
        """Ask the policy for a budget (at most ``max_draft`` and ``room``) and the drafter
        for at most that many nodes. :returns: a checked draft, or None for a plain step."""
        limit = min(self.max_draft, room)
        if self.drafter is None or limit <= 0:
            return None
        drafter = self.drafter
        vocab = self.vocab_size
        try:
            asked = int(self.guard.call(self.policy_key, self.policy.draft_budget))
            budget = min(limit, max(asked, 0))
            if budget <= 0:
                return None

            def propose() -> Draft | None:
                draft = drafter.propose(ctx, budget)
                if draft is None or len(draft) == 0:
                    return None
                check_draft(draft, budget, vocab)
                return draft

            return self.guard.call(self.drafter_key, propose, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))
            return None

    def verify(self, draft: Draft, p: torch.Tensor, generator: torch.Generator) -> Verdict | None:
        """The verifier's checked verdict on ``draft`` given ``p`` ``[N + 1, V]``, or None
        when there is no verifier (any more): the caller takes the target's own token."""
        verifier = self.verifier
        if verifier is None:
            return None

        def run() -> Verdict:
            verdict = verifier.verify(draft, p, self.params, generator)
            check_verdict(verdict, draft, p.shape[-1])
            return verdict

        try:
            return self.guard.call(self.verifier_key, run, deadline=self.deadline)
        except PluginFailed as e:
            self._give_up(str(e))
            return None

    def commit(self, ctx: DraftContext, new: list[int], depth: int, accepted: int) -> None:
        """Tell the policy how the step went (``depth``: the draft's deepest path, its length
        for a chain; a tree is judged like a chain of that length) and the drafter which
        tokens it committed."""
        if self.drafter is None:
            return
        try:
            self.guard.call(self.policy_key, self.policy.observe, depth, accepted)
            self.guard.call(
                self.drafter_key, self.drafter.commit, ctx, new, accepted, deadline=self.deadline
            )
        except PluginFailed as e:
            self._give_up(str(e))

    def finish(self, ctx: DraftContext) -> None:
        if self.drafter is None:
            return
        try:
            self.guard.call(self.drafter_key, self.drafter.finish, ctx, deadline=self.deadline)
        except PluginFailed:
            pass


def check_draft(draft: Draft, budget: int, vocab: int) -> None:
    """Raise :class:`PluginError` unless ``draft`` is a well-formed tree within ``budget``
    whose tokens and q rows fit the vocabulary."""
    n = len(draft.tokens)
    if n > budget:
        raise PluginError(f"draft of {n} nodes exceeds the budget of {budget}")
    if len(draft.parents) != n:
        raise PluginError("draft tokens and parents differ in length")
    for i, (t, par) in enumerate(zip(draft.tokens, draft.parents)):
        if not isinstance(t, int) or not 0 <= t < vocab:
            raise PluginError(
                f"draft token {t!r} at node {i} is outside the vocabulary [0, {vocab})"
            )
        if not -1 <= par < i:
            raise PluginError(f"draft node {i} has parent {par}; parents must precede children")
    if draft.q is not None:
        q = draft.q
        if q.shape != (n, vocab):
            raise PluginError(f"draft q has shape {tuple(q.shape)}, expected {(n, vocab)}")
        if not torch.isfinite(q).all() or (q < 0).any():
            raise PluginError("draft q has NaN, infinite or negative probabilities")
        if not torch.allclose(
            q.sum(-1).double().cpu(), torch.ones(n, dtype=torch.float64), atol=1e-3
        ):
            raise PluginError("draft q rows do not sum to 1")


def check_verdict(verdict: Verdict, draft: Draft, vocab: int) -> None:
    """Raise :class:`PluginError` unless the verdict's path is a root path of ``draft`` and
    its token is in the vocabulary."""
    prev = -1
    for node in verdict.path:
        if not 0 <= node < len(draft) or draft.parents[node] != prev:
            raise PluginError(
                f"verifier returned a path {verdict.path} that is not a root path of the draft"
            )
        prev = node
    if not 0 <= verdict.token < vocab:
        raise PluginError(f"verifier returned token {verdict.token} outside the vocabulary")
