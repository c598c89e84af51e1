"""How a forward's tokens are cut into passes and what each pass's tokens see: the prefill's
pieces, and the additive mask of a token tree."""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Prompt tokens computed per forward pass in prefill, with a stop check between passes.
PREFILL_CHUNK = 256
#: A prefill into an empty cache computes up to this many tokens in its first pass: causal
#: attention needs no mask there, and the matrix products run at their most efficient size
#: (1,024 tokens: 1.6 s in one pass, 1.8 s in chunks of 256, on a 2-core CPU).
FIRST_CHUNK = 2048
#: Prompts up to this many tokens on weights stored as blocks prefill as passes of the step
#: kernel (16 tokens each) where the lean forward's passes multiply by float32 copies of the
#: weights, made once per pass; where they multiply by the int8 products, only a prompt of
#: one step pass does (:meth:`~.target.Target._prefill_steps`).
STEP_PREFILL_TOKENS = 256


def prefill_pieces(
    past: int, n: int, chunk: int = PREFILL_CHUNK, *, first: bool = False
) -> list[tuple[int, int]]:
    """``[start, end)`` of each pass that prefills ``n`` tokens after ``past`` cached ones:
    :data:`FIRST_CHUNK` for the first when the cache is empty (``first``: ``chunk`` for
    that one too), ``chunk`` after that."""
    pieces, start = [], 0
    while start < n:
        size = FIRST_CHUNK if past + start == 0 and not first else chunk
        end = min(n, start + size)
        pieces.append((start, end))
        start = end
    return pieces


def tree_mask(
    parents: Sequence[int], past: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Depths ``[T]`` and an additive attention mask ``[1, 1, T, past + T]`` for a token tree."""
    n = len(parents)
    allowed = torch.zeros((n, n), dtype=torch.bool)
    depth = torch.zeros(n, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError("tree parents must come before their children")
        allowed[i, i] = True
        if p >= 0:
            allowed[i] |= allowed[p]
            depth[i] = depth[p] + 1
    full = torch.ones((n, past + n), dtype=torch.bool)
    full[:, past:] = allowed
    mask = torch.zeros((n, past + n), dtype=dtype)
    mask.masked_fill_(~full, torch.finfo(dtype).min)
    return depth.to(device), mask.to(device)[None, None]
