"""What a drafter proposes and what a verifier decides."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Draft:
    """A token tree proposed by a drafter; a chain is the one-branch case.

    ``tokens[i]`` is node i's token id and ``parents[i]`` its parent node (-1: the root, i.e.
    the last committed token). Parents come before children. ``q[i]`` is the distribution
    node i's token was drawn from, given its parent's path; siblings drawn i.i.d. share the
    same q row. ``q is None`` marks a deterministic draft (prompt lookup, argmax): the
    verifier treats each node as a one-hot proposal, and siblings must be distinct.
    """

    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None  # [N, V] or None

    @classmethod
    def chain(cls, tokens: Sequence[int], q: torch.Tensor | None = None) -> Draft:
        toks = [int(t) for t in tokens]
        return cls(tokens=toks, parents=[i - 1 for i in range(len(toks))], q=q)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def deterministic(self) -> bool:
        return self.q is None

    def depths(self) -> list[int]:
        """Depth of each node: 1 for children of the root."""
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    def children(self, node: int) -> list[int]:
        """Child node indices of ``node`` (-1 for the root), in draft order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


@dataclass
class Verdict:
    """A verifier's decision: the accepted path of draft nodes plus one token from the target.

    ``path`` lists accepted node indices from the root down. ``token`` is the correction
    drawn where the path stopped, or the bonus token when it reached a leaf.
    """

    path: list[int]
    token: int


@dataclass
class Step:
    """What one target step decided, handed from ``Engine.verify`` to ``Engine.commit``."""

    base: int  # the pending token's position: the cache's length before the step + lead
    draft: Draft | None
    verdict: Verdict
    hidden: torch.Tensor | None  # [lead + 1 + N, H] when the drafter wants hidden states
    lead: int = 0  # prompt tokens the prefill left to this step, fed before the pending one
