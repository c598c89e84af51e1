"""specd's CPU kernels from Python: written once over a 16-float vector layer
(``csrc/vec.h``), built on first use for the best instruction set this CPU runs (AVX-512,
AVX2 + FMA or ARM64 NEON; :mod:`specd.forward.kernel_build`) and loaded here.

**Attention** (``csrc/attention.cpp``, :func:`attention`). The lean forward
(:mod:`specd.forward.fastpath`) calls it for passes of at least :data:`MIN_TOKENS` new
tokens over a float32 cache with 64-dimensional heads: a prefill, from an empty cache or a
chunk on top of one (a tree mask is taken too). On a 2-vCPU AMD EPYC (AVX-512) it ran the
causal attention of a 1,024-token prompt (9 query heads, 3 key/value heads) in 6.2 ms a
layer where PyTorch's CPU flash kernel took 12.4 ms (``scripts/attention_kernel.py``). Its
outputs differ from ``scaled_dot_product_attention``'s by float32 rounding (the order of the
sums), as two such kernels do; greedy output stayed token-identical to plain decoding in
every benchmark run (docs/benchmarks.md).

**The step** (``csrc/decode_step.cpp``, :class:`specd.forward.decode_step.DecodeStep`, through
:func:`step_function`, :func:`step_work_floats` and :func:`buffer`). A whole decode or
verify pass of 1-:data:`STEP_TOKENS` new tokens of a Llama-style decoder in one call: the
compiled step's ``kernel`` backend (:mod:`specd.forward.compiled`). On the same EPYC a
one-token step at 1,024 cached tokens took ~15 ms against ~34 eager, an 8-token pass ~22
against ~41 (``scripts/step_kernel.py``); docs/kernels.md has the other builds' figures.

:func:`isa` names the build in use (``"none"`` where there is none). Where no build runs
(no compiler, a CPU without a vector build, a failed build) the reason is logged once, kept
in :data:`reason`, and everything runs through PyTorch as before. ``SPECD_CPU_KERNELS=off``
turns the kernels off; ``SPECD_KERNEL_ISA=avx512|avx2|neon|scalar`` asks for one build.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import kernel_build
from . import row_ops as _rows
from .kernel_build import ISAS, OFF, Unavailable
from .row_ops import RowOps

__all__ = [
    "HEAD_DIM", "ISAS", "MIN_TOKENS", "OFF", "STEP_TOKENS", "attention", "available", "buffer",
    "build_ahead",
    "dequantize", "library_file", "product",
    "isa", "reason", "row_ops", "runnable_isas", "step_function", "step_work_floats", "supports",
    "use",
]  # fmt: skip

log = logging.getLogger(__name__)

#: The head size the kernel is written for.
HEAD_DIM = 64
#: The fewest new tokens a pass hands the kernel. Each call transposes the whole cache's
#: keys once, which a prefill chunk repays many times over; with verify passes of 2-9
#: tokens through it too, editor requests spent 14-20% longer verifying (docs/benchmarks.md).
MIN_TOKENS = 16
#: The most new tokens the step kernel takes (:class:`specd.forward.decode_step.DecodeStep`).
STEP_TOKENS = 16
#: Values below which :func:`dequantize` decodes on the calling thread alone.
SMALL_DEQUANTIZE = 1 << 16


@dataclass(frozen=True)
class _Library:
    """One build of the kernels, loaded: its instruction set and its entry points."""

    isa: str
    attention: Any
    step: Any
    step_work: Any
    dequantize: Any
    product: Any
    weave: Any
    rows: RowOps | None  # None: a build of earlier sources
    file: str  # the library's file name: the build's sources, flags and compiler, hashed


_lock = threading.Lock()
_current: _Library | None = None
_loaded: dict[str, _Library] = {}  # every build loaded in this process, by instruction set
_tried = False
#: why the kernels are not in use ("" when they are, or before the first try)
reason = ""


def available() -> bool:
    """Whether the kernels are built and loaded (building them on the first call)."""
    if not _tried:
        _load()
    return _current is not None


def build_ahead() -> None:
    """Start building the kernels in the background where this process has not loaded them
    (nor tried to) and they are not built yet (:func:`specd.forward.kernel_build.prebuild`):
    a load calls it first, so that a first run's compiler and model conversion overlap."""
    if not _tried:
        kernel_build.prebuild()


def isa() -> str:
    """The instruction set of the kernels in use (``avx512``, ``avx2``, ``neon``,
    ``scalar``), or ``"none"`` where they are not (building them on the first call)."""
    return _current.isa if available() and _current is not None else "none"


def runnable_isas() -> tuple[str, ...]:
    """The builds this CPU can run, best first; ``scalar`` (plain C++) runs anywhere."""
    return kernel_build.runnable()


def use(name: str, csrc: Path | None = None) -> None:
    """Run the kernels built for ``name`` from now on, in this process (tests and
    benchmarks that compare the builds); with ``csrc``, those built from that version of
    the ``csrc/`` folder.

    :raises ValueError: not one of :data:`ISAS`; RuntimeError: this CPU cannot run it, or
        it does not build here.
    """
    global _current, _tried, reason
    if name not in ISAS:
        raise ValueError(f"unknown instruction set {name!r}; one of {', '.join(ISAS)}")
    if name not in kernel_build.runnable():
        raise RuntimeError(f"this CPU ({kernel_build.host()}) cannot run the {name} kernels")
    key = f"{name}@{csrc}" if csrc else name
    with _lock:
        try:
            lib = _loaded.get(key) or _open(kernel_build.build(name, csrc))
        except Unavailable as e:
            raise RuntimeError(str(e)) from e
        _loaded[key] = lib
        _current, _tried, reason = lib, True, ""


def supports(tokens: int, dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether a pass of ``tokens`` new tokens with queries of this dtype, device and head
    size runs the kernel (building and loading it on the first such pass)."""
    return (
        tokens >= MIN_TOKENS
        and device.type == "cpu"
        and dtype == torch.float32
        and head_dim == HEAD_DIM
        and available()
    )


def row_ops(tokens: int, dtype: torch.dtype, device: torch.device) -> RowOps | None:
    """The kernels' row-wise operations (:mod:`specd.forward.row_ops`) for a pass of
    ``tokens`` new tokens, or None where PyTorch's run it: fewer than :data:`MIN_TOKENS`
    tokens (steps and verify passes stay as they are), not float32 on the CPU, inside
    ``torch.compile``'s tracing, or no kernels here."""
    if tokens < MIN_TOKENS or dtype != torch.float32 or device.type != "cpu":
        return None
    if torch.compiler.is_compiling() or not available() or _current is None:
        return None
    return _current.rows


def attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    tree: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``q`` ``[1, Hq, T, D]`` (the last T positions of the cache) over ``keys``
    and ``values`` ``[1, KV, past + T, D]``: every new query sees the ``past`` cached
    positions, and among the new ones itself and those before it, or with ``tree`` (bool
    ``[T, T]``) those it marks.

    :returns: ``[1, Hq, T, D]``, a view of a ``[1, T, Hq, D]`` tensor (so the output
        projection reads it without a copy).
    :raises ValueError: shapes, dtypes or strides the kernel does not take.
    """
    lib = _library()
    batch, hq, t, d = q.shape
    kv, span = keys.shape[1], keys.shape[2]
    past = span - t
    one = batch == 1 and keys.shape[0] == 1  # one sequence
    if not one or d != HEAD_DIM or hq % kv or past < 0 or values.shape != keys.shape:
        raise ValueError(
            f"attention kernel: queries {tuple(q.shape)}, keys {tuple(keys.shape)}, "
            f"values {tuple(values.shape)}"
        )
    if q.stride(-1) != 1:  # queries of a weight-major product (specd.products) are transposed
        q = q.contiguous()
    for name, x in (("queries", q), ("keys", keys), ("values", values)):
        if x.dtype != torch.float32 or x.device.type != "cpu" or x.stride(-1) != 1:
            raise ValueError(f"attention kernel: {name} must be float32 on CPU, last dim dense")
    if tree is not None:
        if tree.shape != (t, t):
            raise ValueError(f"attention kernel: tree mask {tuple(tree.shape)}, expected {(t, t)}")
        tree = tree.to(torch.bool).contiguous()
    out = q.new_empty(1, t, hq, d)
    ld = -(-span // 64) * 64
    scratch = buffer("attention", kv * d * ld)  # the transposed keys
    lib.attention(
        q.data_ptr(), q.stride(1), q.stride(2),
        keys.data_ptr(), keys.stride(1), keys.stride(2),
        values.data_ptr(), values.stride(1), values.stride(2),
        out.data_ptr(), out.stride(2), out.stride(1),
        tree.data_ptr() if tree is not None else None,
        hq, kv, t, past, scale, scratch.data_ptr(), ld, torch.get_num_threads(),
    )  # fmt: skip
    return out.transpose(1, 2)


def library_file() -> str:
    """The file name of the build in use (it names a hash of its sources, flags and
    compiler), or "" where none loads."""
    return _current.file if available() and _current is not None else ""


def step_function() -> Any:
    """The step kernel, ``specd_decode_step`` of ``csrc/decode_step.cpp`` (its arguments
    are listed there), as a ctypes function.

    :raises RuntimeError: the kernels are not available here, saying why.
    """
    return _library().step


def dequantize(
    data_ptr: int, code: int, rows: int, cols: int, scratch: bool = False
) -> torch.Tensor:
    """The float32 values ``[rows, cols]`` of a weight stored at ``data_ptr`` in the step
    kernel's format ``code`` (``specd_dequantize``: the values the step multiplies with, on
    torch's threads).

    :param scratch: into this thread's kept buffer (:func:`buffer`), valid until the next
        such call: a product that drops the copy right after it, without faulting in fresh
        pages for every weight of every pass.
    :raises RuntimeError: the kernels are not available here, saying why.
    """
    if scratch:
        out = buffer("dequantize", rows * cols)[: rows * cols].view(rows, cols)
    else:
        out = torch.empty(rows, cols, dtype=torch.float32)
    # a few rows (a step's embedding rows) on this thread: waking the others costs more
    threads = torch.get_num_threads() if rows * cols >= SMALL_DEQUANTIZE else 1
    _library().dequantize(data_ptr, code, rows, cols, out.data_ptr(), threads)
    return out


def weave(data_ptr: int, code: int, rows: int, cols: int, out: torch.Tensor) -> bool:
    """Write the woven copy (:mod:`specd.forward.interleave`) of a Q4_0, Q4_1 or Q8_0 weight
    (the step kernel's format ``code``) ``[rows, cols]`` at ``data_ptr`` into ``out`` (uint8,
    contiguous, its size), on torch's threads (``specd_weave``).

    :returns: False where a Q4_0 scale's ``-8 d`` overflows a half (``out`` unusable).
    """
    threads = torch.get_num_threads()
    return _library().weave(data_ptr, code, rows, cols, out.data_ptr(), threads) == 0


def product(
    x: torch.Tensor, data_ptr: int, code: int, rows: int, cols: int,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``x @ W.T (+ bias)`` ``[T, rows]`` for float32 rows ``x`` ``[T, cols]`` and a weight
    ``W`` ``[rows, cols]`` stored at ``data_ptr`` in the step kernel's format ``code``
    (``specd_product``: the step's products, each block of the weight decoded once for all
    ``T`` rows, on torch's threads). The caller keeps the weight alive and checks the
    shapes (:func:`specd.forward.blocks.product` does both).

    :raises RuntimeError: the kernels are not available here, saying why.
    """
    x = x.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(x.shape[0], rows, dtype=torch.float32)
    _library().product(
        data_ptr, code, rows, cols, x.data_ptr(), x.shape[0],
        None if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out


def step_work_floats(
    hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int, tokens: int, past: int,
    threads: int,
) -> int:  # fmt: skip
    """Floats of the work buffer the step kernel needs for a pass of ``tokens`` new tokens
    over ``past`` cached ones on ``threads`` threads.

    :raises RuntimeError: the kernels are not available here, saying why.
    """
    return int(
        _library().step_work(hidden, inter, heads, kv_heads, head_dim, tokens, past, threads)
    )


_local = threading.local()


def buffer(name: str, n: int) -> torch.Tensor:
    """This thread's float32 buffer ``name``, at least ``n`` floats, grown and kept: a fresh
    one per call (hundreds of KB at 1k tokens) would be fresh pages to fault in each time."""
    buf = getattr(_local, name, None)
    if buf is None or buf.numel() < n:
        buf = torch.empty(n, dtype=torch.float32)
        setattr(_local, name, buf)
    return buf


def _library() -> _Library:
    if not available() or _current is None:
        raise RuntimeError(f"the CPU kernels are not available: {reason}")
    return _current


# -- loading ----------------------------------------------------------------------------------


def _load() -> None:
    global _current, _tried, reason
    with _lock:
        if _tried:
            return
        try:
            name = kernel_build.choose()
            _current = _loaded.get(name) or _open(kernel_build.build(name))
            _loaded[name] = _current
            reason = ""
            log.info("CPU kernels in use (%s)", name)
        except Unavailable as e:
            reason = str(e)
            log.info("CPU kernels off, running through PyTorch: %s", reason)
        except Exception as e:  # a compiler or loader failure of any kind
            reason = f"{type(e).__name__}: {e}"
            log.warning("CPU kernels off, running through PyTorch: %s", reason)
        _tried = True


def _open(lib: Path) -> _Library:
    # Loaded after torch, the library's OpenMP runtime is torch's own (same soname), so the
    # kernel's threads are the ones torch's operators use.
    dll = ctypes.CDLL(str(lib))
    if dll.specd_attention_head_dim() != HEAD_DIM:
        raise RuntimeError(f"{lib} was built for another head size")
    fn = dll.specd_attention
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [
        ptr, i64, i64,  # queries
        ptr, i64, i64,  # keys
        ptr, i64, i64,  # values
        ptr, i64, i64,  # output
        ptr,  # tree mask or null
        i64, i64, i64, i64,  # query heads, key/value heads, new tokens, cached tokens
        ctypes.c_float,  # scale
        ptr, i64,  # scratch, its row length
        ctypes.c_int,  # threads
    ]  # fmt: skip
    fn.restype = None
    step = dll.specd_decode_step
    step.argtypes = [
        ptr, ptr, i64, ptr,  # layer weights, their formats, layers, cache buffers
        ctypes.c_int32,  # whether the cache holds halves
        i64, i64, i64, i64, i64,  # hidden, intermediate, query heads, key/value heads, head size
        ctypes.c_float, ctypes.c_float,  # norm epsilon, attention scale
        ptr, ptr, ptr, i64, i64, ptr,  # embeddings, cos, sin, new tokens, cached, tree
        ptr, ptr, ctypes.c_int32, ptr, i64,  # final norm, LM head, its format, bias, vocabulary
        ptr, ptr, ptr, ctypes.c_int,  # logits, hidden, work, threads
    ]  # fmt: skip
    step.restype = None
    dequantize = dll.specd_dequantize
    dequantize.argtypes = [ptr, ctypes.c_int32, i64, i64, ptr, ctypes.c_int]
    dequantize.restype = None
    product = dll.specd_product
    product.argtypes = [ptr, ctypes.c_int32, i64, i64, ptr, i64, ptr, ptr, ctypes.c_int]
    product.restype = None
    work = dll.specd_decode_step_work
    work.argtypes = [i64, i64, i64, i64, i64, i64, i64, ctypes.c_int]
    work.restype = i64
    if dll.specd_decode_step_max_tokens() != STEP_TOKENS:
        raise RuntimeError(f"{lib} was built for another step size")
    dll.specd_kernel_isa.restype = ctypes.c_char_p
    isa = dll.specd_kernel_isa().decode()
    weave = dll.specd_weave
    weave.argtypes = [ptr, ctypes.c_int32, i64, i64, ptr, ctypes.c_int]
    weave.restype = ctypes.c_int
    return _Library(isa, fn, step, work, dequantize, product, weave, _rows.bind(dll), lib.name)


def _reset() -> None:
    """Forget the kernels' choice and every loaded build, so the next call chooses, builds
    and loads again (tests)."""
    global _current, _tried, reason
    with _lock:
        _current, _tried, reason = None, False, ""
        _loaded.clear()
