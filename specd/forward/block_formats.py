"""The block formats of GGUF's quantized weights, on plain uint8 tensors.

A matrix ``[rows, cols]`` is stored row by row: ``rows`` runs of ``cols / values`` blocks,
each block covering ``values`` consecutive values of its row (32, or 256 for the K-quants).
The formats (``code`` is the number the C++ step kernel uses for it):

- ``q4_0`` (code 1), 18 bytes: fp16 ``d``, 16 bytes ``qs``; value ``j`` (0..15) is
  ``d * ((qs[j] & 15) - 8)``, value ``j + 16`` is ``d * ((qs[j] >> 4) - 8)``.
- ``q4_1`` (code 2), 20 bytes: fp16 ``d``, fp16 ``m``, 16 bytes ``qs``; value ``j`` is
  ``d * (qs[j] & 15) + m``, value ``j + 16`` is ``d * (qs[j] >> 4) + m``.
- ``q8_0`` (code 3), 34 bytes: fp16 ``d``, 32 int8 ``qs``; value ``j`` is ``d * qs[j]``.
- ``bf16`` (code 4), 64 bytes: 32 bfloat16 values (a value's float32 bits are its 16 bits
  shifted left by 16).
- ``q5_0`` (code 5), 22 bytes: fp16 ``d``, 32-bit ``qh``, 16 bytes ``qs``; ``q`` is q4's
  nibble plus 16 where bit ``j`` of ``qh`` is set; value ``j`` is ``d * (q - 16)``.
- ``q5_1`` (code 6), 24 bytes: fp16 ``d``, fp16 ``m``, ``qh``, ``qs`` as q5_0's; value
  ``j`` is ``d * q + m``.
- ``q4_k`` (code 7), 144 bytes a super-block of 256 values in eight sub-blocks of 32:
  fp16 ``d``, fp16 ``dmin``, 12 bytes of 6-bit scales ``sc`` and mins ``mn`` (sub-block
  ``s < 4``: the low six bits of bytes ``s`` and ``s + 4``; ``s >= 4``: the low (``sc``) and
  high (``mn``) nibbles of byte ``s + 4`` below the top two bits of bytes ``s - 4`` and
  ``s``), 128 bytes ``qs``; sub-block ``s``'s ``q`` are the low (``s`` even) or high
  nibbles of bytes ``32 (s // 2) ..``; a value is ``(d * sc) * q - dmin * mn``.
- ``q5_k`` (code 8), 176 bytes: as q4_k with 32 bytes ``qh`` after the scales; bit ``s`` of
  ``qh[l]`` adds 16 to value ``l`` of sub-block ``s``.
- ``q6_k`` (code 9), 210 bytes: 128 bytes of low nibbles ``ql``, 64 bytes of 2-bit highs
  ``qh``, 16 int8 scales ``sc`` (one per 16 values), fp16 ``d``; each half of 128 values
  takes 64 bytes of ``ql`` and 32 of ``qh``, and value ``l + 32 t`` (``t`` 0..3) of it is
  ``(d * sc) * (q - 32)`` with ``q`` the low (``t < 2``) or high nibble of ``ql[l + 32 (t
  % 2)]`` and bits ``2 t, 2 t + 1`` of ``qh[l]`` above it.

Code 0 is float32, which is no block format: float tensors stay torch tensors. A value is
de-quantized in float32: ``d``, ``m`` and ``dmin`` converted from fp16 exactly, every
product of a scale and small integers exact in float32 (at most 24 bits), then ``+ m`` or
``- dmin * mn`` (one rounding), bit for bit what ggml's reference de-quantizers and the step
kernel compute. All multi-byte fields are little-endian, as GGUF stores them.
:func:`decode` de-quantizes, :func:`encode` quantizes the way ggml's reference quantizers
do (the formats of :data:`QUANTIZABLE`; K-quants are read as files hold them, never made
here). :mod:`.blocks` holds a matrix of blocks where a weight tensor would be.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: Values per block (of every format but the K-quants, whose blocks hold :data:`SUPER`).
BLOCK = 32
#: Values per K-quant super-block.
SUPER = 256


class Format(NamedTuple):
    """A storage format: its name, the step kernel's code for it, the bytes of one block
    and the values it holds."""

    name: str
    code: int
    block_bytes: int
    values: int = BLOCK


F32 = Format("f32", 0, 4 * BLOCK)  # no block format: its "block" is 32 float32 values
Q4_0 = Format("q4_0", 1, 18)
Q4_1 = Format("q4_1", 2, 20)
Q8_0 = Format("q8_0", 3, 34)
BF16 = Format("bf16", 4, 2 * BLOCK)
Q5_0 = Format("q5_0", 5, 22)
Q5_1 = Format("q5_1", 6, 24)
Q4_K = Format("q4_k", 7, 144, SUPER)
Q5_K = Format("q5_k", 8, 176, SUPER)
Q6_K = Format("q6_k", 9, 210, SUPER)

#: The block formats by name (float32 is not one of them).
FORMATS: dict[str, Format] = {
    f.name: f for f in (Q4_0, Q4_1, Q8_0, BF16, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)
}
#: The formats :func:`encode` makes (the K-quants' searched scales are not made here).
QUANTIZABLE: dict[str, Format] = {f.name: f for f in (Q4_0, Q4_1, Q8_0, BF16, Q5_0, Q5_1)}


def check_format(fmt: Format | str) -> Format:
    """The block format ``fmt`` names (a :class:`Format` or its name); ValueError otherwise."""
    if not isinstance(fmt, (str, Format)):
        raise ValueError(f"a block format is a Format or a name, not {type(fmt).__name__}")
    found = FORMATS.get(fmt if isinstance(fmt, str) else fmt.name)
    if found is None or (isinstance(fmt, Format) and fmt != found):
        raise ValueError(f"unknown block format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return found


def decode(raw: torch.Tensor, fmt: Format) -> torch.Tensor:
    """De-quantize ``raw``, uint8 ``[..., n * block_bytes]``, to float32
    ``[..., n * fmt.values]``."""
    if fmt == BF16:  # no scales: each 2 bytes are a value
        bits = raw.contiguous().view(torch.int16).to(torch.int32) << 16
        return bits.view(torch.float32)
    lead, n = raw.shape[:-1], raw.shape[-1] // fmt.block_bytes
    blocks = raw.reshape(*lead, n, fmt.block_bytes)  # [..., n, block_bytes]
    if fmt.values == SUPER:
        values = _K_DECODERS[fmt.name](blocks)
    elif fmt == Q8_0:
        values = _fp16(blocks, 0) * blocks[..., 2:].view(torch.int8).to(torch.float32)
    elif fmt == Q4_0:
        values = _fp16(blocks, 0) * (_nibbles(blocks[..., 2:]).to(torch.float32) - 8.0)
    elif fmt == Q4_1:
        values = _fp16(blocks, 0) * _nibbles(blocks[..., 4:]).to(torch.float32) + _fp16(blocks, 2)
    elif fmt == Q5_0:
        values = _fp16(blocks, 0) * (_five_bits(blocks[..., 2:6], blocks[..., 6:]) - 16.0)
    elif fmt == Q5_1:
        q = _five_bits(blocks[..., 4:8], blocks[..., 8:])
        values = _fp16(blocks, 0) * q + _fp16(blocks, 2)
    else:
        raise ValueError(f"cannot decode {fmt!r}")
    return values.reshape(*lead, n * fmt.values)


def _fp16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at ``offset`` of each block, as float32 ``[..., n, 1]``."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes of packed 4-bit values -> the 32 values: low nibbles first, then high."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _five_bits(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """q5's 32 values as float32: the nibbles of ``qs`` plus 16 where bit ``j`` of the
    little-endian 32-bit ``qh`` is set."""
    word = qh.to(torch.int64) << torch.tensor([0, 8, 16, 24])
    high = (word.sum(-1, keepdim=True) >> torch.arange(32)) & 1
    return (_nibbles(qs) + (high << 4)).to(torch.float32)


def _scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of q4_k/q5_k super-blocks, from their 12 bytes."""
    low, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (top & 15) | ((low >> 6) << 4)], dim=-1)
    mn = torch.cat([mid & 63, (top >> 4) | ((mid >> 6) << 4)], dim=-1)
    return sc.to(torch.float32), mn.to(torch.float32)


def _q45_k(blocks: torch.Tensor, five: bool) -> torch.Tensor:
    """q4_k (``five`` False) or q5_k super-blocks ``[..., n, bytes]`` -> ``[..., n, 256]``."""
    sc, mn = _scales_mins(blocks[..., 4:16])  # [..., n, 8]
    scale = (_fp16(blocks, 0) * sc)[..., None]  # exact: 11 by 6 bits
    low = (_fp16(blocks, 2) * mn)[..., None]
    qs = blocks[..., 48:] if five else blocks[..., 16:]
    pairs = qs.reshape(*qs.shape[:-1], 4, 1, 32) >> torch.tensor([0, 4], dtype=torch.uint8)[:, None]
    q = (pairs & 15).reshape(*qs.shape[:-1], 8, 32)  # sub-block s: low (s even) or high nibbles
    if five:
        shifts = torch.arange(8, dtype=torch.uint8)[:, None]
        q = q | (((blocks[..., None, 16:48] >> shifts) & 1) << 4)
    return (scale * q.to(torch.float32) - low).flatten(-2)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """q6_k super-blocks ``[..., n, 210]`` -> ``[..., n, 256]``."""
    lead = blocks.shape[:-1]
    ql = (
        blocks[..., :128].reshape(*lead, 2, 1, 64)
        >> torch.tensor([0, 4], dtype=torch.uint8)[:, None]
    )
    ql = (ql & 15).reshape(*lead, 2, 4, 32)  # [half, t, l]: low of 0..31, 32..63, high of them
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)[:, None]
    qh = (blocks[..., 128:192].reshape(*lead, 2, 1, 32) >> shifts) & 3  # [half, t, l]
    q = (ql | (qh << 4)).to(torch.float32) - 32.0
    sc = blocks[..., 192:208].contiguous().view(torch.int8).to(torch.float32)  # one per 16
    scale = (_fp16(blocks, 208) * sc).reshape(*lead, 2, 4, 2, 1)  # exact: 11 by 8 bits
    return (scale * q.reshape(*lead, 2, 4, 2, 16)).reshape(*lead, SUPER)


_K_DECODERS = {
    "q4_k": lambda b: _q45_k(b, five=False),
    "q5_k": lambda b: _q45_k(b, five=True),
    "q6_k": _q6_k,
}


def encode(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Blocks of float32 ``x`` ``[..., n, 32]`` (finite for the integer formats) as uint8
    ``[..., n, block_bytes]``, rounded the way ggml's reference quantizers round (per block
    of 32 values ``x``):

    - ``q8_0``: ``d = max|x| / 127``, ``q = round(x / d)`` (halves away from zero);
    - ``q4_0``: ``d = x[argmax|x|] / -8``, ``q = trunc(x / d + 8.5)`` clamped to 0..15;
    - ``q4_1``: ``d = (max x - min x) / 15``, ``m = min x``, ``q = trunc((x - m) / d + 0.5)``
      clamped to 0..15;
    - ``q5_0``: as ``q4_0`` with ``d = x[argmax|x|] / -16``, ``q = trunc(x / d + 16.5)``
      clamped to 0..31;
    - ``q5_1``: as ``q4_1`` with ``d = (max x - min x) / 31``, ``q`` clamped to 0..31;
    - ``bf16``: round to nearest even (a NaN stays a quiet NaN).

    Each ``/ d`` is a product with ``1 / d`` in float32, and an all-zero block gets ``d = 0``
    and zeros, as in ggml (``quantize_row_*_ref``; gguf-py's ``quants`` matches it).
    """
    if fmt == BF16:
        return _bf16_bits(x)
    if fmt.name not in _QUANTIZERS:
        raise ValueError(
            f"specd reads {fmt.name} blocks from GGUF files but does not make them; it "
            f"quantizes to {', '.join(QUANTIZABLE)}"
        )
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


def _symmetric(x: torch.Tensor, half: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q4_0/q5_0's ``d`` and ``q`` (``half`` 8 or 16): the value largest in magnitude (the
    first of ties), signed, maps to q = 0 exactly."""
    big = x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))
    d = big / -half
    return d, torch.trunc(x * _inverse(d) + (half + 0.5)).clamp(0, 2 * half - 1)


def _offset(x: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q4_1/q5_1's ``d``, ``m`` and ``q`` (``top`` 15 or 31)."""
    low = x.amin(dim=-1, keepdim=True)
    d = (x.amax(dim=-1, keepdim=True) - low) / top
    return d, low, torch.trunc((x - low) * _inverse(d) + 0.5).clamp(0, top)


def _fifth_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of 32 values 0..31 (float) per block as q5's 4 bytes: value j's in bit j."""
    high = (q.to(torch.int64) >> 4) << torch.arange(32)
    word = high.sum(-1, keepdim=True)
    return ((word >> torch.tensor([0, 8, 16, 24])) & 0xFF).to(torch.uint8)


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    d, q = _symmetric(x, 8)
    return torch.cat([_half_bytes(d), _pack_nibbles(q)], dim=-1)


def _q4_1(x: torch.Tensor) -> torch.Tensor:
    d, low, q = _offset(x, 15)
    return torch.cat([_half_bytes(d), _half_bytes(low), _pack_nibbles(q)], dim=-1)


def _q5_0(x: torch.Tensor) -> torch.Tensor:
    d, q = _symmetric(x, 16)
    return torch.cat([_half_bytes(d), _fifth_bits(q), _pack_nibbles(q.remainder(16))], dim=-1)


def _q5_1(x: torch.Tensor) -> torch.Tensor:
    d, low, q = _offset(x, 31)
    nibbles = _pack_nibbles(q.remainder(16))
    return torch.cat([_half_bytes(d), _half_bytes(low), _fifth_bits(q), nibbles], dim=-1)


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16 bytes, rounding to nearest even (ggml_compute_fp32_to_bf16)."""
    n = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    nan = (n & 0x7FFFFFFF) > 0x7F800000
    n = torch.where(nan, (n & 0xFFFF0000) | (64 << 16), n)  # NaN: keep it a quiet NaN
    top = ((n + 0x7FFF + ((n >> 16) & 1)) >> 16) & 0xFFFF
    top = torch.where(top >= 0x8000, top - 0x10000, top).to(torch.int16)
    return top.view(torch.uint8)


_QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1}
