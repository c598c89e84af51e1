"""``specd verify``: passes for every built-in plugin, fails naming the property and a
counterexample for broken ones, exits 2 for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specd import cli
from specd.conformance import drafter_checks
from specd.registry import registered

BUILTIN_DRAFTERS = sorted(
    name
    for name, info in registered("drafters").items()
    if info.module.startswith("specd.plugins.")
)


def verify(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["verify", *args])
    out, err = capsys.readouterr()
    return code, out, err


BUILTIN_VERIFIERS = sorted(
    name
    for name, info in registered("verifiers").items()
    if info.module.startswith("specd.plugins.")
)
VERIFIER_PROPERTIES = {
    "greedy": {"verifier/greedy-identity"},
    "sampled": {
        "verifier/seeded",
        "verifier/law/chain-sampled",
        "verifier/law/chain-deterministic",
        "verifier/law/tree-iid",
        "verifier/law/tree-distinct",
        "verifier/law/warped",
    },
}


#: Draft calls per q-honesty setting here: a third of the command's, and still enough to
#: catch q taken from the raw logits while the tokens come from the warped ones.
QUICK_Q_CALLS = 500


@pytest.mark.slow
@pytest.mark.parametrize("drafter", BUILTIN_DRAFTERS)
def test_passes_for_every_builtin_drafter(capsys, monkeypatch, drafter):
    monkeypatch.setattr(drafter_checks, "Q_CALLS", QUICK_Q_CALLS)
    code, out, err = verify(capsys, "--drafter", drafter, "--json")
    report = json.loads(out)
    assert code == 0, json.dumps(report, indent=1)
    assert report["passed"] and report["verifiers"] == {"greedy": "greedy", "sampled": "rejection"}
    q_honesty = [r for r in report["results"] if r["property"] == "drafter/q-honesty"]
    assert [r["info"]["setting"] for r in q_honesty] == [s.name for s in drafter_checks.Q_SETTINGS]
    assert {r["property"] for r in report["results"]} == VERIFIER_PROPERTIES[
        "greedy"
    ] | VERIFIER_PROPERTIES["sampled"] | {
        "drafter/q-honesty",
        "engine/greedy-identity",
        "engine/law/sampled",
        "engine/law/warped",
        "engine/drafts-exercised",
        "engine/seeded",
    }


@pytest.mark.slow
@pytest.mark.parametrize("verifier", BUILTIN_VERIFIERS)
def test_passes_for_every_builtin_verifier_alone(capsys, verifier):
    code, out, err = verify(capsys, "--verifier", verifier, "--json")
    report = json.loads(out)
    assert code == 0, json.dumps(report, indent=1)
    modes = set(report["verifiers"])
    assert modes == set(registered("verifiers")[verifier].cls.exact_for)
    want = set().union(*(VERIFIER_PROPERTIES[m] for m in modes))
    assert {r["property"] for r in report["results"]} == want


@pytest.mark.slow
def test_a_broken_drafter_fails_naming_the_property_and_a_counterexample(
    capsys, monkeypatch, broken_plugins
):
    """Argmax drafted, softmax reported: its own word fails first, and the engine's law too."""
    monkeypatch.setattr(drafter_checks, "Q_CALLS", QUICK_Q_CALLS)
    code, out, err = verify(capsys, "--drafter", "broken_argmax_q", "--keep-going")
    assert code == 1, out + err
    assert "FAIL drafter/q-honesty" in out and "reported_q_mean" in out
    assert "FAIL engine/law/sampled" in out
    assert "counterexample" in out and "sequence" in out
    assert "FAILED drafter/q-honesty" in err


def test_a_broken_verifier_fails_at_once(capsys, broken_plugins):
    code, out, err = verify(
        capsys, "--drafter", "ngram", "--verifier", "broken_fresh_sample", "--json"
    )
    assert code == 1
    report = json.loads(out)
    failed = [r for r in report["results"] if not r["passed"]]
    assert [r["property"] for r in failed] == ["verifier/law/chain-sampled"]
    assert failed[0]["counterexample"]["sequence"]


def specd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "specd.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_command_line_checks_only_the_modes_a_named_verifier_claims():
    done = specd("verify", "--drafter", "ngram", "--verifier", "greedy", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verifiers"] == {"greedy": "greedy"}
    assert {r["property"] for r in report["results"]} == {
        "verifier/greedy-identity",
        "drafter/q-honesty",
        "engine/greedy-identity",
    }
    q = [r["info"]["setting"] for r in report["results"] if r["property"] == "drafter/q-honesty"]
    assert q == ["greedy"]  # the sampled settings matter only to a sampling verifier


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "name a --drafter, a --verifier, or both"),
        (["--drafter", "nope"], "unknown drafter 'nope'"),
        (["--drafter", "ngram", "--verifier", "nope"], "unknown verifier 'nope'"),
        (["--drafter", "draft_model", "--drafter-option", "tree=bush"], "tree must be one of"),
        (["--drafter", "ngram", "--drafter-option", "novalue"], "KEY=VALUE"),
        # the checks seed their generators with the base seed times up to about 8e9
        (["--drafter", "ngram", "--seed", str(10**23)], "--seed must be an integer from"),
        (["--verifier", "greedy", "--seed", str(-(2**30) - 1)], "--seed must be an integer from"),
    ],
)
def test_bad_input_exits_2_naming_it(capsys, args, needle):
    code, out, err = verify(capsys, *args)
    assert code == 2
    assert needle in err


def test_thorough_reaches_the_engine_checks_with_four_times_the_samples(capsys, monkeypatch):
    """The flag is wired through to the scenarios the engine samples."""
    from specd.conformance import suite
    from specd.conformance.engine_scenarios import SCENARIOS, engine_scenarios

    seen = []

    def engine_checks(drafter, options, verifiers, seed=0, thorough=False, weights="f32"):
        seen.append(thorough)
        return iter(())

    def q_checks(drafter, options, modes, seed=0, thorough=False, weights="f32"):
        seen.append(("q", thorough))
        return iter(())

    monkeypatch.setattr(suite, "engine_checks", engine_checks)
    monkeypatch.setattr(suite, "drafter_checks", q_checks)
    monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    assert verify(capsys, "--drafter", "ngram", "--thorough")[0] == 0
    assert verify(capsys, "--drafter", "ngram")[0] == 0
    assert seen == [("q", True), True, ("q", False), False]
    assert [s.samples for s in engine_scenarios(thorough=True)] == [
        4 * s.samples for s in SCENARIOS
    ]


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1, -1])
def test_the_largest_base_seeds_reach_every_check(capsys, sign):
    """Guards against a base seed the command accepts overflowing a generator's 64 bits
    inside a check (``--seed 10**23`` raised out of the drafter's checks)."""
    from specd.conformance.suite import MAX_SEED

    code, out, err = verify(capsys, "--drafter", "ngram", "--seed", str(sign * MAX_SEED))
    assert code == 0, out + err
    assert "Overflow" not in err
