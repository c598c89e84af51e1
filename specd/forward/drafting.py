"""What a drafter's own small layers multiply by, as the target stores its weights
(``Target.linear``, ``Target.small_weight``, ``Target.lm_head_rows``): a few rows at a time,
outside the step, read the way the target reads its own weights on this machine."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import blocks, cpu_kernels, products
from .blocks import BlockWeight
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
