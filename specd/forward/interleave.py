"""Quantized weights woven 16 rows together for the step kernel's int8 products.

A Q4_0, Q4_1 or Q8_0 matrix is kept as its GGUF file stores it (:class:`~.blocks.BlockWeight`),
row after row of blocks. The step kernel multiplies a copy of it in another order, the same
size: rows ``16 g .. 16 g + 15`` and values ``32 b .. 32 b + 31`` together, at
``(g * cols / 32 + b) * bytes``:

- Q4 (code 10, 320 bytes): 256 bytes of the sixteen rows' nibbles (byte ``c`` of row ``l``'s 16
  at ``64 k + 4 l + c`` for ``k < 4``), then their 16 ``d`` and 16 ``m`` as halves (a Q4_0
  block's ``m`` is ``-8 d``, exact in a half);
- Q8 (code 11, 544 bytes): 512 bytes of the rows' values plus 128 (byte ``c`` of row ``l``'s
  32 at ``64 k + 4 l + c`` for ``k < 8``), then their 16 ``d``.

Rows past the last, to a multiple of 16, are zeros.

In that order one vector instruction multiplies four values of sixteen rows with four int8
activations and sums them (AVX-512 VNNI's ``vpdpbusd``, AVX-VNNI, ARM's ``sdot``; two to four
instructions without), with no sum across lanes at the end (``csrc/qdot.h``,
``csrc/decode_step.cpp``). The activations are rounded to int8 with a scale per 32 values, as
llama.cpp's quantized products round them, so the results are no longer those of the float32
copy of the weights (docs/kernels.md gives the difference); plain decoding and speculation
still compute each token alike.

``SPECD_INT8_PRODUCTS=off`` keeps the float products (bit for bit those of the float32 copy).
"""

from __future__ import annotations

import os

import torch

from . import cpu_kernels
from .block_formats import Q4_0, Q4_1, Q8_0
from .blocks import BlockWeight

#: The step kernel's codes of woven weights (``Q4X16``, ``Q8X16`` in ``csrc/decode_step.cpp``).
CODE_Q4, CODE_Q8 = 10, 11
#: Rows woven together, and the bytes of each 16 rows by 32 values.
ROWS = 16
GROUP_BYTES = {CODE_Q4: 320, CODE_Q8: 544}
#: ``SPECD_INT8_PRODUCTS`` values that keep the float products.
OFF = ("0", "off", "false", "no")


def enabled() -> bool:
    """Whether the step multiplies Q4 weights woven, with int8 activations (the default)."""
    return os.environ.get("SPECD_INT8_PRODUCTS", "").strip().lower() not in OFF


def code(w: BlockWeight) -> int | None:
    """The kernel's code for ``w`` woven, or None for a format it does not weave."""
    return {Q4_0: CODE_Q4, Q4_1: CODE_Q4, Q8_0: CODE_Q8}.get(w.fmt)


def weave(w: BlockWeight) -> torch.Tensor | None:
    """``w``'s woven copy (uint8 ``[rows / 16, cols / 32 * bytes]``, rows rounded up), made
    once and kept on ``w`` (by the kernels' ``specd_weave`` where they load: the default
    model's 94 MB in ~0.1 s, else :func:`reference`); None for a format :func:`code` does not
    name, or a Q4_0 scale whose ``-8 d`` a half cannot hold."""
    c = code(w)
    if w.woven is not None or c is None:
        return w.woven
    if not cpu_kernels.available():
        w.woven = reference(w)
        return w.woven
    rows, cols = w.shape
    out = torch.empty(-(-rows // ROWS), cols // 32 * GROUP_BYTES[c], dtype=torch.uint8)
    if not cpu_kernels.weave(w.data_ptr(), w.fmt.code, rows, cols, out):
        return None
    w.woven = out
    return out


def reference(w: BlockWeight) -> torch.Tensor | None:
    """:func:`weave`'s copy made by torch's operations (what the tests hold the kernels'
    weaving to), without keeping it."""
    if code(w) is None:
        return None
    rows, cols = w.shape
    nb, groups = cols // 32, -(-rows // ROWS)
    raw = w.data.view(rows, nb, w.fmt.block_bytes)
    if w.fmt == Q8_0:
        values = raw[..., 2:34] ^ 0x80  # q + 128, as unsigned bytes
        parts = [values, raw[..., 0:2]]
    elif w.fmt == Q4_1:
        parts = [raw[..., 4:20], raw[..., 0:2], raw[..., 2:4]]
    else:
        d = raw[..., 0:2]
        low = d.contiguous().view(torch.float16).float() * -8
        m16 = low.half()
        if not bool((m16.float() == low).all()):
            return None
        parts = [raw[..., 2:18], d, m16.view(torch.uint8).reshape(rows, nb, 2)]
    woven = []
    for i, part in enumerate(parts):
        width = part.shape[-1]
        padded = torch.zeros(groups * ROWS, nb, width, dtype=torch.uint8)
        padded[:rows] = part
        if i == 0:  # values: [g, l, b, k, c] -> [g, b, k, l, c]
            chunks = width // 4
            v = padded.view(groups, ROWS, nb, chunks, 4).permute(0, 2, 3, 1, 4)
        else:  # a scale a row: [g, l, b, 2] -> [g, b, l, 2]
            v = padded.view(groups, ROWS, nb, width).permute(0, 2, 1, 3)
        woven.append(v.reshape(groups, nb, -1))
    return torch.cat(woven, dim=2).reshape(groups, -1).contiguous()
