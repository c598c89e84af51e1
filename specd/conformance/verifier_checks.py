"""Checks of a verifier on its own, treated as a black box.

The verifier is handed what the engine would hand it (a draft and the target's warped rows)
and its output is compared with the target's law. The sampled check does not assume how the
verifier decides, only what any exact verifier must satisfy: its emitted tokens, continued by
the target up to a horizon, are distributed exactly as the target's own sequences.
"""

from __future__ import annotations

import random
import time
import traceback
from collections import Counter
from collections.abc import Iterator

import torch

from ..api import Verifier
from ..draft import Draft, Verdict
from ..sampling import SamplingParams
from .gtest import ALPHA, g_test
from .results import Result
from .synthetic import Scenario, scenarios

#: The smallest departure from the target's law (KL, nats) each scenario is sized to catch:
#: with VERIFIER_SAMPLES samples the G-test rejects it with probability >= 0.999 at ALPHA
#: (the scenarios have about 17 df after pooling; docs/verification.md has the analysis).
VERIFIER_SENSITIVITY_KL = 0.005
VERIFIER_SAMPLES = 12_000
GREEDY_CASES = 300
SEEDED_CALLS = 200

SAMPLED = SamplingParams(temperature=1.0)
GREEDY = SamplingParams(temperature=0.0)


def verifier_checks(verifier: Verifier, modes: set[str], seed: int = 0) -> Iterator[Result]:
    """The checks for the decoding modes the verifier is used for, cheapest first."""
    if "greedy" in modes:
        yield check_greedy_identity(verifier, seed=seed)
    if "sampled" in modes:
        yield check_seeded(verifier, seed=seed)
        for scenario in scenarios():
            yield check_law(verifier, scenario, seed=seed)


def emitted(draft: Draft, verdict: Verdict) -> list[int]:
    """The tokens a verdict appends: the accepted path's tokens, then the target's token."""
    return [draft.tokens[i] for i in verdict.path] + [int(verdict.token)]


def _bad_verdict(draft: Draft, verdict: object, vocab: int) -> str | None:
    if not isinstance(verdict, Verdict):
        return f"returned {type(verdict).__name__}, not a Verdict"
    prev = -1
    for node in verdict.path:
        if not (isinstance(node, int) and 0 <= node < len(draft) and draft.parents[node] == prev):
            return f"path {verdict.path} is not a root path of the draft"
        prev = node
    if not 0 <= int(verdict.token) < vocab:
        return f"token {verdict.token} is outside the vocabulary"
    return None


def _draft_json(draft: Draft) -> dict:
    out: dict = {"tokens": draft.tokens, "parents": draft.parents}
    if draft.q is not None:
        out["q"] = [[round(v, 4) for v in row] for row in draft.q.tolist()]
    return out


def check_law(
    verifier: Verifier, scenario: Scenario, samples: int = VERIFIER_SAMPLES, seed: int = 0
) -> Result:
    """Emitted tokens, continued by the target, have the target's sequence law."""
    prop = f"verifier/law/{scenario.name}"
    subject = f"verifier {verifier.name}"
    t0 = time.perf_counter()
    rng = random.Random(seed * 7919 + 17)
    generator = torch.Generator().manual_seed(seed)
    counts: Counter[tuple[int, ...]] = Counter()
    accepted: Counter[int] = Counter()
    target = scenario.target
    for _ in range(samples):
        draft = scenario.draft(rng)
        p = scenario.target_rows(draft)
        try:
            verdict = verifier.verify(draft, p.clone(), scenario.params, generator)
        except Exception as exc:  # noqa: BLE001 - a plugin's error is a finding
            return Result(
                prop,
                subject,
                False,
                f"verify raised {type(exc).__name__}: {exc}",
                {"draft": _draft_json(draft), "traceback": traceback.format_exc(limit=5)},
                time.perf_counter() - t0,
            )
        bad = _bad_verdict(draft, verdict, target.vocab)
        if bad:
            return Result(
                prop,
                subject,
                False,
                bad,
                {"draft": _draft_json(draft), "verdict": repr(verdict)},
                time.perf_counter() - t0,
            )
        accepted[len(verdict.path)] += 1
        counts[target.extend(emitted(draft, verdict), rng)] += 1
    test = g_test(counts, target.sequence_law())
    info = {"accepted_counts": dict(sorted(accepted.items()))}
    seconds = time.perf_counter() - t0
    if not test.rejects(ALPHA):
        return Result(prop, subject, True, test.describe(), seconds=seconds, info=info)
    example = {**scenario.describe(), "test": test.describe()}
    if test.impossible is not None:
        example["sequence"] = list(test.impossible)
    elif test.worst() is not None:
        w = test.worst()
        assert w is not None
        example.update(
            sequence=w.key,
            observed_frequency=w.observed / test.n,
            exact_probability=w.expected / test.n,
        )
    return Result(
        prop,
        subject,
        False,
        "the emitted tokens do not follow the target's law: " + test.describe(),
        example,
        seconds,
        info,
    )


def check_greedy_identity(verifier: Verifier, cases: int = GREEDY_CASES, seed: int = 0) -> Result:
    """At temperature 0, the verdict is what plain greedy decoding would emit: follow the
    child carrying the argmax while there is one, then emit the argmax."""
    prop, subject = "verifier/greedy-identity", f"verifier {verifier.name}"
    t0 = time.perf_counter()
    rng = random.Random(seed * 104729 + 3)
    vocab = 6
    for case in range(cases):
        draft, argmax = _random_greedy_case(rng, vocab, deterministic=case % 2 == 0)
        p = torch.zeros(len(draft) + 1, vocab)
        p[torch.arange(len(draft) + 1), torch.tensor(argmax)] = (
            1.0  # what warp gives at temperature 0
        )
        want: list[int] = []
        node = -1
        while True:
            nxt = next(
                (c for c in draft.children(node) if draft.tokens[c] == argmax[node + 1]), None
            )
            if nxt is None:
                want.append(argmax[node + 1])
                break
            want.append(draft.tokens[nxt])
            node = nxt
        try:
            verdict = verifier.verify(draft, p, GREEDY, torch.Generator().manual_seed(case))
        except Exception as exc:  # noqa: BLE001
            return Result(
                prop,
                subject,
                False,
                f"verify raised {type(exc).__name__}: {exc}",
                {"draft": _draft_json(draft), "argmax": argmax},
                time.perf_counter() - t0,
            )
        bad = _bad_verdict(draft, verdict, vocab)
        got = emitted(draft, verdict) if bad is None else None
        if got != want:
            return Result(
                prop,
                subject,
                False,
                bad or f"emitted {got}, greedy decoding emits {want}",
                {
                    "draft": _draft_json(draft),
                    "argmax_per_row": argmax,
                    "emitted": got,
                    "greedy": want,
                },
                time.perf_counter() - t0,
            )
    return Result(
        prop,
        subject,
        True,
        f"{cases} random drafts match greedy decoding",
        seconds=time.perf_counter() - t0,
    )


def _random_greedy_case(
    rng: random.Random, vocab: int, deterministic: bool
) -> tuple[Draft, list[int]]:
    n = rng.randint(1, 6)
    argmax = [rng.randrange(vocab) for _ in range(n + 1)]  # the target's choice at each row
    tokens: list[int] = []
    parents: list[int] = []
    for i in range(n):
        parent = rng.randint(-1, i - 1)
        taken = {tokens[c] for c in range(i) if parents[c] == parent}
        choices = [t for t in range(vocab) if not (deterministic and t in taken)]
        if not choices:
            break
        good = argmax[parent + 1]
        tokens.append(good if good in choices and rng.random() < 0.5 else rng.choice(choices))
        parents.append(parent)
    argmax = argmax[: len(tokens) + 1]
    if deterministic:
        return Draft(tokens, parents), argmax
    q = torch.rand(
        len(tokens), vocab, generator=torch.Generator().manual_seed(rng.randrange(2**31))
    )
    q[torch.arange(len(tokens)), torch.tensor(tokens)] += 0.5  # the drafted token is possible
    return Draft(tokens, parents, q / q.sum(-1, keepdim=True)), argmax


def check_seeded(verifier: Verifier, calls: int = SEEDED_CALLS, seed: int = 0) -> Result:
    """The same generator seed gives the same verdicts."""
    prop, subject = "verifier/seeded", f"verifier {verifier.name}"
    t0 = time.perf_counter()
    rng = random.Random(seed + 5)
    runs = []
    every = scenarios()
    cases = [(s, s.draft(rng)) for s in every for _ in range(calls // len(every))]
    for _ in range(2):
        generator = torch.Generator().manual_seed(seed + 1234)
        out = []
        for scenario, draft in cases:
            try:
                verdict = verifier.verify(
                    draft, scenario.target_rows(draft), scenario.params, generator
                )
            except Exception as exc:  # noqa: BLE001
                return Result(
                    prop,
                    subject,
                    False,
                    f"verify raised {type(exc).__name__}: {exc}",
                    {"draft": _draft_json(draft)},
                    time.perf_counter() - t0,
                )
            out.append((list(verdict.path), int(verdict.token)))
        runs.append(out)
    for i, (a, b) in enumerate(zip(*runs)):
        if a != b:
            return Result(
                prop,
                subject,
                False,
                f"call {i} gave {a} then {b} from the same seed",
                {"draft": _draft_json(cases[i][1])},
                time.perf_counter() - t0,
            )
    return Result(
        prop,
        subject,
        True,
        f"{len(cases)} calls repeated identically",
        seconds=time.perf_counter() - t0,
    )
