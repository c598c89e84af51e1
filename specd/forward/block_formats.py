"""The block formats of GGUF's quantized weights, on plain uint8 tensors.

A matrix ``[rows, cols]`` is stored row by row: ``rows`` runs of ``cols / 32`` blocks, each
block covering 32 consecutive values of its row. The formats (``code`` is the number the
C++ step kernel uses for it):

- ``q4_0`` (code 1), 18 bytes: fp16 ``d``, 16 bytes ``qs``; value ``j`` (0..15) is
  ``d * ((qs[j] & 15) - 8)``, value ``j + 16`` is ``d * ((qs[j] >> 4) - 8)``.
- ``q4_1`` (code 2), 20 bytes: fp16 ``d``, fp16 ``m``, 16 bytes ``qs``; value ``j`` is
  ``d * (qs[j] & 15) + m``, value ``j + 16`` is ``d * (qs[j] >> 4) + m``.
- ``q8_0`` (code 3), 34 bytes: fp16 ``d``, 32 int8 ``qs``; value ``j`` is ``d * qs[j]``.
- ``bf16`` (code 4), 64 bytes: 32 bfloat16 values (a value's float32 bits are its 16 bits
  shifted left by 16).

Code 0 is float32, which is no block format: float tensors stay torch tensors. A value is
de-quantized in float32: ``d`` and ``m`` converted from fp16 exactly, ``d * q`` (exact in
float32), then ``+ m`` (one rounding), bit for bit what ggml's reference de-quantizers and
the step kernel compute. All multi-byte fields are little-endian, as GGUF stores them.
:func:`decode` de-quantizes, :func:`encode` quantizes the way ggml's reference quantizers
do. :mod:`.blocks` holds a matrix of blocks where a weight tensor would be.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Values per block.
BLOCK = 32


class Format(NamedTuple):
    """A storage format: its name, the step kernel's code for it, the bytes of one block."""

    name: str
    code: int
    block_bytes: int


F32 = Format("f32", 0, 4 * BLOCK)  # no block format: its "block" is 32 float32 values
Q4_0 = Format("q4_0", 1, 18)
Q4_1 = Format("q4_1", 2, 20)
Q8_0 = Format("q8_0", 3, 34)
BF16 = Format("bf16", 4, 2 * BLOCK)

#: The block formats by name (float32 is not one of them).
FORMATS: dict[str, Format] = {f.name: f for f in (Q4_0, Q4_1, Q8_0, BF16)}


def check_format(fmt: Format | str) -> Format:
    """The block format ``fmt`` names (a :class:`Format` or its name); ValueError otherwise."""
    if not isinstance(fmt, (str, Format)):
        raise ValueError(f"a block format is a Format or a name, not {type(fmt).__name__}")
    found = FORMATS.get(fmt if isinstance(fmt, str) else fmt.name)
    if found is None or (isinstance(fmt, Format) and fmt != found):
        raise ValueError(f"unknown block format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return found


def decode(raw: torch.Tensor, fmt: Format) -> torch.Tensor:
    """De-quantize ``raw``, uint8 ``[..., n * block_bytes]``, to float32 ``[..., n * 32]``."""
    if fmt == BF16:  # no scales: each 2 bytes are a value
        bits = raw.contiguous().view(torch.int16).to(torch.int32) << 16
        return bits.view(torch.float32)
    lead, n = raw.shape[:-1], raw.shape[-1] // fmt.block_bytes
    blocks = raw.reshape(*lead, n, fmt.block_bytes)  # [..., n, block_bytes]
    d = _fp16(blocks, 0)  # [..., n, 1]
    if fmt == Q8_0:
        values = d * blocks[..., 2:].view(torch.int8).to(torch.float32)
    elif fmt == Q4_0:
        values = d * (_nibbles(blocks[..., 2:]).to(torch.float32) - 8.0)
    elif fmt == Q4_1:
        values = d * _nibbles(blocks[..., 4:]).to(torch.float32) + _fp16(blocks, 2)
    else:
        raise ValueError(f"cannot decode {fmt!r}")
    return values.reshape(*lead, n * 32)


def _fp16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at ``offset`` of each block, as float32 ``[..., n, 1]``."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes of packed 4-bit values -> the 32 values: low nibbles first, then high."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def encode(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Blocks of float32 ``x`` ``[..., n, 32]`` (finite for the integer formats) as uint8
    ``[..., n, block_bytes]``, rounded the way ggml's reference quantizers round (per block
    of 32 values ``x``):

    - ``q8_0``: ``d = max|x| / 127``, ``q = round(x / d)`` (halves away from zero);
    - ``q4_0``: ``d = x[argmax|x|] / -8``, ``q = trunc(x / d + 8.5)`` clamped to 0..15;
    - ``q4_1``: ``d = (max x - min x) / 15``, ``m = min x``, ``q = trunc((x - m) / d + 0.5)``
      clamped to 0..15;
    - ``bf16``: round to nearest even (a NaN stays a quiet NaN).

    Each ``/ d`` is a product with ``1 / d`` in float32, and an all-zero block gets ``d = 0``
    and zeros, as in ggml (``quantize_row_*_ref``; gguf-py's ``quants`` matches it).
    """
    if fmt == BF16:
        return _bf16_bits(x)
    return _QUANTIZERS[fmt.name](x)


def _inverse(d: torch.Tensor) -> torch.Tensor:
    """``1 / d``, and 0 where ``d`` is 0 (an all-zero block stays zero, no NaN)."""
    return torch.where(d == 0, torch.zeros_like(d), 1.0 / d)


def _roundf(v: torch.Tensor) -> torch.Tensor:
    """C's ``roundf`` (halves away from zero), exact for every float32 (no ``+ 0.5``)."""
    a = v.abs()
    whole = a.floor()
    return torch.sign(v) * (whole + (2.0 * (a - whole)).floor())


def _half_bytes(v: torch.Tensor) -> torch.Tensor:
    """float32 ``[..., 1]`` -> its fp16 (nearest even) as 2 bytes ``[..., 2]``."""
    return v.to(torch.float16).view(torch.uint8)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """32 values 0..15 (float) per block -> 16 bytes: value j low, value j + 16 high."""
    q = q.to(torch.uint8)
    return q[..., :16] | (q[..., 16:] << 4)


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(dim=-1, keepdim=True) / 127
    q = _roundf(x * _inverse(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([_half_bytes(d), q], dim=-1)


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    # the value largest in magnitude (the first of ties), signed: it maps to q = 0 exactly
    big = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))
    d = big / -8
    q = torch.trunc(x * _inverse(d) + 8.5).clamp(0, 15)
    return torch.cat([_half_bytes(d), _pack_nibbles(q)], dim=-1)


def _q4_1(x: torch.Tensor) -> torch.Tensor:
    low = x.amin(dim=-1, keepdim=True)
    d = (x.amax(dim=-1, keepdim=True) - low) / 15
    q = torch.trunc((x - low) * _inverse(d) + 0.5).clamp(0, 15)
    return torch.cat([_half_bytes(d), _half_bytes(low), _pack_nibbles(q)], dim=-1)


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 bytes, rounding to nearest even (ggml_compute_fp32_to_bf16)."""
    n = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = torch.where(nan, (n & 0xFFFF0000) | (64 << 16), n)  # NaN: keep it a quiet NaN
    top = ((n + 0x7FFF + ((n >> 16) & 1)) >> 16) & 0xFFFF
    top = torch.where(top >= 0x8000, top - 0x10000, top).to(torch.int16)
    return top.view(torch.uint8)


_QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1}
