"""Checks of a drafter (with a verifier) end to end, through :class:`specd.Engine`.

The target is a tiny random Llama over eight tokens. Its sequence law over a short horizon
is enumerated exactly (float64 model, the same :func:`specd.sampling.warp` the engine uses)
and compared with sequences the engine samples with speculation on. At temperature 0 the
engine's output must equal plain greedy decoding token for token.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from ..engine import NO_DRAFTER, Engine
from ..sampling import SamplingParams, warp
from ..target import Target
from ..tiny import tiny_target
from .gtest import ALPHA, g_test
from .results import Result

VOCAB = 8
HORIZON = 4
#: The smallest departure from the target's law (KL, nats) the sampled check is sized to
#: catch: with ENGINE_SAMPLES sequences (16 cells, at most 15 df) the G-test rejects it with
#: probability >= 0.999 at ALPHA (docs/verification.md).
ENGINE_SENSITIVITY_KL = 0.02
ENGINE_SAMPLES = 2_400
SAMPLED: dict[str, Any] = dict(temperature=1.0, top_k=2, top_p=0.95)
GREEDY_TOKENS = 16
SEEDED_REPEATS = 20
MAX_DRAFT = 3
TARGET_LOGIT_SCALE = 8.0


def conformance_target() -> Target:
    """The tiny target every engine check uses: :func:`specd.tiny.tiny_model` with seed 0
    in float64, its output layer scaled so its distributions are peaked like a trained
    model's. ``tiny:0`` (the same weights, unscaled) is a flatter draft model of it."""
    return tiny_target(VOCAB, seed=0, logit_scale=TARGET_LOGIT_SCALE)


def conformance_prompt(target: Target, length: int = 12) -> list[int]:
    """The target's own greedy continuation of token 0. A random tiny model mostly follows
    its last token, so this falls into a cycle: drafters that copy from the context (n-gram,
    bigram) then propose what the target is likely to sample."""
    tokens = [0]
    while len(tokens) < length:
        tokens.append(int(_row(target, tokens, SamplingParams()).argmax()))
    return tokens


def _row(target: Target, tokens: Sequence[int], params: SamplingParams) -> torch.Tensor:
    """The target's warped distribution after ``tokens``, from a fresh cache."""
    logits = target.forward(target.new_cache(), list(tokens)).logits[-1]  # [V]
    return warp(logits, params)


def sequence_law(
    target: Target, prompt: Sequence[int], params: SamplingParams, horizon: int
) -> dict[tuple[int, ...], float]:
    """The exact probability of every continuation of ``horizon`` tokens."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(horizon):
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, mass in law.items():
            row = _row(target, [*prompt, *prefix], params).double()
            row = row / row.sum()
            for x in torch.nonzero(row > 0).flatten().tolist():
                nxt[prefix + (x,)] = mass * float(row[x])
        law = nxt
    return law


class _Capture(logging.Handler):
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
def _captured() -> Iterator[_Capture]:
    capture = _Capture()
    log = logging.getLogger("specd")
    log.addHandler(capture)
    try:
        yield capture
    finally:
        log.removeHandler(capture)


class EngineBench:
    """One engine over the conformance target for a drafter, with errors captured."""

    def __init__(self, drafter: str, options: dict[str, Any], verifier: str | None) -> None:
        self.drafter = drafter
        self.target = conformance_target()
        self.engine = Engine(
            self.target,
            drafter=drafter,
            verifier=verifier,
            exit_policy="fixed",
            max_draft=MAX_DRAFT,
            drafter_options={drafter: options} if options else None,
            plugin_timeout_s=None,  # exactness is checked here, not speed
        )

    def run(self, prompt: Sequence[int], params: SamplingParams, *, drafter: str | None = None):
        return self.engine.generate(list(prompt), params, drafter=drafter)

    def plugin_failure(self, completion) -> str | None:
        health = {k: v for k, v in self.engine.plugin_health().items() if v["failures"]}
        if health:
            return f"a plugin failed and the engine fell back to plain decoding: {health}"
        if completion is not None and completion.stats.fallback:
            return f"the engine fell back to plain decoding: {completion.stats.fallback}"
        return None


def engine_checks(
    drafter: str, options: dict[str, Any], verifiers: dict[str, str], seed: int = 0
) -> Iterator[Result]:
    """Greedy identity (when a greedy verifier is given), then the sampled law and seeding
    (when a sampled one is)."""
    if "greedy" in verifiers:
        yield check_greedy_identity(drafter, options, verifiers["greedy"])
    if "sampled" in verifiers:
        yield from check_sampled(drafter, options, verifiers["sampled"], seed=seed)


def check_greedy_identity(drafter: str, options: dict[str, Any], verifier: str) -> Result:
    """At temperature 0 the engine with the drafter emits what plain greedy decoding emits."""
    prop, subject = "engine/greedy-identity", f"drafter {drafter} with verifier {verifier}"
    with _captured() as capture:
        t0 = time.perf_counter()
        bench = EngineBench(drafter, options, verifier)
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
    samples: int = ENGINE_SAMPLES,
    seed: int = 0,
) -> Iterator[Result]:
    """Sampled sequences over the horizon follow the target's exact law; drafts were made
    and accepted; the same seed gives the same sequence."""
    subject = f"drafter {drafter} with verifier {verifier}"
    with _captured() as capture:
        t0 = time.perf_counter()
        bench = EngineBench(drafter, options, verifier)
        base = SamplingParams(max_tokens=HORIZON, **SAMPLED)
        prompt = conformance_prompt(bench.target)
        law = sequence_law(bench.target, prompt, base, HORIZON)
        counts: Counter[tuple[int, ...]] = Counter()
        first: dict[int, list[int]] = {}
        drafted = accepted = steps = 0
        for i in range(samples):
            s = seed * 1_000_003 + i
            out = bench.run(prompt, SamplingParams(max_tokens=HORIZON, seed=s, **SAMPLED))
            failure = bench.plugin_failure(out)
            if failure:
                yield Result(
                    "engine/law/sampled",
                    subject,
                    False,
                    failure,
                    {"prompt": prompt, "seed": s, "errors": capture.errors()},
                    time.perf_counter() - t0,
                )
                return
            counts[tuple(out.token_ids)] += 1
            drafted += out.stats.drafted
            accepted += out.stats.accepted
            steps += out.stats.target_steps
            if i < SEEDED_REPEATS:
                first[s] = out.token_ids
        test = g_test(counts, law)
        info = {
            "drafted": drafted,
            "accepted": accepted,
            "target_steps": steps,
            "mean_acceptance_length": round(samples * HORIZON / max(steps, 1), 3),
        }
        seconds = time.perf_counter() - t0
        if test.rejects(ALPHA):
            example: dict[str, Any] = {
                "prompt": prompt,
                "params": SAMPLED,
                "horizon": HORIZON,
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
            yield Result(
                "engine/law/sampled",
                subject,
                False,
                "sampled sequences do not follow the target's law: " + test.describe(),
                example,
                seconds,
                info,
            )
            return
        yield Result(
            "engine/law/sampled", subject, True, test.describe(), seconds=seconds, info=info
        )

        if drafted == 0:
            yield Result(
                "engine/drafts-exercised",
                subject,
                False,
                "the drafter proposed nothing on the conformance target, so the law check proved nothing",
                {"prompt": prompt},
            )
            return
        if accepted == 0:
            yield Result(
                "engine/drafts-exercised",
                subject,
                False,
                f"none of {drafted} drafted tokens was accepted on the conformance target, "
                "so the law check never exercised the accept path",
                {"prompt": prompt},
            )
            return
        yield Result(
            "engine/drafts-exercised",
            subject,
            True,
            f"{drafted} drafted, {accepted} accepted",
            info=info,
        )

        t1 = time.perf_counter()
        for (
            s,
            tokens,
        ) in first.items():  # after thousands of other requests: no hidden state leaks in
            again = bench.run(
                prompt, SamplingParams(max_tokens=HORIZON, seed=s, **SAMPLED)
            ).token_ids
            if again != tokens:
                yield Result(
                    "engine/seeded",
                    subject,
                    False,
                    f"seed {s} gave {tokens}, then {again}",
                    {"prompt": prompt, "seed": s},
                    time.perf_counter() - t1,
                )
                return
        yield Result(
            "engine/seeded",
            subject,
            True,
            f"{len(first)} seeds repeated identically",
            seconds=time.perf_counter() - t1,
        )
