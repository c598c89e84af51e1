"""The drafter's own word: is each drafted token a draw from the q the drafter reported?

The rejection verifier is exact only if ``Draft.q`` is the distribution the token really
came from. The engine-level law checks see a dishonest q only through the whole
draft-verify loop, where a moderate error is diluted; this check asks the drafter directly.
With the context held fixed (one request on the conformance target, stopped at its first
draft), the drafter's ``propose`` is called many times, each with a fresh generator, and
every drafted token is compared with the row its own draft reported for it:

- the token must have positive probability under its row (one draw outside it fails);
- per group of nodes (depth in the tree, and rank among siblings), the observed token counts
  are G-tested against the expected counts, the sum of the reported rows. At the first depth
  the rows are all the same, so that is the exact multinomial test; deeper down each row is
  conditioned on the tokens drawn above it, and summing them keeps every draw compared with
  its own condition (the test is then conservative: the counts vary less than a multinomial);
- the groups' statistics are also summed, with their degrees of freedom: a q that is wrong at
  every node is seen there sooner than in any one group;
- a draft that reports ``q = None`` claims to be deterministic: every call must return the
  same draft, whatever the generator;
- at temperature 0 the draft must be deterministic too (``q = None``, or one-hot rows).

It runs at several sampling settings (temperatures below and above 1, top-k, top-p and their
combinations) and in two contexts: the target's own cycle, where copying drafters draft, and
a prompt with no repeated token, where they have nothing to copy and ``hybrid`` asks its head.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..api import DraftContext
from ..draft import Draft
from ..errors import PluginError
from ..sampling import SamplingParams, make_generator
from ..speculation import check_draft
from .engine_checks import EngineBench, captured_errors
from .engine_scenarios import conformance_prompt
from .gtest import ALPHA, GTest, chi2_sf, g_test
from .results import Result

PROPERTY = "drafter/q-honesty"
#: Draft calls per sampling setting and context (``--thorough``: times THOROUGH_FACTOR).
Q_CALLS = 1_500
THOROUGH_FACTOR = 8
#: A prompt in which no token repeats: nothing to copy, so copying drafters draft nothing and
#: ``hybrid`` drafts with its head.
FRESH_PROMPT = (2, 5, 0, 7, 1, 4, 6, 3)
#: Plain steps a request may take before its drafter first drafts (a drafter may need a
#: step's features first); one that never drafts in this many is reported as such.
MAX_STEPS = 8


@dataclass(frozen=True)
class QSetting:
    """One sampling setting the drafter is asked to draft under."""

    name: str
    temperature: float
    top_k: int = 0
    top_p: float = 1.0

    def sampling(self, seed: int) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            max_tokens=MAX_STEPS + 4,
            seed=seed,
        )

    def describe(self) -> str:
        if self.temperature == 0:
            return "temperature 0"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1:
            parts.append(f"top-p {self.top_p:g}")
        return ", ".join(parts)


#: Below and above 1, top-k and top-p alone at temperature 1 (where a temperature error is
#: invisible but a filter applied on one side only is not), and both combined with a
#: temperature. Temperature 0 comes first: the draft must then be deterministic.
Q_SETTINGS = (
    QSetting("greedy", 0.0),
    QSetting("t0.6", 0.6),
    QSetting("t1.5", 1.5),
    QSetting("top_k3", 1.0, top_k=3),
    QSetting("top_p0.8", 1.0, top_p=0.8),
    QSetting("t0.8-top_k4-top_p0.9", 0.8, top_k=4, top_p=0.9),
    QSetting("t1.3-top_k5-top_p0.95", 1.3, top_k=5, top_p=0.95),
)


@dataclass
class _Group:
    """The draws of one node group: counts of drawn tokens and the sum of their rows."""

    observed: Counter[int] = field(default_factory=Counter)
    expected: torch.Tensor | None = None  # [V] float64

    def add(self, token: int, row: torch.Tensor) -> None:
        self.observed[token] += 1
        self.expected = row if self.expected is None else self.expected + row

    def test(self) -> GTest:
        assert self.expected is not None
        law = {x: float(e) for x, e in enumerate(self.expected.tolist()) if e > 0}
        return g_test(self.observed, law)


class _Dishonest(Exception):
    """A single draft already disproves the drafter's word."""

    def __init__(self, detail: str, example: dict[str, Any]) -> None:
        super().__init__(detail)
        self.detail = detail
        self.example = example


def group_keys(draft: Draft) -> list[tuple[int, int]]:
    """Each node's group: its depth (1 for the root's children) and its rank among its
    siblings, so an i.i.d. sibling is compared with the other draws of its rank."""
    depths = draft.depths()
    rank: dict[int, int] = {}
    keys = []
    for depth, parent in zip(depths, draft.parents):
        keys.append((depth, rank.get(parent, 0)))
        rank[parent] = rank.get(parent, 0) + 1
    return keys


def sample_drafts(
    bench: EngineBench,
    prompt: Sequence[int],
    params: SamplingParams,
    calls: int,
    seed: int,
) -> list[Draft | None]:
    """Run one request of ``prompt`` and, at the first step where the drafter drafts, call its
    ``propose`` ``calls`` times on that same context, each with a fresh generator.

    :returns: the drafts (None where a call drafted nothing); empty when the drafter never
        drafted within :data:`MAX_STEPS` steps.
    """
    drafter = bench.engine.plugins.drafter(bench.drafter)
    if drafter is None:
        raise PluginError(f"drafter {bench.drafter!r} could not be built")
    inner: Callable[[DraftContext, int], Draft | None] = drafter.propose
    drafts: list[Draft | None] = []
    malformed: list[str] = []

    def propose(ctx: DraftContext, budget: int) -> Draft | None:
        if drafts:
            return None
        own = ctx.generator
        try:
            for i in range(calls):
                ctx.generator = make_generator(seed * 1_000_003 + i)
                draft = inner(ctx, budget)
                if draft is not None and len(draft) == 0:
                    draft = None
                if i == 0 and draft is None:
                    return None  # nothing drafted here: a plain step, then try again
                if draft is not None:
                    try:
                        check_draft(draft, budget, ctx.vocab_size)
                    except PluginError as e:
                        malformed.append(f"call {i}: {e}")
                        return None
                drafts.append(draft)
        finally:
            ctx.generator = own
        return None  # the draws are what was wanted; the step itself is plain

    own = vars(drafter).get("propose")  # an instance's own propose, if it has one
    drafter.propose = propose  # type: ignore[method-assign]  # this instance only
    try:
        bench.run(prompt, params, cancel=lambda: bool(drafts or malformed))
    finally:
        if own is not None:
            drafter.propose = own  # type: ignore[method-assign]
        else:
            del drafter.propose
    if malformed:
        raise _Dishonest("returned a malformed draft: " + malformed[0], {})
    return drafts


def judge(
    drafts: Sequence[Draft | None], greedy: bool
) -> tuple[dict[tuple[int, int], _Group], int, int]:
    """Sort the drafts' nodes into groups, raising :class:`_Dishonest` at the first draft that
    alone disproves the drafter's word.

    :returns: (the groups of sampled nodes, sampled nodes, deterministic drafts).
    """
    groups: dict[tuple[int, int], _Group] = {}
    fixed: Draft | None = None
    sampled = deterministic = 0
    for call, draft in enumerate(drafts):
        if draft is None:
            continue
        if draft.q is None:
            deterministic += 1
            if fixed is None:
                fixed = draft
            elif (draft.tokens, draft.parents) != (fixed.tokens, fixed.parents):
                raise _Dishonest(
                    "reported q = None (a deterministic draft) but drafted differently with "
                    "another generator",
                    {
                        "first": [fixed.tokens, fixed.parents],
                        f"call {call}": [draft.tokens, draft.parents],
                    },
                )
            continue
        q = draft.q.detach().double().cpu()
        q = q / q.sum(-1, keepdim=True)
        for node, (key, token) in enumerate(zip(group_keys(draft), draft.tokens)):
            row = q[node]
            if row[token] <= 0:
                raise _Dishonest(
                    f"drew token {token} at node {node}, which its reported q gives probability 0",
                    {"call": call, "tokens": draft.tokens, "parents": draft.parents},
                )
            if greedy and float(row.max()) < 1.0 - 1e-6:
                raise _Dishonest(
                    "at temperature 0 the draft must be deterministic (q = None or one-hot "
                    f"rows), but node {node}'s row has largest probability {float(row.max()):.3f}",
                    {
                        "call": call,
                        "tokens": draft.tokens,
                        "row": [round(float(v), 4) for v in row],
                    },
                )
            groups.setdefault(key, _Group()).add(token, row)
            sampled += 1
    return groups, sampled, deterministic


def check_setting(
    bench: EngineBench,
    setting: QSetting,
    contexts: Sequence[tuple[str, list[int]]],
    calls: int,
    seed: int,
) -> Result:
    """One ``drafter/q-honesty`` result: every context, every node group, at one setting."""
    subject = f"drafter {bench.drafter}, {setting.describe()}"
    t0 = time.perf_counter()
    worst: tuple[float, str, GTest] | None = None
    totals = Counter[str]()
    tests = 0
    combined: list[GTest] = []
    info: dict[str, Any] = {"setting": setting.name}
    for c, (label, prompt) in enumerate(contexts):
        s = seed * 7_919 + 1_000 * c + Q_SETTINGS.index(setting)
        params = setting.sampling(s)
        try:
            drafts = sample_drafts(bench, prompt, params, calls, s)
            groups, sampled, deterministic = judge(drafts, params.greedy)
        except _Dishonest as e:
            example = {"context": prompt, "setting": setting.name, **e.example}
            seconds = time.perf_counter() - t0
            return Result(PROPERTY, subject, False, e.detail, example, seconds, info)
        totals.update(
            calls=len(drafts),
            sampled=sampled,
            deterministic=deterministic,
            empty=sum(d is None for d in drafts),
        )
        for key, group in sorted(groups.items()):
            test = group.test()
            tests += 1
            combined.append(test)
            where = f"{label}, depth {key[0]}" + (f", sibling {key[1] + 1}" if key[1] else "")
            if worst is None or test.p_value < worst[0]:
                worst = (test.p_value, where, test)
            if test.rejects(ALPHA):
                return Result(
                    PROPERTY,
                    subject,
                    False,
                    f"drafted tokens do not follow the reported q ({where}): " + test.describe(),
                    _counterexample(prompt, setting, key, group, test),
                    time.perf_counter() - t0,
                    info,
                )
    if len(combined) > 1:
        # A q wrong at every node is seen in every group: their sum sees it sooner than any one.
        g, df = sum(t.statistic for t in combined), sum(t.df for t in combined)
        pooled = GTest(statistic=g, df=df, p_value=chi2_sf(g, df), n=totals["sampled"])
        if pooled.rejects(ALPHA):
            return Result(
                PROPERTY,
                subject,
                False,
                "drafted tokens do not follow the reported q (every group together): "
                + pooled.describe(),
                {"context": [p for _, p in contexts], "setting": setting.name, "groups": tests},
                time.perf_counter() - t0,
                info,
            )
    info.update(tests=tests, **totals)
    if not totals["calls"]:
        detail = f"the drafter drafted nothing within {MAX_STEPS} steps: nothing to check"
    elif worst is None:
        detail = f"{totals['deterministic']} deterministic drafts, identical whatever the generator"
    else:
        detail = f"{totals['sampled']} drafted tokens in {tests} groups; weakest {worst[1]}: {worst[2].describe()}"
    return Result(PROPERTY, subject, True, detail, seconds=time.perf_counter() - t0, info=info)


def _counterexample(
    prompt: Sequence[int], setting: QSetting, key: tuple[int, int], group: _Group, test: GTest
) -> dict[str, Any]:
    assert group.expected is not None
    n = sum(group.observed.values())
    return {
        "context": list(prompt),
        "setting": setting.name,
        "depth": key[0],
        "sibling": key[1] + 1,
        "observed_frequency": [
            round(group.observed.get(x, 0) / n, 4) for x in range(len(group.expected))
        ],
        "reported_q_mean": [round(float(e) / n, 4) for e in group.expected],
        "test": test.describe(),
    }


def drafter_checks(
    drafter: str,
    options: dict[str, Any],
    modes: Collection[str] = ("greedy", "sampled"),
    seed: int = 0,
    thorough: bool = False,
    weights: str = "f32",
) -> Iterator[Result]:
    """``drafter/q-honesty`` at the settings of :data:`Q_SETTINGS` the decoding ``modes``
    ("greedy", "sampled") cover, stopping at a failure; ``weights`` says how the target's
    matrices are stored (:data:`.engine_scenarios.WEIGHTS`)."""
    calls = Q_CALLS * (THOROUGH_FACTOR if thorough else 1)
    settings = [s for s in Q_SETTINGS if ("greedy" if s.temperature == 0 else "sampled") in modes]
    with captured_errors() as capture:
        bench = EngineBench(drafter, options, None, weights)
        contexts = [
            ("its cycle", conformance_prompt(bench.target)),
            ("no repeats", list(FRESH_PROMPT)),
        ]
        for setting in settings:
            result = check_setting(bench, setting, contexts, calls, seed)
            failure = bench.plugin_failure(None)
            if failure and result.passed:
                result = Result(
                    PROPERTY,
                    result.subject,
                    False,
                    failure,
                    {"setting": setting.name, "errors": capture.errors()},
                    result.seconds,
                    {"setting": setting.name},
                )
            yield result
            if not result.passed:
                return
