"""What a drafter's own small layers multiply by, as the target stores its weights
(:class:`DrafterWeights`, which ``Target`` offers: ``linear``, ``small_weight``,
``lm_head_rows``): a few rows at a time, outside the step, read the way the target reads its
own weights on this machine; and a drafter's own decoder layer in one call of the step
kernel (``layer_step``)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..kvcache import KVCache
from . import blocks, cpu_kernels, products
from .blocks import BlockWeight
from .decode_step import LAYER_WEIGHTS, DecodeStep
from .fastpath import FastDecoder

#: The most rows the kernel's product multiplies by blocks; more go through a float product
#: (blocks de-quantized first).
FEW_ROWS = blocks.PRODUCT_ROWS


def few_rows(
    fast: FastDecoder | None, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ w.T (+ b)`` the way the lean forward ``fast`` computes products of a few rows on
    this machine: weight-major where it measured that faster (:mod:`.products`)."""
    if fast is not None and fast.weight_major and not isinstance(w, BlockWeight):
        y = products.weight_major(x, w)
        return y if b is None else y + b
    return F.linear(x, w, b)


def small_weight(model: Any, w: torch.Tensor) -> torch.Tensor | BlockWeight:
    """A drafter's own weight ``w`` ``[N, K]`` as the kernel's product reads it fastest for a
    few rows: where ``model`` runs on blocks (its LM head kept as blocks: a model run as it
    ships, or ``--weights q8|q4``) and the CPU kernels run, ``w`` rounded to Q8_0 blocks (34
    bytes for 32 values, against 128 in float32); else ``w`` itself."""
    out = model.get_output_embeddings()
    if (
        out is None
        or not isinstance(out.weight, BlockWeight)
        or w.dim() != 2
        or w.shape[1] % 32
        or w.device.type != "cpu"
        or not cpu_kernels.available()
    ):
        return w
    return blocks.quantize(w, "q8_0")


def lm_head_rows(model: Any, index: torch.Tensor) -> torch.Tensor | BlockWeight:
    """``model``'s LM head rows ``index`` ``[len(index), hidden]`` as stored: blocks stay
    blocks (their bytes copied), float rows a float copy."""
    w = model.get_output_embeddings().weight
    return blocks.rows_of(w, index) if isinstance(w, BlockWeight) else w[index]


class LayerStep:
    """A drafter's own decoder layer of the target's shapes (an EAGLE head's) with the rows
    ``lm`` as its LM head, in one call of the step kernel (:class:`.decode_step.DecodeStep`):
    its inputs in place of embeddings, no final norm (its outputs are the residual stream
    itself), its weights rounded as :func:`small_weight` rounds them (the int8 products over
    Q8_0 blocks where the target runs on blocks). :attr:`max_tokens` inputs a call."""

    max_tokens = cpu_kernels.STEP_TOKENS

    def __init__(self, step: DecodeStep) -> None:
        self.step = step
        self.woven = step.woven  #: how many of its matrices the int8 products read

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        start: int,
        tree: torch.Tensor | None = None,
        keep: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer over inputs ``x`` ``[T, H]`` (rotary tables ``cos``, ``sin`` ``[T, D]`` at
        their positions), each seeing ``cache``'s entries from ``start`` on and the inputs
        before it (or where ``tree`` ``[T, T]`` says), their keys and values written after
        the cached ones and counted in ``cache`` with ``keep``.

        :returns: the scores over the ``lm`` rows ``[T, Vd]`` and the outputs ``[T, H]``."""
        t, length = x.shape[0], cache.length
        cache.initialize(self.step.kv_heads, self.step.head_dim)
        buffers = cache.buffers(length + t)
        assert buffers is not None  # initialized above
        view = [(k[:, :, start:], v[:, :, start:]) for k, v in buffers]
        out = self.step.forward(x.float(), cos, sin, view, length - start, tree)
        if keep:
            cache.advance(t)
        return out


def layer_step(
    model: Any, weights: dict[str, torch.Tensor], lm: Any, *, heads: int, kv_heads: int, eps: float
) -> LayerStep | None:
    """:class:`LayerStep` over ``weights`` (float tensors named as in
    :data:`.decode_step.LAYER_WEIGHTS`, biases left out) for a drafter of ``model``, or None
    where the step kernel does not run or take these shapes."""
    if weights["wq"].device.type != "cpu" or not cpu_kernels.available():
        return None
    layer: list[Any] = []
    for name in LAYER_WEIGHTS:
        w = weights.get(name)
        w = None if w is None else w.detach().float().contiguous()
        layer.append(small_weight(model, w) if w is not None and name.startswith("w") else w)
    head_dim = weights["wq"].shape[0] // heads
    if isinstance(lm, torch.Tensor):
        lm = lm.detach().float().contiguous()
    try:
        step = DecodeStep(
            [tuple(layer)], None, None, lm, None, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
            eps=eps, scale=head_dim**-0.5,
        )  # fmt: skip
    except (ValueError, RuntimeError):
        return None
    return LayerStep(step)


class DrafterWeights:
    """The target's offer to a drafter's own layers (``Target`` inherits it): its products
    for a few rows, its weights rounded for them, its LM head's rows as stored, and its step
    kernel for a decoder layer of its shapes."""

    model: Any
    fast: FastDecoder | None
    few_rows = FEW_ROWS  #: the most rows :meth:`linear` reads blocks for in the kernel

    def linear(self, x: torch.Tensor, w: torch.Tensor | BlockWeight) -> torch.Tensor:
        """``x @ w.T`` for a drafter's own small layers and the LM head rows it reads
        (:meth:`lm_head_rows`): for a few float32 rows on the CPU, the step kernel's product
        (:func:`.blocks.product`: blocks read as stored); else the way the lean forward
        computes products of a few rows on this machine (weight-major where it measured
        faster, :mod:`.products`)."""
        return blocks.product(x, w, fallback=self._few_rows)

    def small_weight(self, w: torch.Tensor) -> torch.Tensor | BlockWeight:
        """A drafter's weight ``w`` as :meth:`linear` reads it fastest (:func:`small_weight`:
        Q8_0 blocks where the target runs on blocks)."""
        return small_weight(self.model, w)

    def _few_rows(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        return few_rows(self.fast, x, w, b)

    def lm_head_rows(self, index: torch.Tensor) -> torch.Tensor | BlockWeight:
        """The LM head's rows ``index`` as the target stores them (:func:`lm_head_rows`)."""
        return lm_head_rows(self.model, index)

    def layer_step(
        self, weights: dict[str, torch.Tensor], lm: Any, *, heads: int, kv_heads: int, eps: float
    ) -> LayerStep | None:
        """A drafter's own decoder layer with ``lm`` as its LM head in one call of the step
        kernel (:func:`layer_step`), or None where that does not run here."""
        return layer_step(self.model, weights, lm, heads=heads, kv_heads=kv_heads, eps=eps)
