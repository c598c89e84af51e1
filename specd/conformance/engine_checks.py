"""Checks of a drafter (with a verifier) end to end, through :class:`specd.Engine`.

The target is a tiny random Llama over eight tokens (float64, or its matrices stored as
quantized blocks with ``--weights``). Its sequence law over a short horizon is enumerated
exactly (from that same target, with the same :func:`specd.sampling.warp` the engine uses)
and compared with sequences the engine samples with speculation on. At temperature 0 the
engine's output must equal plain greedy decoding token for token.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..engine import NO_DRAFTER, Engine
from ..sampling import SamplingParams
from .engine_scenarios import (
    HORIZON,
    MAX_DRAFT,
    SCENARIOS,
    EngineScenario,
    conformance_prompt,
    conformance_target,
    engine_scenarios,
    sequence_law,
)
from .gtest import ALPHA, g_test
from .results import Result

__all__ = [
    "HORIZON",
    "MAX_DRAFT",
    "SCENARIOS",
    "EngineBench",
    "ErrorCapture",
    "captured_errors",
    "check_greedy_identity",
    "check_sampled",
    "conformance_prompt",
    "conformance_target",
    "engine_checks",
    "engine_scenarios",
    "sequence_law",
]

GREEDY_TOKENS = 16
SEEDED_REPEATS = 20


class ErrorCapture(logging.Handler):
    """Collects the engine's error records (a failing plugin is logged, not raised)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def errors(self) -> list[str]:
        out = []
        for rec in self.records:
            text = rec.getMessage()
            if rec.exc_info and rec.exc_info[1] is not None:
                text += f": {type(rec.exc_info[1]).__name__}: {rec.exc_info[1]}"
            out.append(text)
        return out


@contextmanager
def captured_errors() -> Iterator[ErrorCapture]:
    """The engine's error records while the block runs (a failing plugin is logged, not
    raised, so a check must look for them)."""
    capture = ErrorCapture()
    log = logging.getLogger("specd")
    log.addHandler(capture)
    try:
        yield capture
    finally:
        log.removeHandler(capture)


class EngineBench:
    """One engine over the conformance target for a drafter, with errors captured.

    :param weights: how the target's matrices are stored (:data:`.engine_scenarios.WEIGHTS`).
    """

    def __init__(
        self, drafter: str, options: dict[str, Any], verifier: str | None, weights: str = "f32"
    ) -> None:
        self.drafter = drafter
        self.verifier = verifier
        self.target = conformance_target(weights)
        self.engine = Engine(
            self.target,
            drafter=drafter,
            verifier=verifier,
            exit_policy="fixed",
            max_draft=MAX_DRAFT,
            drafter_options={drafter: options} if options else None,
            plugin_timeout_s=None,  # exactness is checked here, not speed
        )

    def run(
        self,
        prompt: Sequence[int],
        params: SamplingParams,
        *,
        drafter: str | None = None,
        cancel: Callable[[], bool] | None = None,
    ):
        return self.engine.generate(list(prompt), params, drafter=drafter, cancel=cancel)

    def plugin_failure(self, completion) -> str | None:
        health = {k: v for k, v in self.engine.plugin_health().items() if v["failures"]}
        if health:
            return f"a plugin failed and the engine fell back to plain decoding: {health}"
        if completion is not None and completion.stats.fallback:
            return f"the engine fell back to plain decoding: {completion.stats.fallback}"
        return None


def engine_checks(
    drafter: str,
    options: dict[str, Any],
    verifiers: dict[str, str],
    seed: int = 0,
    thorough: bool = False,
    weights: str = "f32",
) -> Iterator[Result]:
    """Greedy identity (when a greedy verifier is given), then the sampled laws and seeding
    (when a sampled one is); ``thorough`` samples more sequences per scenario, ``weights``
    says how the target's matrices are stored (:data:`.engine_scenarios.WEIGHTS`)."""
    if "greedy" in verifiers:
        yield check_greedy_identity(drafter, options, verifiers["greedy"], weights=weights)
    if "sampled" in verifiers:
        yield from check_sampled(
            drafter,
            options,
            verifiers["sampled"],
            engine_scenarios(thorough),
            seed=seed,
            weights=weights,
        )


def check_greedy_identity(
    drafter: str, options: dict[str, Any], verifier: str, weights: str = "f32"
) -> Result:
    """At temperature 0 the engine with the drafter emits what plain greedy decoding emits."""
    prop, subject = "engine/greedy-identity", f"drafter {drafter} with verifier {verifier}"
    with captured_errors() as capture:
        t0 = time.perf_counter()
        bench = EngineBench(drafter, options, verifier, weights)
        params = SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS)
        prompts = [conformance_prompt(bench.target), [1, 6, 2, 7, 3], [5]]
        drafted = 0
        for prompt in prompts:
            plain = bench.run(prompt, params, drafter=NO_DRAFTER).token_ids
            spec = bench.run(prompt, params)
            failure = bench.plugin_failure(spec)
            if failure:
                return Result(
                    prop,
                    subject,
                    False,
                    failure,
                    {"prompt": prompt, "errors": capture.errors()},
                    time.perf_counter() - t0,
                )
            drafted += spec.stats.drafted
            if spec.token_ids != plain:
                at = next(
                    (i for i, (a, b) in enumerate(zip(spec.token_ids, plain)) if a != b),
                    min(len(plain), len(spec.token_ids)),
                )
                return Result(
                    prop,
                    subject,
                    False,
                    f"differs from plain greedy decoding at token {at}",
                    {"prompt": prompt, "speculative": spec.token_ids, "plain": plain},
                    time.perf_counter() - t0,
                )
    return Result(
        prop,
        subject,
        True,
        f"{len(prompts)} prompts x {GREEDY_TOKENS} tokens identical ({drafted} drafted)",
        seconds=time.perf_counter() - t0,
    )


def check_sampled(
    drafter: str,
    options: dict[str, Any],
    verifier: str,
    scenarios: Sequence[EngineScenario] = SCENARIOS,
    seed: int = 0,
    weights: str = "f32",
) -> Iterator[Result]:
    """For each scenario, sampled sequences over the horizon follow the target's exact law;
    then drafts were made and accepted, and the same seed gives the same sequence."""
    subject = f"drafter {drafter} with verifier {verifier}"
    with captured_errors() as capture:
        bench = EngineBench(drafter, options, verifier, weights)
        totals: Counter[str] = Counter()
        first: dict[int, tuple[EngineScenario, list[int]]] = {}
        for scenario in scenarios:
            result = _check_law(bench, scenario, seed, totals, first, capture)
            yield result
            if not result.passed:
                return
    yield _check_exercised(subject, totals)
    if totals["accepted"]:
        yield _check_seeded(bench, subject, first)


def _check_law(
    bench: EngineBench,
    scenario: EngineScenario,
    seed: int,
    totals: Counter[str],
    first: dict[int, tuple[EngineScenario, list[int]]],
    capture: ErrorCapture,
) -> Result:
    prop = f"engine/law/{scenario.name}"
    subject = f"drafter {bench.drafter} with verifier {bench.verifier}"
    t0 = time.perf_counter()
    prompt = scenario.prompt(bench.target)
    law = sequence_law(bench.target, prompt, scenario.sampling(), scenario.horizon)
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = steps = 0
    for i in range(scenario.samples):
        s = seed * 1_000_003 + scenario.seed_offset + i
        out = bench.run(prompt, scenario.sampling(s))
        failure = bench.plugin_failure(out)
        if failure:
            return Result(
                prop,
                subject,
                False,
                failure,
                {"prompt": prompt, "seed": s, "errors": capture.errors()},
                time.perf_counter() - t0,
            )
        counts[tuple(out.token_ids)] += 1
        drafted += out.stats.drafted
        accepted += out.stats.accepted
        steps += out.stats.target_steps
        if i < SEEDED_REPEATS:
            first[s] = (scenario, out.token_ids)
    totals.update(drafted=drafted, accepted=accepted)
    test = g_test(counts, law)
    info = {
        "drafted": drafted,
        "accepted": accepted,
        "target_steps": steps,
        "mean_acceptance_length": round(scenario.samples * scenario.horizon / max(steps, 1), 3),
    }
    seconds = time.perf_counter() - t0
    if not test.rejects(ALPHA):
        return Result(prop, subject, True, test.describe(), seconds=seconds, info=info)
    example: dict[str, Any] = {
        "prompt": prompt,
        "params": scenario.params,
        "horizon": scenario.horizon,
        "test": test.describe(),
    }
    w = test.worst()
    if test.impossible is not None:
        example["sequence"] = list(test.impossible)
    elif w is not None:
        example.update(
            sequence=w.key,
            observed_frequency=w.observed / test.n,
            exact_probability=w.expected / test.n,
        )
    return Result(
        prop,
        subject,
        False,
        "sampled sequences do not follow the target's law: " + test.describe(),
        example,
        seconds,
        info,
    )


def _check_exercised(subject: str, totals: Counter[str]) -> Result:
    """A drafter that proposes nothing, or nothing accepted, passes the law vacuously."""
    prop = "engine/drafts-exercised"
    drafted, accepted = totals["drafted"], totals["accepted"]
    if drafted == 0:
        return Result(
            prop,
            subject,
            False,
            "the drafter proposed nothing on the conformance target, so the law check proved nothing",
        )
    if accepted == 0:
        return Result(
            prop,
            subject,
            False,
            f"none of {drafted} drafted tokens was accepted on the conformance target, "
            "so the law check never exercised the accept path",
        )
    return Result(prop, subject, True, f"{drafted} drafted, {accepted} accepted")


def _check_seeded(
    bench: EngineBench, subject: str, first: dict[int, tuple[EngineScenario, list[int]]]
) -> Result:
    """After thousands of other requests the same seed gives the same sequence: no hidden
    state leaks from one request into the next."""
    t0 = time.perf_counter()
    for s, (scenario, tokens) in first.items():
        prompt = scenario.prompt(bench.target)
        again = bench.run(prompt, scenario.sampling(s)).token_ids
        if again != tokens:
            return Result(
                "engine/seeded",
                subject,
                False,
                f"seed {s} gave {tokens}, then {again}",
                {"prompt": prompt, "seed": s, "params": scenario.params},
                time.perf_counter() - t0,
            )
    return Result(
        "engine/seeded",
        subject,
        True,
        f"{len(first)} seeds repeated identically",
        seconds=time.perf_counter() - t0,
    )
