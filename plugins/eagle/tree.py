"""The ``eagle`` drafter's token trees: a node of a greedy tree, a chosen set of nodes closed
under their ancestors, and the :class:`~specd.Draft` they make."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specd import Draft


@dataclass
class Node:
    token: int
    parent: int  # index into the node list, -1: the root
    depth: int  # 1 for children of the root
    score: float  # log probability of the path
    feat: torch.Tensor  # [H] predicted feature this node's token was read from
    entry: int = -1  # cache index of this node's head entry, once expanded


def closed(nodes: list[Node], chosen: list[int]) -> list[Node]:
    """The chosen nodes with every ancestor, parents first, re-indexed."""
    keep: set[int] = set()
    for i in chosen:
        while i >= 0 and i not in keep:
            keep.add(i)
            i = nodes[i].parent
    order = sorted(keep, key=lambda i: (nodes[i].depth, -nodes[i].score))
    index = {old: new for new, old in enumerate(order)}
    return [
        Node(n.token, index.get(n.parent, -1), n.depth, n.score, n.feat)
        for n in (nodes[i] for i in order)
    ]


def as_draft(nodes: list[Node], q: torch.Tensor | None) -> Draft | None:
    if not nodes:
        return None
    return Draft(tokens=[n.token for n in nodes], parents=[n.parent for n in nodes], q=q)
