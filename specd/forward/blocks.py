"""Weights kept as quantized blocks, in GGUF's layout.

A matrix ``[rows, cols]`` is stored row by row: ``rows`` runs of ``cols / values`` blocks,
each block covering ``values`` consecutive values of its row (32, or 256 for the K-quants),
in one of the formats of :mod:`.block_formats` (``q4_0``, ``q4_1``, ``q5_0``, ``q5_1``,
``q8_0``, ``q4_k``, ``q5_k``, ``q6_k``, ``bf16``; the layouts, the step kernel's codes and
the exact de-quantization rules are set out there).

:class:`BlockWeight` holds one such matrix where a float32 weight would be: the step kernel
reads its blocks, ``F.linear`` and ``F.embedding`` de-quantize (only the rows looked up), and
anything else is refused. :func:`quantize` makes blocks the way ggml's reference quantizers
do; :func:`read_gguf` reads a Llama-style GGUF file's tensors without copying its blocks.
"""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from . import cpu_kernels, gguf_file
from .block_formats import (
    BF16,
    BLOCK,
    F32,
    FORMATS,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    QUANTIZABLE,
    Format,
    check_format,
    decode,
    encode,
)
from .gguf_file import UnsupportedGGUFError

__all__ = [
    "BF16",
    "BLOCK",
    "F32",
    "FORMATS",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q5_0",
    "Q5_1",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "QUANTIZABLE",
    "BlockWeight",
    "Format",
    "UnsupportedGGUFError",
    "decode",
    "quantize",
    "read_gguf",
]


class BlockWeight:
    """A ``[rows, cols]`` matrix stored as blocks (GGUF's layout), used where a float32
    weight tensor is: the step kernel reads its blocks; any other use de-quantizes.

    ``data`` is uint8 ``[rows, cols // fmt.values * fmt.block_bytes]``, contiguous, on the CPU (it
    may be a view of a memory-mapped file). ``w[ids]``, ``w[3]``, ``w[:5]`` and
    ``F.embedding(ids, w)`` de-quantize only the rows they name; ``F.linear(x, w, b)``
    de-quantizes the whole matrix; any other torch function is a TypeError.
    """

    def __init__(self, data: torch.Tensor, fmt: Format, shape: tuple[int, int]) -> None:
        fmt = check_format(fmt)
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
        try:
            rows, cols = (operator.index(n) for n in shape)
        except (TypeError, ValueError):
            raise ValueError(f"shape must be (rows, cols) of two counts, not {shape!r}") from None
        if rows < 0:
            raise ValueError(f"shape {tuple(shape)}: rows must not be negative")
        if cols == 0 or cols % fmt.values:
            raise ValueError(
                f"shape {tuple(shape)}: cols must be a positive multiple of {fmt.values} "
                f"({fmt.name} blocks)"
            )
        expected = (rows, cols // fmt.values * fmt.block_bytes)
        if tuple(data.shape) != expected:
            raise ValueError(
                f"{fmt.name} blocks of a {rows}x{cols} matrix are {expected[0]} rows of "
                f"{expected[1]} bytes, but the data is {tuple(data.shape)}"
            )
        self.data = data
        self.fmt = fmt
        self._shape = torch.Size((rows, cols))
        #: the step kernel's woven copy (:func:`.interleave.weave`), made on first use
        self.woven: torch.Tensor | None = None

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
        """The matrix in float32 ``[rows, cols]``, exactly (the rules of :mod:`.block_formats`):
        by the step kernel's own decoder where the CPU kernels load (on torch's threads,
        ~10x faster than element-wise torch), else by :func:`decode`."""
        if self.data.device.type == "cpu" and cpu_kernels.available():
            return cpu_kernels.dequantize(self.data_ptr(), self.fmt.code, *self.shape)
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
        rows = decode_rows(self.data[index], self.fmt)
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
        fmt = next((a.fmt.name for a in args if isinstance(a, BlockWeight)), "block")
        raise TypeError(
            f"{name} is not supported on a quantized weight ({fmt} blocks); only F.linear, "
            f"F.embedding and row indexing are; call .dequantize() for a float32 copy"
        )


def decode_rows(raw: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The float32 values ``[..., cols]`` of rows of blocks ``[..., row bytes]``, exactly: by
    the step kernel's decoder where the CPU kernels load (one call, where :func:`decode`
    runs a dozen operations: a step's embedding rows), else by :func:`decode`."""
    whole = raw.dim() > 0 and raw.shape[-1] % fmt.block_bytes == 0  # bfloat16 rows may not be
    if raw.device.type != "cpu" or not whole or not cpu_kernels.available():
        return decode(raw, fmt)
    many = raw.reshape(-1, raw.shape[-1]).contiguous()
    cols = raw.shape[-1] // fmt.block_bytes * fmt.values
    out = cpu_kernels.dequantize(many.data_ptr(), fmt.code, many.shape[0], cols)
    return out.reshape(*raw.shape[:-1], cols)


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


#: The most rows :func:`product` hands the step kernel's product; more go through BLAS.
PRODUCT_ROWS = 16


def product(
    x: torch.Tensor,
    w: torch.Tensor | BlockWeight,
    bias: torch.Tensor | None = None,
    fallback: Any = F.linear,
) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for float32 ``x`` ``[..., K]`` and a weight ``[N, K]``, float32
    or blocks: for a few rows where the CPU kernels run, the step kernel's own product, which
    reads blocks as stored and decodes each once for all the rows (a drafter's small layers
    and its LM head rows, outside the step); otherwise ``fallback(x, w, bias)`` (by default
    ``F.linear``, which de-quantizes blocks)."""
    K = x.shape[-1]
    n = x.numel() // K if K else 0
    kernel = (
        0 < n <= PRODUCT_ROWS
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and w.dim() == 2
        and w.shape[1] == K
        and not (
            torch.is_grad_enabled() and (x.requires_grad or getattr(w, "requires_grad", False))
        )
        and (bias is None or (bias.dtype == torch.float32 and bias.shape == (w.shape[0],)))
        and cpu_kernels.available()
    )
    if kernel and isinstance(w, BlockWeight):
        ptr, code = w.data_ptr(), w.fmt.code
    elif (
        kernel
        and isinstance(w, torch.Tensor)
        and w.dtype == torch.float32
        and w.device.type == "cpu"
        and w.is_contiguous()
    ):
        ptr, code = w.data_ptr(), F32.code
        kernel = K % 16 == 0
    else:
        kernel = False
    if not kernel:
        return fallback(x, w, bias)
    y = cpu_kernels.product(x.reshape(n, K), ptr, code, w.shape[0], K, bias)
    return y.reshape(*x.shape[:-1], w.shape[0])


def rows_of(w: BlockWeight, index: torch.Tensor) -> BlockWeight:
    """The rows ``index`` of ``w``, still as blocks (their bytes copied, never decoded)."""
    return BlockWeight(w.data[index].contiguous(), w.fmt, (int(index.numel()), w.shape[1]))


def quantize(w: torch.Tensor, fmt: Format | str) -> BlockWeight:
    """``w``, float ``[rows, cols]`` with ``cols`` a multiple of 32, as blocks of ``fmt``,
    rounded the way ggml's reference quantizers round (:func:`.block_formats.encode` has the
    rules). ValueError naming the format, shape or value that is wrong."""
    fmt = check_format(fmt)
    if fmt.name not in QUANTIZABLE:
        raise ValueError(
            f"specd reads {fmt.name} blocks from GGUF files but does not make them; it "
            f"quantizes to {', '.join(QUANTIZABLE)}"
        )
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
    if fmt != BF16 and not bool(torch.isfinite(x).all()):
        raise ValueError(f"cannot store non-finite values as {fmt.name} blocks")
    packed = encode(x, fmt)
    data = packed.reshape(rows, cols // BLOCK * fmt.block_bytes).contiguous()
    return BlockWeight(data, fmt, (rows, cols))


def read_gguf(path: Path) -> tuple[dict[str, torch.Tensor | BlockWeight], dict[str, Any]]:
    """The tensors of a Llama-style GGUF file under Hugging Face names, and its metadata.

    The file is memory-mapped and its blocks kept as stored: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
    Q4_K, Q5_K, Q6_K and BF16 matrices as :class:`BlockWeight` viewing the map (vectors, and BF16 matrices whose rows
    are no whole blocks, as float32 tensors), F32 tensors as float32 tensors viewing it, F16
    as float32 copies; only q and k rows are copied, put back in Hugging Face's order.
    :func:`specd.forward.gguf_file.read` has the names, the metadata and the errors."""
    raw, meta = gguf_file.read(Path(path))
    tensors: dict[str, torch.Tensor | BlockWeight] = {}
    for name, (data, fmt, shape) in raw.items():
        tensors[name] = data if fmt is None else BlockWeight(data, fmt, (shape[0], shape[1]))
    return tensors, meta
