"""Exact laws, in rational arithmetic, of what a verifier emits.

:meth:`RejectionVerifier.walk` uses only arithmetic operators and indexing, so it runs here
unchanged on numpy object arrays of :class:`fractions.Fraction`. Its randomness goes through
a chance object; :func:`walk_law` replays the walk once per sequence of random outcomes
(accept or reject, which token was drawn), weighting each by its exact probability, so the
result is the walk's output law with no sampling and no rounding.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

Prefix = tuple[int, ...]
Law = dict  # outcome -> Fraction


def row(weights: Iterable) -> np.ndarray:
    """A normalised rational row (object array) from non-negative weights."""
    fr = [Fraction(w) for w in weights]
    total = sum(fr)
    if total <= 0:
        raise ValueError("a row needs positive mass")
    return np.array([w / total for w in fr], dtype=object)


def stack(rows: Sequence[np.ndarray]) -> np.ndarray:
    out = np.empty((len(rows), len(rows[0])), dtype=object)
    for i, r in enumerate(rows):
        out[i] = r
    return out


class ExactLM:
    """A distribution for every prefix shorter than ``horizon``, in rationals."""

    def __init__(self, vocab: int, horizon: int, rows: dict[Prefix, np.ndarray]) -> None:
        self.vocab = vocab
        self.horizon = horizon
        self.rows = rows

    @classmethod
    def from_table(cls, table) -> ExactLM:
        """The exact values of a :class:`specd.conformance.synthetic.TableLM`'s float32 rows."""
        rows = {}
        for length in range(table.horizon):
            for prefix in itertools.product(range(table.vocab), repeat=length):
                rows[prefix] = row(Fraction(float(v)) for v in table.row(prefix))
        return cls(table.vocab, table.horizon, rows)

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        return self.rows[tuple(prefix)]

    def sequence_law(self, horizon: int | None = None) -> Law:
        horizon = self.horizon if horizon is None else horizon
        law: Law = {(): Fraction(1)}
        for _ in range(horizon):
            nxt: Law = {}
            for prefix, mass in law.items():
                for x, px in enumerate(self(prefix)):
                    if px > 0:
                        nxt[prefix + (x,)] = mass * px
            law = nxt
        return law

    def extend(self, emitted: Law, horizon: int | None = None) -> Law:
        """Law of emitted sequences continued by this model up to the horizon."""
        horizon = self.horizon if horizon is None else horizon
        out: Law = defaultdict(Fraction)
        stack_: list[tuple[Prefix, Fraction]] = [
            (tuple(seq[:horizon]), m) for seq, m in emitted.items()
        ]
        while stack_:
            seq, mass = stack_.pop()
            if len(seq) >= horizon:
                out[seq] += mass
                continue
            for x, px in enumerate(self(seq)):
                if px > 0:
                    stack_.append((seq + (x,), mass * px))
        return dict(out)


# -- enumerating the walk -----------------------------------------------------------------


class _Branch(Exception):
    def __init__(self, options: list[tuple[object, Fraction]]) -> None:
        self.options = options


class ScriptedChance:
    """Replays a script of outcomes; at the first unscripted choice raises :class:`_Branch`
    with every possible outcome and its probability. ``fixed_u`` makes coins deterministic
    (u < probability), as a verifier with a constant u does."""

    def __init__(self, script: Sequence[object], fixed_u: float | None = None) -> None:
        self.script = script
        self.i = 0
        self.prob = Fraction(1)
        self.fixed_u = fixed_u

    def _choose(self, options: list[tuple[object, Fraction]]) -> object:
        options = [(o, pr) for o, pr in options if pr > 0]
        if self.i < len(self.script):
            outcome = self.script[self.i]
            self.i += 1
            self.prob *= dict(options)[outcome]
            return outcome
        raise _Branch(options)

    def coin(self, probability) -> bool:
        if self.fixed_u is not None:
            return self.fixed_u < probability
        a = Fraction(probability)
        if not 0 <= a <= 1:
            raise ValueError(f"acceptance probability {a} outside [0, 1]")
        return bool(self._choose([(True, a), (False, 1 - a)]))

    def draw(self, r) -> int:
        weights = [Fraction(v) for v in r]
        total = sum(weights)
        return int(self._choose([(x, w / total) for x, w in enumerate(weights)]))  # type: ignore[arg-type]


def walk_law(
    verifier, tokens: Sequence[int], parents: Sequence[int], p: np.ndarray, q: np.ndarray | None
) -> Law:
    """The exact law of ``verifier.walk``'s (path, token)."""
    law: Law = defaultdict(Fraction)
    pending: list[tuple] = [()]
    fixed_u = getattr(verifier, "fixed_u", None)
    while pending:
        script = pending.pop()
        chance = ScriptedChance(script, fixed_u)
        try:
            path, token = verifier.walk(list(tokens), list(parents), p, q, chance)
        except _Branch as b:
            pending.extend(script + (o,) for o, _ in b.options)
            continue
        law[(tuple(path), int(token))] += chance.prob
    return dict(law)


# -- drafts -------------------------------------------------------------------------------


@dataclass
class ExactDraft:
    tokens: list[int]
    parents: list[int]
    q: np.ndarray | None  # [N, V] rows handed to the verifier, or None (deterministic)
    prob: Fraction  # probability that the drafter proposes exactly this


def path_tokens(tokens: Sequence[int], parents: Sequence[int], node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tokens[node])
        node = parents[node]
    return out[::-1]


def sampled_drafts(parents: Sequence[int], q: ExactLM) -> list[ExactDraft]:
    """Every draft whose nodes are drawn independently from q given their path (i.i.d.
    siblings), with its probability."""
    drafts = [ExactDraft([], [], None, Fraction(1))]
    for i, parent in enumerate(parents):
        nxt = []
        for d in drafts:
            prefix = path_tokens(d.tokens, parents[:i], parent) if parent >= 0 else []
            qrow = q(prefix)
            for x, qx in enumerate(qrow):
                if qx > 0:
                    rows = [] if d.q is None else list(d.q)
                    nxt.append(
                        ExactDraft(
                            d.tokens + [x],
                            list(parents[: i + 1]),
                            stack(rows + [qrow]),
                            d.prob * qx,
                        )
                    )
        drafts = nxt
    return drafts


def fixed_draft(parents: Sequence[int], tokens: Sequence[int]) -> list[ExactDraft]:
    return [ExactDraft(list(tokens), list(parents), None, Fraction(1))]


def target_rows(d: ExactDraft, p: ExactLM) -> np.ndarray:
    return stack([p(())] + [p(path_tokens(d.tokens, d.parents, i)) for i in range(len(d.tokens))])


def emitted_law(verifier, drafts: Iterable[ExactDraft], p: ExactLM) -> Law:
    """Law of (accepted count, emitted tokens) over the drafter's and the verifier's randomness."""
    out: Law = defaultdict(Fraction)
    for d in drafts:
        for (path, token), mass in walk_law(
            verifier, d.tokens, d.parents, target_rows(d, p), d.q
        ).items():
            emitted = tuple(d.tokens[i] for i in path) + (token,)
            out[(len(path), emitted)] += d.prob * mass
    return dict(out)


def sequence_law_of(emitted: Law, p: ExactLM, horizon: int) -> Law:
    """Law of the emitted tokens continued by the target up to ``horizon``."""
    tokens_only: Law = defaultdict(Fraction)
    for (_, seq), mass in emitted.items():
        tokens_only[seq] += mass
    return p.extend(dict(tokens_only), horizon)


def marginal(law: Law, fn: Callable) -> Law:
    out: Law = defaultdict(Fraction)
    for k, v in law.items():
        out[fn(k)] += v
    return dict(out)
