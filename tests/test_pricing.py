"""Verify passes are priced once per load, with the step that serves them, and the exit
policy is handed the prices (specd/forward/pricing.py, ``Target.price_passes``)."""

from __future__ import annotations

import logging
import time

import pytest
import torch
from specd.plugins.ngram import NgramDrafter
from specd.plugins.policies import AdaptivePolicy

from specd import Engine, SamplingParams, hookimpl
from specd.errors import BadInputError
from specd.forward import pricing
from specd.forward.pricing import FLAT, PRICE_TOKENS, PassCosts, measure
from specd.forward.tiny import tiny_target
from specd.registry import get_plugin_manager
from specd.speculation import DraftClock


def test_prices_between_and_past_the_priced_widths():
    """Guards against a draft length whose pass was not priced falling back to a step's
    price (a 6-token pass as cheap as one token), and against prices past the widest pass
    that stop growing."""
    costs = PassCosts({1: 1.0, 2: 1.2, 4: 2.0, 8: 4.0})
    assert costs(1) == 1.0 and costs(4) == 2.0
    assert costs(3) == pytest.approx(1.6)
    assert costs(6) == pytest.approx(3.0)
    assert costs(12) == pytest.approx(6.0)  # along the last two
    assert FLAT(1) == FLAT(16) == 1.0


@pytest.mark.parametrize(
    "prices, what",
    [({2: 1.5}, "one-token pass"), ({1: 1.0, 0: 0.5}, "0 tokens"), ({1: 0.0}, "priced 0.0"),
     ({1: 1.0, 4: float("nan")}, "priced nan")],
)  # fmt: skip
def test_a_bad_price_table_is_refused_naming_what_was_wrong(prices, what):
    with pytest.raises(BadInputError, match=what):
        PassCosts(prices)
    with pytest.raises(BadInputError, match="at least one token"):
        FLAT(0)


class _Clock:
    """Stands in for ``time.perf_counter``: a pass of n tokens takes ``cost[n]`` seconds
    times the machine's load in that round, plus ``extra[(n, round)]``."""

    def __init__(self, cost: dict[int, float], load: list[float], extra: dict) -> None:
        self.now, self.cost, self.load, self.extra = 0.0, cost, load, extra
        self.calls = {n: 0 for n in cost}

    def __call__(self) -> float:
        return self.now

    def forward(self, cache, tokens) -> None:
        n = len(tokens)
        r = self.calls[n]
        self.calls[n] += 1
        self.now += self.cost[n] * self.load[r] + self.extra.get((n, r), 0.0)


class _Cache:
    length = 100
    device = "cpu"

    def __init__(self) -> None:
        self.crops: list[int] = []

    def crop(self, length: int) -> None:
        self.crops.append(length)


def test_measure_prices_each_width_against_the_same_rounds_step(monkeypatch):
    """Guards against prices skewed by the machine's load moving between rounds (a shared
    host), against one disturbed pass setting a price, against prices not relative to the
    one-token step, against a wider pass priced below a narrower one (noise would make the
    policy draft longer), and against a cache not rolled back after a pass."""
    cost = {1: 0.010, 2: 0.012, 4: 0.011, 8: 0.040, 16: 0.080}
    load = [5.0, 1.0, 3.0, 1.0, 2.0, 4.0, 1.0, 2.5]  # round 0 warms up
    # the one-token pass disturbed in the quiet rounds: its fastest is not its own price
    extra = {(8, 0): 9.0, (16, 3): 0.5, (2, 5): 0.2, (1, 1): 0.005, (1, 3): 0.005, (1, 6): 0.005}
    clock = _Clock(cost, load, extra)
    monkeypatch.setattr(pricing.time, "perf_counter", clock)
    cache = _Cache()
    got = measure(clock.forward, cache, vocab=10, backend="kernel")
    assert got.backend == "kernel" and list(got.prices) == list(PRICE_TOKENS)
    assert got.prices[1] == 1.0 and got.prices[2] == pytest.approx(1.2)
    assert got.prices[4] == pytest.approx(1.2)  # measured cheaper than 2 tokens: noise
    assert got.prices[8] == pytest.approx(4.0) and got.prices[16] == pytest.approx(8.0)
    assert cache.crops == [100] * (len(PRICE_TOKENS) * (pricing.ROUNDS + 1))


def test_a_target_prices_its_passes_once_per_serving_step():
    """Guards against pricing the eager pass and keeping that price once a compiled step
    serves (a background compile that became ready), and against measuring again on every
    request (each pricing costs tens of passes)."""
    target = tiny_target(40, num_layers=1, seed=2)
    assert target.pass_costs is None and target.pass_cost(8) == 1.0  # not priced yet
    eager = target.price_passes()
    assert eager.backend == "eager" and list(eager.prices) == list(PRICE_TOKENS)
    assert all(a <= b for a, b in zip(list(eager.prices.values()), list(eager.prices.values())[1:]))
    assert target.price_passes() is eager  # the same step: not measured again
    step = target.compile("on", backend="static")
    assert step is not None and step.ready
    served = step.served
    static = target.price_passes()
    assert static is not eager and static.backend == "static"
    assert step.served > served  # its passes ran the compiled step
    assert target.pass_cost(16) == static.prices[16]


def test_engine_load_prices_the_passes():
    engine = Engine.load("tiny", drafter="none")
    costs = engine.target.pass_costs
    assert costs is not None and costs.backend == "eager"  # the tiny model: no kernel
    assert costs.prices[1] == 1.0 and costs(16) >= costs(2) >= 1.0


def test_where_wide_passes_cost_more_the_engine_drafts_shorter():
    """Guards against prices that never reach the policy: the same requests over the same
    target draft fewer tokens per step where an 8-token pass costs four steps than where
    every pass costs one, and write the same tokens (the policy only chooses lengths)."""
    target = tiny_target(40, num_layers=1, seed=6, logit_scale=8.0)  # it writes a loop
    prompt = "ABCDABCDABCDABCD ABCDABCD ABCDABCD"
    runs = {}
    for name, costs in (("flat", FLAT), ("costly", PassCosts({1: 1, 2: 1.5, 4: 2.2, 8: 4}))):
        target.pass_costs = PassCosts(costs.prices, backend="eager")  # as priced: not again
        engine = Engine(target, drafter="ngram", max_draft=8)
        out = engine.generate(prompt, SamplingParams(max_tokens=64))
        runs[name] = out
        assert target.pass_costs.prices == costs.prices  # handed over, not measured again
    flat, costly = runs["flat"].stats, runs["costly"].stats
    assert runs["costly"].token_ids == runs["flat"].token_ids
    assert costly.drafted / costly.target_steps < flat.drafted / flat.target_steps


def test_the_policy_is_told_the_targets_prices_or_none(monkeypatch):
    """Guards against a policy told a made-up table (say, every pass free) for a target
    nobody priced, and against one never told the table of a target that was priced."""
    seen = []
    start = AdaptivePolicy.start

    def spy(self, max_budget):
        seen.append(self.pass_cost)
        return start(self, max_budget)

    monkeypatch.setattr(AdaptivePolicy, "start", spy)
    target = tiny_target(40, num_layers=1, seed=4, logit_scale=8.0)
    engine = Engine(target, drafter="ngram")
    engine.generate("ABCABC ABCABC", SamplingParams(max_tokens=8))
    target.pass_costs = PassCosts({1: 1.0, 8: 2.0}, backend="eager")
    engine.generate("ABCABC ABCABC", SamplingParams(max_tokens=8))
    assert seen == [None, target.pass_costs] and seen[1] is target.pass_costs


def test_a_request_after_the_step_changed_prices_the_passes_again():
    """Guards against a policy weighing the eager pass's prices for the whole life of a
    server whose compiled step became ready after load (``--compile background``)."""
    target = tiny_target(40, num_layers=1, seed=4, logit_scale=8.0)
    target.pass_costs = PassCosts({1: 1.0, 8: 9.0}, backend="eager")  # priced at load
    step = target.compile("on", backend="static")  # ready later
    assert step is not None and step.ready
    Engine(target, drafter="ngram").generate("ABCABC ABCABC", SamplingParams(max_tokens=8))
    assert target.pass_costs.backend == "static" and target.pass_costs(8) < 9.0


def test_a_table_is_kept_for_the_next_start_on_this_machine(monkeypatch, tmp_path):
    """Guards against pricing on every start (a second or two a one-token command would
    pay each time), against a table read back for another model or backend, and against a
    table that can never be measured again (SPECD_REPRICE, a stale or damaged file)."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_REPRICE", raising=False)
    monkeypatch.delenv("SPECD_PRICE_CACHE", raising=False)
    monkeypatch.setattr(pricing, "QUIET_SHARE", 0.0)  # kept however busy this machine is
    calls = []
    real = pricing.measure
    monkeypatch.setattr(pricing, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = tiny_target(40, num_layers=1, seed=2).price_passes()
    again = tiny_target(40, num_layers=1, seed=2).price_passes()  # the next start
    assert len(calls) == 1 and again.prices == first.prices and again.backend == "eager"
    tiny_target(40, num_layers=2, seed=2).price_passes()  # another model: its own table
    assert len(calls) == 2
    monkeypatch.setenv("SPECD_REPRICE", "1")
    tiny_target(40, num_layers=1, seed=2).price_passes()
    assert len(calls) == 3
    monkeypatch.delenv("SPECD_REPRICE")
    for f in (tmp_path / "prices").iterdir():
        f.write_text("{not json")
    tiny_target(40, num_layers=1, seed=2).price_passes()
    assert len(calls) == 4
    monkeypatch.setattr(pricing, "KEEP_S", -1.0)  # every saved table is stale
    tiny_target(40, num_layers=1, seed=2).price_passes()
    assert len(calls) == 5
    monkeypatch.setattr(pricing, "KEEP_S", 3600.0)
    monkeypatch.setenv("SPECD_PRICE_CACHE", "off")  # neither read nor kept
    saved = sorted(f.read_text() for f in (tmp_path / "prices").iterdir())
    tiny_target(40, num_layers=1, seed=2).price_passes()
    assert len(calls) == 6
    assert sorted(f.read_text() for f in (tmp_path / "prices").iterdir()) == saved


def test_measure_reports_the_share_of_the_cpu_its_passes_had():
    """Passes that wait (here: sleep) rather than compute leave the process a small share of
    its threads' time, as passes do whose threads wait to be scheduled on a busy host."""
    costs = measure(lambda cache, tokens: time.sleep(0.002), _Cache(), vocab=10, rounds=2)
    assert costs.cpu_share is not None and 0.0 <= costs.cpu_share < 0.3


def test_a_table_priced_while_the_cpu_was_shared_is_not_kept(monkeypatch, tmp_path, caplog):
    """Bug guarded: passes priced while another process shared the cores (each pass waiting
    for its threads to be scheduled, so that a pass of 2 tokens priced like a step) were kept
    for a week, and every start on the quiet host drafted deeper than paid. Such a table
    serves the process that measured it; the next start measures again and keeps its own."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_REPRICE", raising=False)
    monkeypatch.delenv("SPECD_PRICE_CACHE", raising=False)
    real, shares = pricing.measure, iter([0.5, 0.99])

    def measured(*args, **kwargs):
        costs = real(*args, **kwargs)
        return PassCosts(costs.prices, costs.backend, next(shares))

    monkeypatch.setattr(pricing, "measure", measured)
    with caplog.at_level(logging.INFO, logger="specd.forward.pricing"):
        busy = tiny_target(40, num_layers=1, seed=2).price_passes()
    assert busy.cpu_share == 0.5 and "shared the CPU (50% of" in caplog.text
    assert not (tmp_path / "prices").exists() or not list((tmp_path / "prices").iterdir())
    quiet = tiny_target(40, num_layers=1, seed=2).price_passes()  # the next start
    assert quiet.cpu_share == 0.99 and len(list((tmp_path / "prices").iterdir())) == 1
    again = tiny_target(40, num_layers=1, seed=2).price_passes()  # read back, not measured
    assert again.cpu_share is None and again.prices == quiet.prices


def test_a_busy_hosts_table_is_priced_again_once_a_request_finds_the_host_quiet(
    monkeypatch, tmp_path
):
    """Bug guarded: a daemon started while the host was busy (an editor opening, its other
    language servers indexing) drafted by that host's prices for its whole life. A request
    whose passes had their threads' time marks the table; the next request prices the
    passes again and keeps that table. Requests on a still busy host leave it."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_REPRICE", raising=False)
    monkeypatch.delenv("SPECD_PRICE_CACHE", raising=False)
    monkeypatch.setattr(pricing, "QUIET_CHECK_S", 0.0)
    target = tiny_target(40, num_layers=1, seed=2)
    busy = PassCosts({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, backend="eager", cpu_share=0.5)
    target.pass_costs = busy
    calls: list[int] = []
    real = pricing.measure
    monkeypatch.setattr(pricing, "measure", lambda *a, **k: calls.append(1) or real(*a, **k))
    engine, params = Engine(target, drafter="ngram"), SamplingParams(max_tokens=8)
    monkeypatch.setattr(pricing, "share", lambda cpu_s, wall_s: 0.4)  # still busy
    for _ in range(2):
        engine.generate("ABCABC ABCABC", params)
    assert not calls and target.pass_costs is busy and not busy.reprice
    monkeypatch.setattr(pricing, "share", lambda cpu_s, wall_s: 1.0)  # quiet now
    engine.generate("ABCABC ABCABC", params)
    assert not calls and busy.reprice
    engine.generate("ABCABC ABCABC", params)  # priced again, and kept
    assert calls == [1] and target.pass_costs is not busy
    assert target.pass_costs.cpu_share == 1.0 and not target.pass_costs.reprice
    assert len(list((tmp_path / "prices").iterdir())) == 1
    engine.generate("ABCABC ABCABC", params)
    assert calls == [1]  # a quiet host's table is not measured again


def test_the_draft_clock_measures_calls_in_steps():
    """Guards against a draft cost in seconds (against prices in steps), and against one
    that does not grow with the draft it is asked for."""
    clock = DraftClock(ema=0.5)
    assert clock.cost(4) == 0.0  # nothing timed yet
    clock.record(None, 0, 0.010, 1.0)  # a plain step of 10 ms
    clock.record(0.005, 4, 0.020, 2.0)  # a 4-token draft of 5 ms, its pass priced 2 steps
    assert clock.step_s == pytest.approx(0.010)
    assert clock.cost(4) == pytest.approx(0.5)
    assert clock.cost(9) == pytest.approx(1.0)


def test_a_requests_first_call_and_one_slow_call_do_not_price_drafting_out():
    """Guards against a draft cost that follows a request's first call (where the EAGLE head
    reads the prompt's features, a cost of the request) or one slow call at full weight: a
    drafter that costs 0.1 steps a call would be judged to cost several for the steps
    after it, and the policy would take plain steps. Calls that go on costing more still
    lift the average within a few."""
    clock = DraftClock(ema=0.5)
    clock.record(None, 0, 0.010, 1.0)  # steps of 10 ms
    clock.start()
    clock.record(0.200, 2, 0.010, 1.0)  # the first call: 20 steps, not timed
    assert clock.cost(2) == 0.0
    clock.record(0.001, 2, 0.010, 1.0)  # 0.1 steps
    assert clock.cost(2) == pytest.approx(0.1)
    clock.record(0.200, 2, 0.010, 1.0)  # one slow call counts as OUTLIER times the average
    assert clock.cost(2) == pytest.approx(0.05 + 0.5 * DraftClock.OUTLIER * 0.1)
    for _ in range(8):
        clock.record(0.020, 2, 0.010, 1.0)  # two steps a call, from now on
    assert clock.cost(2) == pytest.approx(2.0, rel=0.02)
    clock.start()  # the next request's first call is not timed either
    clock.record(0.500, 2, 0.010, 1.0)
    assert clock.cost(2) == pytest.approx(2.0, rel=0.02)


class SlowNgram(NgramDrafter):
    """The n-gram drafter, 30 ms a call: far more than a tiny target's step."""

    name = "test-slow-ngram"

    def propose(self, ctx, budget):
        time.sleep(0.03)
        return super().propose(ctx, budget)


class _SlowPlugin:
    @hookimpl
    def specd_register_drafters(self, register):
        register(SlowNgram)


def test_a_drafter_slower_than_it_saves_is_asked_rarely():
    """Guards against draft costs that never reach the policy: the same requests with a
    drafter whose calls cost many steps draft on far fewer steps than with the same drafter
    at its own speed, and write the same tokens."""
    target = tiny_target(40, num_layers=1, seed=6, logit_scale=8.0)
    target.pass_costs = PassCosts({1: 1.0, 2: 1.0, 4: 1.1, 8: 1.3}, backend="eager")
    prompt = "ABCDABCDABCDABCD ABCDABCD ABCDABCD"
    pm = get_plugin_manager()
    pm.register(_SlowPlugin(), name="test-slow-ngram")
    try:
        runs = {}
        for name in ("ngram", "test-slow-ngram"):
            engine = Engine(target, drafter=name, max_draft=8)
            engine.generate(prompt, SamplingParams(max_tokens=48))  # the clock learns
            runs[name] = engine.generate(prompt + " ABCD", SamplingParams(max_tokens=48))
    finally:
        pm.unregister(name="test-slow-ngram")
    fast, slow = runs["ngram"], runs["test-slow-ngram"]
    assert slow.token_ids == fast.token_ids
    assert fast.stats.drafted > 0
    assert slow.stats.drafted <= fast.stats.drafted / 2


def test_a_changed_kernel_prices_its_passes_anew(monkeypatch):
    """Guards against a table priced with one build of the step kernel read back for
    another: a faster one-token step makes every wider pass dearer relative to it, and the
    policy would draft as deep as the old kernel paid for, for up to a week."""
    from specd.forward import cpu_kernels

    target = tiny_target(40, num_layers=1, seed=2)
    monkeypatch.setattr(cpu_kernels, "isa", lambda: "avx512")
    monkeypatch.setattr(cpu_kernels, "library_file", lambda: "specd_kernels-avx512-aaaa.so")
    before = pricing.key(target, "kernel")
    monkeypatch.setattr(cpu_kernels, "library_file", lambda: "specd_kernels-avx512-bbbb.so")
    assert pricing.key(target, "kernel") != before
    assert pricing.key(target, "eager") == pricing.key(target, "eager")


def test_a_remembered_value_is_computed_once_per_model(monkeypatch, tmp_path):
    """Guards against a value kept for one model served for another (the EAGLE head's
    weights hash, which decides whether a head fits the target), and against one computed
    again at every start."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_PRICE_CACHE", raising=False)
    calls = []

    def value(target, text):
        return target.remembered("test", lambda: calls.append(text) or text)

    a = tiny_target(40, num_layers=1, seed=4)
    assert a.fast is not None
    assert value(a, "first") == "first"
    assert value(tiny_target(40, num_layers=1, seed=4), "again") == "first"  # the next start
    assert value(tiny_target(40, num_layers=1, seed=5), "other") == "other"  # other weights
    assert calls == ["first", "other"]
    monkeypatch.setenv("SPECD_PRICE_CACHE", "off")
    assert value(a, "off") == "off"


def test_passes_are_priced_over_an_editor_prompt_computing_a_few_positions(monkeypatch):
    """Guards against pricing over a short cache: on blocks the cached keys and values are
    a third of what a step reads at 1k tokens and every token of a pass attends over them
    all (on an AVX2 host a 2-token pass priced 1.02 steps over 256 cached tokens costs 1.21
    over 1k, and the exit policy drafted where it did not pay); and against computing the
    whole scratch prompt to price it."""
    lengths, prefilled = [], []
    real = pricing.measure
    monkeypatch.setattr(
        pricing,
        "measure",
        lambda f, cache, *a, **k: lengths.append(cache.length) or real(f, cache, *a, **k),
    )
    target = tiny_target(40, num_layers=1, seed=2)
    real_prefill = target.prefill
    monkeypatch.setattr(
        target,
        "prefill",
        lambda cache, tokens, *a, **k: (
            prefilled.append(len(tokens)) or real_prefill(cache, tokens, *a, **k)
        ),
    )
    target.price_passes()
    context = min(pricing.PRICE_CONTEXT, target.max_positions - 2 * PRICE_TOKENS[-1])
    assert context >= 1024 and lengths == [context]
    assert prefilled == [pricing.PRICE_SEED]


def test_fill_repeats_the_computed_keys_and_values():
    """Guards against a scratch cache whose length says more than its buffers hold, and
    against a fill that writes past the positions it counts."""
    target = tiny_target(40, num_layers=2, seed=2)
    cache = target.new_cache(capacity=4)
    target.prefill(cache, [3, 1, 4])
    before = [(cache.layer(i).keys.clone(), cache.layer(i).values.clone()) for i in range(2)]
    pricing.fill(cache, 8)
    assert cache.length == 8
    for i, (k, v) in enumerate(before):
        keys, values = cache.layer(i).keys, cache.layer(i).values
        assert keys.shape[2] == 8
        for start in (0, 3, 6):
            n = min(3, 8 - start)
            assert torch.equal(keys[:, :, start : start + n], k[:, :, :n])
            assert torch.equal(values[:, :, start : start + n], v[:, :, :n])
    target.forward(cache, [2])  # a pass on top of it sees the positions it counts
    assert cache.length == 9
    with pytest.raises(BadInputError, match="must hold a position"):
        pricing.fill(target.new_cache(capacity=4), 8)
