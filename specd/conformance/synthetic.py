"""Synthetic models for checking a verifier on its own: a distribution for every prefix.

A :class:`TableLM` over a vocabulary of a few tokens stands in for the target (p) and for the
drafter (q). A :class:`Scenario` says how a draft is built from q (a sampled chain, a
deterministic chain, a tree with i.i.d. children, a tree with distinct children) and hands the
verifier exactly what the engine would: the draft and the target's rows at the root and after
every node. The rows at the root are planted with the edge cases the verifier must get
right: q(x) = 0 where p(x) > 0, p(x) = 0 where q(x) > 0, p(x) < q(x) and p(x) > q(x); after
token 0, p equals q; after token 2, p is one-hot.

One more scenario hands the rows over with sampling parameters that warp (temperature 0.6,
top-k 3, top-p 0.9): the rows are already warped, so a verifier that warps them again is
caught. Its planted rows put p(x) / q(x) near 1/3 for the likeliest drafts, where a bias in
the exponent of the accept rule (accepting with (p/q)^g) moves the acceptance most.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..draft import Draft
from ..sampling import SamplingParams, warp

Prefix = tuple[int, ...]


class TableLM:
    """One float32 distribution per prefix shorter than ``horizon`` (the rows a verifier is
    handed), plus their exact values as float64 for the law."""

    def __init__(
        self,
        vocab: int,
        horizon: int,
        seed: int,
        planted: dict[Prefix, Sequence[float]] | None = None,
        params: SamplingParams | None = None,
    ) -> None:
        rng = random.Random(seed)
        self.vocab = vocab
        self.horizon = horizon
        self._rows: dict[Prefix, torch.Tensor] = {}
        planted = planted or {}
        for length in range(horizon):
            for prefix in itertools.product(range(vocab), repeat=length):
                weights = planted.get(prefix)
                if weights is None:
                    weights = _random_weights(rng, vocab)
                    if params is not None:  # a row as warp gives it: top-k and top-p cut
                        weights = warp(torch.tensor(weights).log(), params).tolist()
                row = torch.tensor(weights, dtype=torch.float64)
                self._rows[prefix] = (row / row.sum()).float()

    def row(self, prefix: Sequence[int]) -> torch.Tensor:
        """``[V]`` float32: the distribution after ``prefix``."""
        return self._rows[tuple(prefix)]

    def probs(self, prefix: Sequence[int]) -> list[float]:
        """The exact values of :meth:`row` (float32 numbers, renormalised in float64)."""
        row = self._rows[tuple(prefix)].double()
        return (row / row.sum()).tolist()

    def sample(self, prefix: Sequence[int], rng: random.Random) -> int:
        return rng.choices(range(self.vocab), weights=self.probs(prefix))[0]

    def argmax(self, prefix: Sequence[int]) -> int:
        return int(self._rows[tuple(prefix)].argmax())

    def extend(self, tokens: Sequence[int], rng: random.Random) -> tuple[int, ...]:
        """``tokens`` continued by samples from this model up to the horizon."""
        out = list(tokens[: self.horizon])
        while len(out) < self.horizon:
            out.append(self.sample(out, rng))
        return tuple(out)

    def sequence_law(self) -> dict[Prefix, float]:
        """The exact probability of every sequence of ``horizon`` tokens."""
        law: dict[Prefix, float] = {(): 1.0}
        for _ in range(self.horizon):
            nxt: dict[Prefix, float] = {}
            for prefix, mass in law.items():
                for x, px in enumerate(self.probs(prefix)):
                    if px > 0:
                        nxt[prefix + (x,)] = mass * px
            law = nxt
        return law


def _random_weights(rng: random.Random, vocab: int) -> list[float]:
    weights = [0.0 if rng.random() < 0.3 else float(rng.randint(1, 9)) for _ in range(vocab)]
    if not any(weights):
        weights[rng.randrange(vocab)] = 1.0
    return weights


SHAPES = ("chain-sampled", "chain-deterministic", "tree-iid", "tree-distinct")


@dataclass
class Scenario:
    """How a draft is built from the draft model q, and what the verifier is handed.

    ``chain-sampled``: two tokens, each drawn from q. ``chain-deterministic``: q's argmax
    twice (q is None). ``tree-iid``: two root children drawn i.i.d. from q, the first with one
    child drawn from q. ``tree-distinct``: q's three most likely distinct tokens at the root,
    the first with q's argmax as its child (q is None).
    """

    shape: str
    target: TableLM
    drafter: TableLM
    params: SamplingParams = SamplingParams(temperature=1.0)
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.shape

    @property
    def sampled(self) -> bool:
        return self.shape in ("chain-sampled", "tree-iid")

    def draft(self, rng: random.Random) -> Draft:
        q = self.drafter
        if self.shape == "chain-sampled":
            d1 = q.sample((), rng)
            d2 = q.sample((d1,), rng)
            return Draft.chain([d1, d2], torch.stack([q.row(()), q.row((d1,))]))
        if self.shape == "chain-deterministic":
            d1 = q.argmax(())
            return Draft.chain([d1, q.argmax((d1,))])
        if self.shape == "tree-iid":
            a, b = q.sample((), rng), q.sample((), rng)
            c = q.sample((a,), rng)
            return Draft([a, b, c], [-1, -1, 0], torch.stack([q.row(()), q.row(()), q.row((a,))]))
        if self.shape == "tree-distinct":
            order = sorted(range(q.vocab), key=lambda x: (-float(q.row(())[x]), x))[:3]
            return Draft([*order, q.argmax((order[0],))], [-1, -1, -1, 0])
        raise ValueError(f"unknown scenario shape {self.shape!r}")

    def target_rows(self, draft: Draft) -> torch.Tensor:
        """``[N + 1, V]``: the target's rows at the root and after each node."""
        rows = [self.target.row(())]
        for i in range(len(draft)):
            rows.append(self.target.row([draft.tokens[j] for j in draft.path_to(i)]))
        return torch.stack(rows)

    def describe(self) -> dict:
        return {
            "shape": self.shape,
            "params": {k: getattr(self.params, k) for k in ("temperature", "top_k", "top_p")},
            "p_root": [round(v, 4) for v in self.target.probs(())],
            "q_root": [round(v, 4) for v in self.drafter.probs(())],
        }


VOCAB, HORIZON = 4, 3
P_ROOT = (0.4, 0.35, 0.25, 0.0)
Q_ROOT = (0.5, 0.0, 0.2, 0.3)


def scenario_models() -> tuple[TableLM, TableLM]:
    """The target and draft tables every verifier scenario uses."""
    target = TableLM(VOCAB, HORIZON, seed=11, planted={(): P_ROOT, (2,): (0.0, 0.0, 1.0, 0.0)})
    drafter = TableLM(VOCAB, HORIZON, seed=12, planted={(): Q_ROOT, (0,): target.probs((0,))})
    return target, drafter


#: The warped scenario's sampling parameters and planted rows: p(x) / q(x) is 1/3 for the
#: likeliest root draft and for the likeliest draft after it.
WARP_PARAMS = SamplingParams(temperature=0.6, top_k=3, top_p=0.9)
WARPED_P_ROOT = (0.2, 0.5, 0.3, 0.0)
WARPED_Q_ROOT = (0.6, 0.15, 0.25, 0.0)
WARPED_P_AFTER_0 = (0.1, 0.3, 0.0, 0.6)
WARPED_Q_AFTER_0 = (0.3, 0.6, 0.0, 0.1)


def warped_models() -> tuple[TableLM, TableLM]:
    """The target and draft tables of the warped scenario."""
    target = TableLM(
        VOCAB,
        HORIZON,
        seed=21,
        planted={(): WARPED_P_ROOT, (0,): WARPED_P_AFTER_0},
        params=WARP_PARAMS,
    )
    drafter = TableLM(
        VOCAB,
        HORIZON,
        seed=22,
        planted={(): WARPED_Q_ROOT, (0,): WARPED_Q_AFTER_0},
        params=WARP_PARAMS,
    )
    return target, drafter


def scenarios() -> list[Scenario]:
    """The four shapes on the planted tables at temperature 1, then a sampled chain on the
    warped tables with warping parameters (``warped``)."""
    target, drafter = scenario_models()
    out = [Scenario(shape, target, drafter) for shape in SHAPES]
    wt, wd = warped_models()
    return [*out, Scenario("chain-sampled", wt, wd, WARP_PARAMS, name="warped")]
