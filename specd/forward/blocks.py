"""Weights kept as quantized blocks, in GGUF's layout.

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

:class:`BlockWeight` holds one such matrix where a float32 weight would be: the step kernel
reads its blocks, ``F.linear`` and ``F.embedding`` de-quantize (only the rows looked up), and
anything else is refused. :func:`quantize` makes blocks the way ggml's reference quantizers
do; :func:`read_gguf` reads a Llama-style GGUF file's tensors without copying its blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..errors import BadInputError

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


class UnsupportedGGUFError(BadInputError):
    """A GGUF file holds an architecture, tensor or block type specd cannot read."""


def _format(fmt: Format | str) -> Format:
    if not isinstance(fmt, (str, Format)):
        raise ValueError(f"a block format is a Format or a name, not {type(fmt).__name__}")
    found = FORMATS.get(fmt if isinstance(fmt, str) else fmt.name)
    if found is None or (isinstance(fmt, Format) and fmt != found):
        raise ValueError(f"unknown block format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return found


class BlockWeight:
    """A ``[rows, cols]`` matrix stored as blocks (GGUF's layout), used where a float32
    weight tensor is: the step kernel reads its blocks; any other use de-quantizes.

    ``data`` is uint8 ``[rows, cols // 32 * fmt.block_bytes]``, contiguous, on the CPU (it
    may be a view of a memory-mapped file). ``w[ids]``, ``w[3]``, ``w[:5]`` and
    ``F.embedding(ids, w)`` de-quantize only the rows they name; ``F.linear(x, w, b)``
    de-quantizes the whole matrix; any other torch function is a TypeError.
    """

    def __init__(self, data: torch.Tensor, fmt: Format, shape: tuple[int, int]) -> None:
        fmt = _format(fmt)
        if not isinstance(data, torch.Tensor):
            raise ValueError(f"block data must be a uint8 tensor, not {type(data).__name__}")
        if data.dtype != torch.uint8:
            raise ValueError(f"block data must be uint8, not {data.dtype}")
        if data.device.type != "cpu":
            raise ValueError(f"block data must be on the CPU, not {data.device}")
        if data.dim() != 2 or not data.is_contiguous():
            raise ValueError(
                f"block data must be a contiguous 2-D tensor [rows, row bytes], not "
                f"{'non-contiguous ' if data.dim() == 2 else ''}{tuple(data.shape)}"
            )
        if len(shape) != 2 or any(not isinstance(n, int) or n < 0 for n in shape):
            raise ValueError(f"shape must be (rows, cols) of two counts, not {shape!r}")
        rows, cols = shape
        if cols == 0 or cols % BLOCK:
            raise ValueError(f"shape {tuple(shape)}: cols must be a positive multiple of {BLOCK}")
        expected = (rows, cols // BLOCK * fmt.block_bytes)
        if tuple(data.shape) != expected:
            raise ValueError(
                f"{fmt.name} blocks of a {rows}x{cols} matrix are {expected[0]} rows of "
                f"{expected[1]} bytes, but the data is {tuple(data.shape)}"
            )
        self.data = data
        self.fmt = fmt
        self._shape = torch.Size(shape)

    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        """What it computes in."""
        return torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def ndim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        """Bytes stored: what a step reads of it."""
        return self.data.numel()

    def data_ptr(self) -> int:
        """The address of the blocks."""
        return self.data.data_ptr()

    def dim(self) -> int:
        return 2

    def size(self, d: int | None = None) -> torch.Size | int:
        return self._shape if d is None else self._shape[d]

    def dequantize(self) -> torch.Tensor:
        """The matrix in float32 ``[rows, cols]``, exactly (see the module's rules)."""
        return decode(self.data, self.fmt)

    def __getitem__(self, index: Any) -> torch.Tensor:
        """De-quantized rows (``w[ids]``, ``w[3]``, ``w[:5]``), decoding only those rows; a
        second index picks columns of them (``w[3, :8]``)."""
        cols: Any = None
        if isinstance(index, tuple):
            if len(index) not in (1, 2) or any(i is None or i is Ellipsis for i in index):
                raise IndexError(
                    f"a block weight takes a row index and at most a column index, not {index!r}"
                )
            index, cols = index if len(index) == 2 else (index[0], None)
        rows = decode(self.data[index], self.fmt)
        return rows if cols is None else rows[..., cols]

    def __repr__(self) -> str:
        rows, cols = self._shape
        return f"BlockWeight({self.fmt.name}, {rows}x{cols}, {self.nbytes} bytes)"

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.linear:
            return _linear(*args, **kwargs)
        if func is F.embedding:
            return _embedding(*args, **kwargs)
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
        raise TypeError(
            f"{name} is not supported on a quantized weight (blocks); only F.linear, "
            f"F.embedding and row indexing are; call .dequantize() for a float32 copy"
        )


def _linear(
    input: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return F.linear(input, weight.dequantize().to(input.device), bias)


def _embedding(
    input: torch.Tensor,
    weight: BlockWeight,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> torch.Tensor:
    if max_norm is not None:  # renormalises the weight in place, which blocks cannot be
        raise TypeError("F.embedding with max_norm is not supported on a quantized weight")
    # padding_idx, scale_grad_by_freq and sparse only shape gradients, which blocks have none of
    return weight[input.cpu()].to(input.device)


def decode(raw: torch.Tensor, fmt: Format) -> torch.Tensor:
    """De-quantize ``raw``, uint8 ``[..., n * block_bytes]``, to float32 ``[..., n * 32]``."""
    lead = raw.shape[:-1]
    blocks = raw.reshape(*lead, -1, fmt.block_bytes)  # [..., n, block_bytes]
    if fmt == BF16:
        bits = blocks.contiguous().view(torch.int16).to(torch.int32) << 16
        return bits.view(torch.float32).reshape(*lead, -1)
    d = _fp16(blocks, 0)  # [..., n, 1]
    if fmt == Q8_0:
        values = d * blocks[..., 2:].view(torch.int8).to(torch.float32)
    elif fmt == Q4_0:
        values = d * (_nibbles(blocks[..., 2:]).to(torch.float32) - 8.0)
    elif fmt == Q4_1:
        values = d * _nibbles(blocks[..., 4:]).to(torch.float32) + _fp16(blocks, 2)
    else:
        raise ValueError(f"cannot decode {fmt!r}")
    return values.reshape(*lead, -1)


def _fp16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 field at ``offset`` of each block, as float32 ``[..., n, 1]``."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """16 bytes of packed 4-bit values -> the 32 values: low nibbles first, then high."""
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def quantize(w: torch.Tensor, fmt: Format | str) -> BlockWeight:
    """``w``, float ``[rows, cols]`` with ``cols`` a multiple of 32, as blocks of ``fmt``,
    rounded the way ggml's reference quantizers round (per block of 32 values ``x``):

    - ``q8_0``: ``d = max|x| / 127``, ``q = round(x / d)`` (halves away from zero);
    - ``q4_0``: ``d = x[argmax|x|] / -8``, ``q = trunc(x / d + 8.5)`` clamped to 0..15;
    - ``q4_1``: ``d = (max x - min x) / 15``, ``m = min x``, ``q = trunc((x - m) / d + 0.5)``
      clamped to 0..15;
    - ``bf16``: round to nearest even (a NaN stays a quiet NaN).

    Each ``/ d`` is a product with ``1 / d`` in float32, and an all-zero block gets ``d = 0``
    and zeros, as in ggml. ValueError naming the format, shape or value that is wrong.
    """
    fmt = _format(fmt)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2:
        what = tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"quantize takes a 2-D float tensor [rows, cols], not {what}")
    rows, cols = w.shape
    if cols == 0 or cols % BLOCK:
        raise ValueError(
            f"cannot store a {rows}x{cols} matrix as {fmt.name} blocks: cols must be a "
            f"positive multiple of {BLOCK}"
        )
    x = w.detach().to("cpu", torch.float32).reshape(rows, cols // BLOCK, BLOCK)
    if fmt == BF16:
        packed = _bf16_bits(x)
    else:
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"cannot store non-finite values as {fmt.name} blocks")
        packed = _QUANTIZERS[fmt.name](x)
    return BlockWeight(packed.reshape(rows, -1).contiguous(), fmt, (rows, cols))


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


def read_gguf(path: Path) -> tuple[dict[str, torch.Tensor | BlockWeight], dict[str, Any]]:
    """The tensors of a Llama-style GGUF file under Hugging Face names, and its metadata.

    Memory-mapped, blocks kept as stored (only q and k rows are copied, put back in Hugging
    Face's order); see :func:`specd.forward.gguf_file.read` for the details."""
    from .gguf_file import read

    return read(Path(path))
