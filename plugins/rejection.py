"""The rejection verifier: Leviathan/Chen speculative sampling over a chain or a token tree.

Whatever the draft, the emitted tokens have exactly the target's distribution p.

- Chain: draft token x, drawn from q, is accepted with probability min(1, p(x) / q(x)); on
  rejection the correction is drawn from the residual max(p - q, 0), renormalised; when every
  draft token is accepted, a bonus token is drawn from p after the last one.
- Tree with i.i.d. children (``draft.q`` given): siblings were drawn independently from the
  same q row. They are tried in order, each against the residual left by the siblings
  rejected before it (multi-round rejection). Repeated siblings must all be tried: skipping
  a repeat changes the residual.
- Tree with deterministic distinct children (``draft.q is None``: prompt lookup, argmax,
  top-k): each child is a one-hot proposal, so it is accepted with probability r(x) and the
  residual after rejecting it is r with x removed, renormalised (rejection without
  replacement).
- Temperature 0: p is one-hot on the argmax, so the walk accepts exactly the children that
  carry the argmax and the correction is the argmax: token-identical to greedy decoding.

The decision logic (:meth:`RejectionVerifier.walk`) uses only arithmetic operators and
indexing on rows, so the same code runs on torch rows here and on exact rational rows in the
verification suite (docs/verification.md). All randomness goes through a :class:`Chance`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from specd import Draft, SamplingParams, Verdict, Verifier, hookimpl, sample


class Chance(Protocol):
    """The only source of randomness the walk uses."""

    def coin(self, probability: Any) -> bool:
        """True with the given probability."""
        ...

    def draw(self, row: Any) -> int:
        """A token drawn from the (possibly unnormalised) distribution ``row``."""
        ...


class TorchChance:
    """Randomness from one torch generator: a uniform u per accept/reject decision, and
    multinomial draws for corrections and bonus tokens."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def uniform(self) -> float:
        """u in [0, 1)."""
        return float(torch.rand((), dtype=torch.float64, generator=self.generator))

    def coin(self, probability: Any) -> bool:
        # u < a with u in [0, 1): a = 1 always succeeds, a = 0 never does.
        return self.uniform() < probability

    def draw(self, row: Any) -> int:
        return sample(row, self.generator)


class RejectionVerifier(Verifier):
    name = "rejection"
    exact_for = frozenset({"sampled", "greedy"})

    def verify(
        self, draft: Draft, p: torch.Tensor, params: SamplingParams, generator: torch.Generator
    ) -> Verdict:
        # The walk runs on the CPU, where the request's generator lives, in float64 so the
        # residual of two nearly equal rows keeps its mass.
        rows = p.to("cpu", torch.float64)  # [N + 1, V]
        q = None if draft.q is None else draft.q.to("cpu", torch.float64)  # [N, V]
        path, token = self.walk(draft.tokens, draft.parents, rows, q, self.chance(generator))
        return Verdict(path=path, token=int(token))

    def chance(self, generator: torch.Generator) -> Chance:
        return TorchChance(generator)

    def walk(
        self, tokens: Sequence[int], parents: Sequence[int], p: Any, q: Any, chance: Chance
    ) -> tuple[list[int], int]:
        """Walk the draft tree from the root, accepting or rejecting children.

        :param tokens: node i's token id.
        :param parents: node i's parent (-1: the root); parents precede children.
        :param p: ``[N + 1, V]`` target rows: row 0 at the root, row i + 1 after node i.
        :param q: ``[N, V]`` the row node i was drawn from, or None for a deterministic draft.
        :param chance: where the coins and draws come from.
        :returns: the accepted node path and the token drawn where it stopped.
        """
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(parents):
            children.setdefault(parent, []).append(i)
        path: list[int] = []
        node = -1
        r = p[0]  # what the target still owes at this node: p, then residuals
        while True:
            for child in children.get(node, ()):
                x = tokens[child]
                qc = self.proposal(q, child, x, r)
                # Accept the drafted x with probability min(1, r(x) / q(x)).
                if chance.coin(self.accept_probability(_at(r, x), _at(qc, x))):
                    break
                # Rejected: given that, the target's law here is the residual max(r - q, 0).
                r = self.residual(r, qc)
            else:
                # No child accepted (or a leaf reached): the correction, or the bonus token
                # after a full accept, is drawn from what is left.
                return path, chance.draw(r)
            path.append(child)
            node = child
            r = p[child + 1]

    def proposal(self, q: Any, child: int, token: int, like: Any) -> Any:
        """The row ``child`` was drawn from: ``q[child]``, or one-hot on its token when the
        draft is deterministic."""
        if q is not None:
            return q[child]
        one_hot = like * 0
        one_hot[token] = 1
        return one_hot

    def accept_probability(self, r_x: Any, q_x: Any) -> Any:
        """min(1, r(x) / q(x)); at q(x) = 0 (a token the proposal could not have drawn) the
        limit: 1 when r(x) > 0, else 0."""
        if q_x <= 0:
            return 1 if r_x > 0 else 0
        return min(1, r_x / q_x)

    def residual(self, r: Any, q: Any) -> Any:
        """max(r - q, 0) renormalised. When nothing is left, r and q are equal and a rejection
        had probability 0 (it can only come from rounding): keep r."""
        d = r - q
        d = d * (d > 0)
        mass = d.sum()
        return d / mass if mass > 0 else r


def _at(row: Any, x: int) -> Any:
    """row[x] as a Python number (float for torch rows, Fraction for exact rows)."""
    v = row[x]
    return v.item() if isinstance(v, torch.Tensor) else v


@hookimpl
def specd_register_verifiers(register):
    register(RejectionVerifier)
