"""``drafter/q-honesty``: every drafted token is a draw from the q its draft reported.

The mutants get q wrong the ways drafters do in the wild (the temperature applied to q
twice, q reported before top-k/top-p, tokens drawn at temperature 1 whatever the request
says, argmax drafted with the softmax reported); each must fail ``specd verify`` with its
default options on this property, and the honest drafter it is derived from must pass.
"""

from __future__ import annotations

import json

import pytest
import torch
from mutants import Q_MUTANTS, Bigram

from specd import Draft, Drafter, SamplingParams, cli, hookimpl, sample, warp
from specd.conformance import drafter_checks as dc
from specd.conformance import suite
from specd.registry import get_plugin_manager


def verify(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["verify", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def q_results(drafter: str, options: dict | None = None) -> list:
    return list(dc.drafter_checks(drafter, options or {}))


def q_results_of(cls: type[Drafter]) -> list:
    """The check's results for ``cls``, installed as a plugin for the call only."""

    class Plugin:
        @staticmethod
        @hookimpl
        def specd_register_drafters(register):
            register(cls)

    pm = get_plugin_manager()
    pm.register(Plugin, name=f"specd-test-{cls.name}")
    try:
        return q_results(cls.name)
    finally:
        pm.unregister(Plugin)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", Q_MUTANTS, ids=lambda m: m.name)
def test_specd_verify_fails_a_dishonest_q_on_the_q_honesty_property(
    capsys, monkeypatch, mutant_plugins, mutant
):
    """A drafter whose reported q is not the row its tokens came from fails, with defaults.
    The first mutant runs the whole command; the others skip the verifier's own checks,
    which come first and see nothing of the drafter."""
    if mutant is not Q_MUTANTS[0]:
        monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    code, report = verify(capsys, "--drafter", mutant.name)
    assert code == 1
    failed = [r for r in report["results"] if not r["passed"]]
    assert [r["property"] for r in failed] == [dc.PROPERTY]
    assert failed[0]["counterexample"]["setting"] != "greedy"
    assert failed[0]["info"]["setting"] == failed[0]["counterexample"]["setting"]
    # nothing after the failure ran
    assert not any(r["property"].startswith("engine/") for r in report["results"])


@pytest.mark.slow
def test_the_honest_bigram_passes_at_every_setting(mutant_plugins):
    results = q_results(Bigram.name)
    assert [r.info["setting"] for r in results] == [s.name for s in dc.Q_SETTINGS]
    assert all(r.passed for r in results), [(r.subject, r.detail) for r in results if not r.passed]
    sampled = [r for r in results if r.info["setting"] != "greedy"]
    # every node was compared with its row: chains of three in both contexts
    assert all(r.info["sampled"] == 2 * dc.Q_CALLS * 3 for r in sampled)
    assert results[0].info["deterministic"] == 2 * dc.Q_CALLS


@pytest.mark.slow
def test_an_argmax_draft_reported_as_sampled_fails(broken_plugins):
    """The draft model's argmax drafted while its softmax is handed over as q."""
    results = q_results("broken_argmax_q", {"model": "tiny:0"})
    assert not results[-1].passed
    assert results[-1].property == dc.PROPERTY
    assert "do not follow the reported q" in results[-1].detail


class _OneOff(Drafter):
    """A one-token drafter over a fixed row of scores, honest unless ``kind`` says how not."""

    reads_cache = False
    kind = ""

    def propose(self, ctx, budget):
        logits = torch.linspace(0.0, 2.0, ctx.vocab_size, dtype=torch.float64)
        q = warp(logits, ctx.params)
        if self.kind == "random-but-none":  # samples, yet claims to be deterministic
            return Draft.chain(
                [sample(warp(logits, SamplingParams(temperature=1.0)), ctx.generator)]
            )
        if self.kind == "soft-at-zero":  # a soft row at temperature 0
            soft = torch.softmax(logits, -1)
            return Draft.chain([int(soft.argmax())], soft[None])
        if self.kind == "outside-q":  # draws tokens its one-hot q gives no mass
            token = sample(torch.softmax(logits, -1), ctx.generator)
            one_hot = torch.zeros(ctx.vocab_size, dtype=torch.float64)
            one_hot[int(q.argmax())] = 1.0
            return Draft.chain([token], one_hot[None])
        if ctx.params.greedy:
            return Draft.chain([int(q.argmax())])
        return Draft.chain([sample(q, ctx.generator)], q[None])


def _one_off(kind: str) -> type[Drafter]:
    return type(
        f"OneOff_{kind}", (_OneOff,), {"name": f"one_off_{kind.replace('-', '_')}", "kind": kind}
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, needle",
    [
        ("random-but-none", "reported q = None (a deterministic draft) but drafted differently"),
        ("soft-at-zero", "at temperature 0 the draft must be deterministic"),
        ("outside-q", "which its reported q gives probability 0"),
        ("", None),
    ],
)
def test_each_draft_is_held_to_its_own_word(kind, needle):
    results = q_results_of(_one_off(kind))
    if needle is None:
        assert all(r.passed for r in results), [r.detail for r in results if not r.passed]
    else:
        assert not results[-1].passed and needle in results[-1].detail, results[-1].detail
        assert results[-1].counterexample["setting"]


def test_a_drafter_that_never_drafts_passes_saying_so():
    """Nothing drafted is nothing dishonest, but the detail says there was nothing to check."""

    class Never(Drafter):
        name = "never_drafts"

        def propose(self, ctx, budget):
            return None

    results = q_results_of(Never)
    assert all(r.passed for r in results)
    assert "drafted nothing" in results[0].detail


def test_nodes_are_grouped_by_depth_and_rank_among_siblings():
    draft = Draft(tokens=[1, 2, 3, 4, 5], parents=[-1, -1, 0, 0, 2])
    assert dc.group_keys(draft) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]


def test_thorough_draws_more(monkeypatch, mutant_plugins):
    seen = []
    real = dc.check_setting

    def spy(bench, setting, contexts, calls, seed):
        seen.append(calls)
        return real(bench, setting, contexts, 4, seed)

    monkeypatch.setattr(dc, "check_setting", spy)
    list(dc.drafter_checks(Bigram.name, {}, thorough=True))  # both modes by default
    list(dc.drafter_checks(Bigram.name, {}))
    n = len(dc.Q_SETTINGS)
    assert seen == [dc.Q_CALLS * dc.THOROUGH_FACTOR] * n + [dc.Q_CALLS] * n
