"""What a step backend is: the :class:`StepBackend` protocol, the lean forward as one
(:class:`EagerStep`), the pass arithmetic the fixed-buffer backends share, and the check
every backend passes against the eager pass before it serves.

A *pass* feeds 1-:data:`MAX_TOKENS` new tokens (the pending token and a draft, a chain or a
tree) on top of a cache that already holds tokens; the backends are in
:mod:`specd.forward.compiled` (the step kernel, ``torch.compile``) and
:mod:`specd.forward.static_graph` (CUDA graphs), and :func:`specd.forward.compiled.choose`
picks one per load.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from ..kvcache import KVCache
from .fastpath import FastDecoder

log = logging.getLogger(__name__)

#: Padded token counts of the CUDA graphs: the pending token plus a draft of up to 15.
BUCKETS = (1, 2, 4, 8, 16)
#: The most tokens a compiled pass takes; longer passes run eager.
MAX_TOKENS = BUCKETS[-1]
#: The most a backend's logits or hidden states may differ from the eager pass's, relative
#: to their largest magnitude, in float32 or wider (float32 sums in another order differ by
#: ~1e-6). Half-precision models allow 16 units of their rounding instead: attention kernels
#: that differ by span round differently, while a wrong offset or mask moves whole rows.
TOLERANCE = 1e-4
#: The same for a step whose Q4 products round activations to int8 (:mod:`.interleave`): on
#: the default model they move logits by 2-5% of their largest magnitude; a wrong block,
#: scale or row moves them by far more.
INT8_TOLERANCE = 0.12
#: Cached tokens of the scratch cache a backend is checked on.
CHECK_CONTEXT = 64

Buffers = list[tuple[torch.Tensor, torch.Tensor]]
#: ``(logits [T, V], hidden states [T, H])`` of a pass
PassOut = tuple[torch.Tensor, torch.Tensor]


@runtime_checkable
class StepBackend(Protocol):
    """One way to run the decode and verify passes of a :class:`FastDecoder`.

    Made once per load (:func:`specd.forward.compiled.choose`), then :meth:`prepare`\\ d
    once, then asked for every pass; :class:`specd.forward.compiled.CompiledStep` holds it
    and turns it off (the passes run eager) when it raises.
    """

    #: ``kernel``, ``inductor``, ``cudagraph``, ``static`` or ``eager``
    name: str
    #: the most new tokens of a pass it serves (longer passes run eager)
    max_tokens: int
    #: why it cannot run on this host and model, "" where it can (known once it is made)
    off: str

    def prepare(self, new_cache: Callable[[], KVCache]) -> None:
        """Build what it runs and check its first passes against the eager pass on a scratch
        cache from ``new_cache`` (:func:`check`).

        :raises Exception: of any type, saying why it cannot serve.
        """
        ...

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        """One pass over ``ids`` ``[1, T]`` (positions ``[1, T]``, an additive mask
        ``[1, 1, T, past + T]`` for a tree, None for a chain) on top of ``cache``, which then
        holds the new tokens too.

        :returns: logits ``[T, V]`` and the final norm's output ``[T, H]``, or None, the
            cache untouched, for a pass it does not take (more than :attr:`max_tokens`
            tokens, an empty cache, a mask hiding a cached position).
        """
        ...


class EagerStep:
    """The lean forward itself (:meth:`FastDecoder.forward`): every pass, nothing to build."""

    name = "eager"
    max_tokens = 1 << 30
    off = ""

    def __init__(self, fast: FastDecoder) -> None:
        self.fast = fast

    def prepare(self, new_cache: Callable[[], KVCache]) -> None:
        pass

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        logits, hidden = self.fast.forward(cache, ids, position_ids, mask, hidden=True)
        assert hidden is not None
        return logits, hidden


def fixed_pass(
    fast: FastDecoder,
    ids: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    write: torch.Tensor,
    buffers: Buffers,
    span: int,
    mask: torch.Tensor | None,
) -> PassOut:
    """A pass over whole cache buffers, the arithmetic of :meth:`FastDecoder.forward`: what
    ``torch.compile`` compiles and a CUDA graph captures.

    :param ids: ``[1, T]``; ``cos``, ``sin``: ``[1, 1, T, D]``.
    :param write: ``[T]`` the cache positions the new keys and values go to.
    :param span: attend over the first ``span`` positions of each buffer.
    :param mask: packed additive ``[1, 1, R*T, span]``, None: all of them.
    :returns: logits ``[T, V]`` and the last hidden states ``[T, H]`` after the final norm.
    """
    h = F.embedding(ids, fast.embed)  # [1, T, H]
    for layer, (kb, vb) in zip(fast.layers, buffers, strict=True):
        q, k, v = fast.qkv(layer, h, cos, sin)
        kb.index_copy_(2, write, k.to(kb.dtype))
        vb.index_copy_(2, write, v.to(vb.dtype))
        o = fast.attend(q, kb[:, :, :span], vb[:, :, :span], mask)
        h = fast.mlp(layer, h, o)
    normed = fast._rms(h, fast.norm)  # [1, T, H]: what the LM head reads
    return fast._lm_head(normed[0]), normed[0]


def new_block(t: int, past: int, mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """The new tokens' additive mask among themselves ``[T, T]`` (the cached prefix is seen
    by all): ``mask``'s last ``T`` columns, or causal order for a chain."""
    if mask is not None:
        return mask[0, 0, :, past:]
    blocked = torch.ones(t, t, dtype=torch.bool, device=like.device).triu_(1)
    return torch.zeros(t, t, dtype=like.dtype, device=like.device).masked_fill_(
        blocked, torch.finfo(like.dtype).min
    )


@torch.inference_mode()
def check(backend: StepBackend, fast: FastDecoder, new_cache: Callable[[], KVCache]) -> None:
    """Compare a one-token step and a five-token pass through ``backend`` with the eager
    ones on a scratch cache of :data:`CHECK_CONTEXT` tokens (a pass longer than it takes is
    left to eager, as when serving).

    :raises RuntimeError: where they differ by more than :data:`TOLERANCE` of their scale, or
        a pass it should take did not run.
    """
    cache = new_cache()
    n = CHECK_CONTEXT
    device = fast.embed.device
    ids = torch.arange(n + 5, device=device)[None] % fast.embed.shape[0]
    fast.forward(cache, ids[:, :n], torch.arange(n, device=device)[None], None)
    tol = max(getattr(backend, "tolerance", TOLERANCE), 16 * torch.finfo(fast.embed.dtype).eps)
    for t in (1, 5):  # a step, and a pass verifying a draft
        pos = torch.arange(n, n + t, device=device)[None]
        new = ids[:, n : n + t]
        want, want_h = fast.forward(cache, new, pos, None, hidden=True)
        cache.crop(n)
        got = backend.run(cache, new, pos, None)
        cache.crop(n)
        if got is None:
            if t <= backend.max_tokens:
                raise RuntimeError(f"the {backend.name} step did not run a {t}-token pass")
            continue
        assert want_h is not None
        for name, a, b in (("logits", got[0], want), ("hidden states", got[1], want_h)):
            off = float((a - b).abs().max()) / max(1.0, float(b.abs().max()))
            log.debug("the %s step's %s over %d tokens: %.2e off", backend.name, name, t, off)
            if not off <= tol:
                raise RuntimeError(
                    f"its {name} over {t} tokens differ from the eager pass's by {off:.2e}"
                )
