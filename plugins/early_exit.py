"""Self-speculative drafting: the target's own first layers propose the next tokens.

The drafter runs the first L decoder layers of the target, then its final norm and LM
head. It keeps no cache of its own: the keys and values of the first L layers for every
committed token are already in the target's cache, and the draft tokens it appends there
are cropped away before verification. The exit layer comes from the exit policy when it
names one, else from the ``layer`` option (default: a quarter of the depth).
"""

from __future__ import annotations

import torch

from specd import (
    MAX_DRAFT,
    Draft,
    DraftContext,
    Drafter,
    DrafterUnavailable,
    checks,
    hookimpl,
    sample,
    warp,
)


class EarlyExitDrafter(Drafter):
    """:param layer: exit after this many decoder layers (default: num_layers // 4).
    :param max_draft: cap on proposed tokens per step."""

    name = "early_exit"

    def __init__(self, layer: int | None = None, max_draft: int = 6) -> None:
        self.layer = checks.optional_integer("early_exit", "layer", layer)
        self.max_draft = checks.integer("early_exit", "max_draft", max_draft, hi=MAX_DRAFT)
        self._exit = 1

    def start(self, ctx: DraftContext) -> None:
        if ctx.target is None or ctx.cache is None:
            raise RuntimeError("early_exit needs the target and its cache")
        n = ctx.target.num_layers
        chosen = ctx.exit_policy.exit_layer(n) if ctx.exit_policy is not None else None
        layer = chosen or self.layer or max(1, n // 4)
        if not 1 <= layer < n:
            if chosen:  # the exit policy's choice
                raise ValueError(f"early_exit layer must be in [1, {n - 1}], got {layer}")
            raise DrafterUnavailable(
                f"early_exit option layer={layer}: expected an integer from 1 to {n - 1} "
                f"({ctx.target.name!r} has {n} layers)"
            )
        self._exit = layer

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        target, cache = ctx.target, ctx.cache
        assert target is not None and cache is not None
        base = cache.length
        token = ctx.tokens[-1]
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        try:
            for position in range(min(budget, self.max_draft)):
                logits = target.forward_early(cache, [token], self._exit)[-1]  # [V]
                q = warp(logits, ctx.params)
                if ctx.params.greedy:
                    token = int(q.argmax())
                    confidence = float(torch.softmax(logits.float(), -1)[token])
                else:
                    token = sample(q, ctx.generator)
                    confidence = float(q[token])
                tokens.append(token)
                q_rows.append(q)
                # stop before the next position when this token was a weak guess
                if not ctx.keep_drafting(position + 1, confidence):
                    break
        finally:
            cache.crop(base)
        if not tokens:
            return None
        # Greedy drafts are deterministic (one-hot q); sampled ones carry the q they came from.
        return Draft.chain(tokens, q=None if ctx.params.greedy else torch.stack(q_rows))


@hookimpl
def specd_register_drafters(register):
    register(EarlyExitDrafter)
