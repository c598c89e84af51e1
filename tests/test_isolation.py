"""A drafter, verifier or exit policy that raises, hangs or returns garbage cannot fail a
request: it falls back to plain decoding, is logged once with its traceback, and is
disabled after repeated failures."""

from __future__ import annotations

import logging
import math
import time

import pytest
import torch

from specd import Draft, Drafter, Engine, ExitPolicy, SamplingParams, Verdict, Verifier, hookimpl
from specd.forward.tiny import tiny_target
from specd.registry import get_plugin_manager

VOCAB = 40


def _garbage_drafts():
    return {
        "raises": lambda ctx, budget: 1 / 0,
        "out-of-vocab": lambda ctx, budget: Draft.chain([VOCAB + 5]),
        "negative-id": lambda ctx, budget: Draft.chain([-1]),
        "over-budget": lambda ctx, budget: Draft.chain([1] * (budget + 3)),
        "bad-parents": lambda ctx, budget: Draft(tokens=[1, 2], parents=[1, -1]),
        "wrong-q-shape": lambda ctx, budget: Draft.chain(
            [1], q=torch.ones(1, VOCAB + 1) / (VOCAB + 1)
        ),
        "nan-q": lambda ctx, budget: Draft.chain([1], q=torch.full((1, VOCAB), math.nan)),
        "not-a-draft": lambda ctx, budget: "hello",
        "float-token": lambda ctx, budget: Draft(tokens=[1.5], parents=[-1]),
    }


def _make_drafter(name, fn):
    return type(
        f"D_{name}",
        (Drafter,),
        {"name": f"bad-{name}", "propose": lambda self, ctx, budget: fn(ctx, budget)},
    )


class SlowDrafter(Drafter):
    name = "bad-hangs"

    def propose(self, ctx, budget):
        while True:  # a plugin stuck in a loop, swallowing what it can
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001
                pass


class RaisesInStart(Drafter):
    name = "bad-start"

    def start(self, ctx):
        raise RuntimeError("cannot start")

    def propose(self, ctx, budget):
        return None


class RaisesInCommit(Drafter):
    name = "bad-commit"

    def propose(self, ctx, budget):
        return Draft.chain([ctx.tokens[-1]])

    def commit(self, ctx, new_tokens, accepted):
        raise RuntimeError("cannot commit")


class CopyLast(Drafter):
    name = "copy-last"

    def propose(self, ctx, budget):
        return Draft.chain([ctx.tokens[-1]] * budget)


class RaisingVerifier(Verifier):
    name = "bad-verifier"
    exact_for = frozenset({"greedy", "sampled"})

    def verify(self, draft, p, params, generator):
        raise ValueError("broken verifier")


class GarbageVerifier(Verifier):
    name = "garbage-verifier"
    exact_for = frozenset({"greedy", "sampled"})

    def verify(self, draft, p, params, generator):
        return Verdict(path=[5, 7], token=10**9)


class RaisingPolicy(ExitPolicy):
    name = "bad-policy"

    def draft_budget(self):
        raise KeyError("no budget")


DRAFTERS = [_make_drafter(k, v) for k, v in _garbage_drafts().items()] + [
    SlowDrafter,
    RaisesInStart,
    RaisesInCommit,
    CopyLast,
]


class Plugin:
    @hookimpl
    def specd_register_drafters(self, register):
        for cls in DRAFTERS:
            register(cls)

    @hookimpl
    def specd_register_verifiers(self, register):
        register(RaisingVerifier)
        register(GarbageVerifier)

    @hookimpl
    def specd_register_exit_policies(self, register):
        register(RaisingPolicy)


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    pm = get_plugin_manager()
    plugin = Plugin()
    pm.register(plugin, name="test-bad-plugins")
    yield
    pm.unregister(plugin)


@pytest.fixture
def target():
    return tiny_target(VOCAB, seed=4, logit_scale=10.0)


PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
PARAMS = SamplingParams(max_tokens=12)


def _plain(target):
    return Engine(target, drafter="none").generate(PROMPT, PARAMS).token_ids


@pytest.mark.parametrize("name", [c.name for c in DRAFTERS if c.name.startswith("bad-")])
def test_bad_drafter_falls_back_and_completes(target, name, caplog):
    engine = Engine(target, drafter=name, plugin_timeout_s=0.3, exit_policy="fixed")
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        out = engine.generate(PROMPT, PARAMS)
    assert out.token_ids == _plain(target)
    assert out.stats.fallback is not None
    assert out.stats.new_tokens == PARAMS.max_tokens
    failures = [r for r in caplog.records if "falls back" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None


def test_repeated_failures_disable_the_plugin_and_log_once(target, caplog):
    engine = Engine(target, drafter="bad-raises", plugin_failure_limit=3)
    with caplog.at_level(logging.ERROR, logger="specd.plugins"):
        for _ in range(5):
            out = engine.generate(PROMPT, PARAMS)
            assert out.token_ids == _plain(target)
    health = engine.plugin_health()["drafter:bad-raises"]
    assert health["disabled"] and health["failures"] == 3
    assert sum("falls back" in r.getMessage() for r in caplog.records) == 1
    assert sum("disabled" in r.getMessage() for r in caplog.records) == 1


def test_a_hanging_drafter_is_cut_off_and_disabled(target):
    engine = Engine(target, drafter="bad-hangs", plugin_timeout_s=0.2)
    t = time.perf_counter()
    out = engine.generate(PROMPT, PARAMS)
    assert time.perf_counter() - t < 1.5
    assert out.token_ids == _plain(target)
    health = engine.plugin_health()["drafter:bad-hangs"]
    assert health["disabled"] and health["timeouts"] == 1
    # the interruption does not leak into later work on this thread
    time.sleep(0.5)
    assert engine.generate(PROMPT, PARAMS, drafter="ngram").token_ids == _plain(target)


@pytest.mark.parametrize("verifier", ["bad-verifier", "garbage-verifier"])
def test_bad_verifier_falls_back(target, verifier):
    engine = Engine(target, drafter="copy-last", verifier=verifier)
    out = engine.generate(PROMPT, PARAMS)
    assert out.token_ids == _plain(target)
    assert out.stats.fallback and verifier in out.stats.fallback


def test_bad_exit_policy_falls_back(target):
    engine = Engine(target, drafter="copy-last", exit_policy="bad-policy")
    out = engine.generate(PROMPT, PARAMS)
    assert out.token_ids == _plain(target)
    assert "bad-policy" in out.stats.fallback


def test_engine_keeps_serving_after_failures(target):
    engine = Engine(target, drafter="bad-raises")
    engine.generate(PROMPT, PARAMS)
    good = engine.generate(PROMPT, PARAMS, drafter="ngram")
    assert good.token_ids == _plain(target)
    assert good.stats.fallback is None


def test_watchdog_interruptions_never_escape_the_guard():
    from specd.isolation import PluginFailed, PluginGuard

    guard = PluginGuard(timeout_s=0.05)

    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return seconds

    outcomes = {"ok": 0, "failed": 0}
    for i in range(60):
        try:
            # well below the limit, or four times past it
            guard.call(f"p{i}", busy, (0.0, 0.005, 0.2)[i % 3])
            outcomes["ok"] += 1
        except PluginFailed:
            outcomes["failed"] += 1
    busy(0.3)  # a late interruption would surface here
    assert outcomes["failed"] >= 20  # every overrun is caught
    assert outcomes["ok"] >= 35  # short calls pass (a rare scheduling stall may cost one)


class RaisesInInit(Drafter):
    name = "bad-init"

    def __init__(self):
        raise RuntimeError("cannot construct")


def test_a_drafter_whose_constructor_raises_falls_back(target):
    pm = get_plugin_manager()

    class InitPlugin:
        @hookimpl
        def specd_register_drafters(self, register):
            register(RaisesInInit)

    plugin = InitPlugin()
    pm.register(plugin, name="test-init-plugin")
    try:
        engine = Engine(target, drafter="bad-init")
        out = engine.generate(PROMPT, PARAMS)
        assert out.token_ids == _plain(target)
        assert "bad-init" in out.stats.fallback
        assert len(engine.prefix_cache) == 1  # the request's cache went back to the pool
    finally:
        pm.unregister(plugin)


def test_bad_drafter_options_fail_when_the_request_is_made(target):
    from specd import BadInputError

    engine = Engine(target, drafter="ngram", drafter_options={"ngram": {"no_such_option": 1}})
    with pytest.raises(BadInputError, match="no_such_option"):
        engine.stream(PROMPT, PARAMS)
    assert len(engine.prefix_cache) == 0
    # a value the constructor cannot read is the user's error too, not a broken plugin
    engine = Engine(target, drafter="ngram", drafter_options={"ngram": {"max_n": "abc"}})
    with pytest.raises(BadInputError, match="max_n='abc'"):
        engine.stream(PROMPT, PARAMS)


def test_running_out_of_request_time_is_not_held_against_the_plugin(target):
    class Slowish(Drafter):
        name = "slowish"

        def propose(self, ctx, budget):
            time.sleep(0.05)
            return Draft.chain([ctx.tokens[-1]])

    class P:
        @hookimpl
        def specd_register_drafters(self, register):
            register(Slowish)

    pm = get_plugin_manager()
    plugin = P()
    pm.register(plugin, name="test-slowish")
    try:
        engine = Engine(target, drafter="slowish", plugin_timeout_s=1.0)
        out = engine.generate(PROMPT, SamplingParams(max_tokens=500), time_budget_s=0.12)
        assert out.stats.finish_reason == "time"
        health = engine.plugin_health()["drafter:slowish"]
        assert health["failures"] == 0 and not health["disabled"]
    finally:
        pm.unregister(plugin)


class PolicyRaisesInInit(ExitPolicy):
    name = "bad-policy-init"

    def __init__(self):
        raise RuntimeError("cannot construct")

    def draft_budget(self):
        return 4


def test_a_plugin_has_one_health_key_whether_it_fails_building_or_running(target):
    """An exit policy that fails in its constructor is filed under ``exit_policy:NAME``,
    the key its run-time failures use (it was once ``exit_policie:NAME``)."""

    class P:
        @hookimpl
        def specd_register_exit_policies(self, register):
            register(PolicyRaisesInInit)

    pm = get_plugin_manager()
    plugin = P()
    pm.register(plugin, name="test-policy-init")
    try:
        engine = Engine(target, drafter="copy-last", exit_policy="bad-policy-init")
        out = engine.generate(PROMPT, PARAMS)
        assert out.token_ids == _plain(target)
        assert engine.plugin_health()["exit_policy:bad-policy-init"]["failures"] == 1
        assert "exit_policy:bad-policy-init" in out.stats.fallback
        engine.generate(PROMPT, PARAMS, exit_policy="bad-policy")  # fails at run time
        assert set(engine.plugin_health()) >= {
            "exit_policy:bad-policy-init",
            "exit_policy:bad-policy",
        }
        assert not [k for k in engine.plugin_health() if k.startswith("exit_policie:")]
    finally:
        pm.unregister(plugin)
