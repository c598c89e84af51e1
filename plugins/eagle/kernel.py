"""The head's layer and its draft-vocabulary scores in one call of the step kernel.

The head is one decoder layer of the target's shapes, so the target's step kernel runs it
as a one-layer model (``Target.layer_step``): its entries in place of embeddings, no final
norm (the head predicts the residual stream, the target's feature), and the target's LM
head rows of the draft vocabulary as its LM head. One call then does what some forty
PyTorch operations and five products did (the norms, the rotary embedding, the attention
over the head's cache, the MLP and the scores), over the head's weights as the target's own
step reads them (Q8_0 blocks with the int8 products where the target runs on blocks). On
the 2-vCPU AMD EPYC of docs/benchmarks.md a draft step of one node took 0.8 ms where it took
1.2 ms through PyTorch (docs/eagle.md).

A call sees every cached entry of the window it is given and the new entries it feeds as a
tree mask says; the keys and values of new entries are written after the cached ones and
count only where the caller keeps them (true entries), so a draft's entries are fed again
with each call that needs them: a few more rows of products a call reads anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specd import KVCache, Target

from .head import EagleHead


class HeadKernel:
    """The head ``head`` through ``step`` (``Target.layer_step``'s); :attr:`max_entries` a call."""

    def __init__(self, head: EagleHead, step: Any) -> None:
        self.head, self.step = head, step
        self.max_entries: int = step.max_tokens
        # the rotary tables' rows by position, grown as positions come: a call indexes them
        # instead of computing them (a few torch operations, each costing as much as a row
        # of them when the target's pass has just evicted everything from the caches)
        self._cos = self._sin = torch.empty(0, head.config.head_dim)

    def _rotary(self, positions: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The cosines and sines ``[T, D]`` at ``positions``."""
        end = max(positions) + 1
        if end > self._cos.shape[0]:
            size = max(end, 2 * self._cos.shape[0], 256)
            self._cos, self._sin = self.head._angles(torch.arange(size), torch.float32)
        first, t = positions[0], len(positions)
        if list(positions) == list(range(first, first + t)):
            return self._cos[first : first + t], self._sin[first : first + t]
        at = torch.tensor(positions)
        return self._cos[at], self._sin[at]

    def run(
        self,
        x: torch.Tensor,
        positions: Sequence[int],
        cache: KVCache,
        start: int,
        tree: torch.Tensor | None = None,
        keep: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed entries ``x`` ``[T, H]`` at ``positions`` over the cached entries from
        ``start`` on (each sees all of them, and the new ones ``tree`` ``[T, T]`` shows it;
        None: the ones before it and itself).

        :param keep: count the new entries' keys and values in ``cache`` (true entries).
        :returns: scores over the draft vocabulary ``[T, Vd]`` and the predicted features
            ``[T, H]``.
        """
        cos, sin = self._rotary(positions)
        return self.step(x, cos, sin, cache, start, tree, keep)


def head_kernel(head: EagleHead, target: Target, lm_rows: Any) -> HeadKernel | None:
    """The step kernel over ``head``, or None where it does not run (no kernels on this host,
    a target off the CPU, shapes it does not take): the head then drafts through PyTorch."""
    weights = {
        "ln1": head.ln1, "wq": head.wq.weight, "wk": head.wk.weight, "wv": head.wv.weight,
        "wo": head.wo.weight, "ln2": head.ln2, "wg": head.gate.weight, "wu": head.up.weight,
        "wd": head.down.weight,
    }  # fmt: skip
    c = head.config
    step = target.layer_step(weights, lm_rows, heads=c.heads, kv_heads=c.kv_heads, eps=c.eps)
    return None if step is None else HeadKernel(head, step)
