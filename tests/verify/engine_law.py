"""The exact law of what the engine emits with a deterministic drafter and a given verifier.

With a deterministic drafter (``ngram``) the draft is a function of the tokens so far, so the
engine's randomness is only the verifier's: its walk is enumerated outcome by outcome
(:func:`exact.walk_law`) at every step the engine can reach within the horizon, with the
engine's budget rule (at most ``max_draft`` nodes, and room for the verifier's own token).
The result is the law of the first ``horizon`` emitted tokens, which for an exact verifier
equals the target's sequence law, and for a broken one says exactly how far it is from it:
the power analysis of the engine checks uses it (test_power.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import cache
from types import SimpleNamespace

import numpy as np
from exact import walk_law
from specd.plugins.ngram import NgramDrafter

from specd import SamplingParams
from specd.conformance.engine_scenarios import MAX_DRAFT, target_row
from specd.forward.target import Target

Rows = Callable[[tuple[int, ...]], np.ndarray]


def target_rows(target: Target, params: SamplingParams) -> Rows:
    """The target's warped row after a token sequence, in float64, cached."""

    @cache
    def row(tokens: tuple[int, ...]) -> np.ndarray:
        r = target_row(target, tokens, params).double().numpy()
        return r / r.sum()

    return row


def ngram_draft(options: dict | None = None) -> Callable:
    """The ``ngram`` drafter's proposal for a token sequence, from a fresh instance (its index
    over the tokens is what the engine's incremental one holds)."""

    def draft(tokens: Sequence[int], budget: int):
        drafter = NgramDrafter(**(options or {}))
        ctx = SimpleNamespace(tokens=list(tokens), corpus=None)
        drafter.start(ctx)
        return drafter.propose(ctx, budget)

    return draft


def engine_law(
    verifier,
    draft: Callable,
    rows: Rows,
    prompt: Sequence[int],
    horizon: int,
    max_draft: int = MAX_DRAFT,
) -> dict[tuple[int, ...], float]:
    """Law of the first ``horizon`` tokens the engine emits."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    pending: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while pending:
        emitted, mass = pending.pop()
        if len(emitted) >= horizon:
            law[emitted[:horizon]] += mass
            continue
        context = tuple(prompt) + emitted
        budget = min(max_draft, horizon - len(emitted) - 1)
        d = draft(context, budget) if budget > 0 else None
        if d is None or len(d) == 0:
            for x, px in enumerate(rows(context)):
                if px > 0:
                    pending.append((emitted + (x,), mass * px))
            continue
        p = np.stack([rows(context)] + [rows(context + _path(d, i)) for i in range(len(d))])
        q = None if d.q is None else d.q.double().numpy()
        for (path, token), pr in walk_law(verifier, d.tokens, d.parents, p, q).items():
            new = tuple(d.tokens[i] for i in path) + (token,)
            pending.append((emitted + new, mass * float(pr)))
    return dict(law)


def _path(d, node: int) -> tuple[int, ...]:
    return tuple(d.tokens[i] for i in d.path_to(node))
