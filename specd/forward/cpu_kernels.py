"""Kernels written for x86-64 CPUs with AVX-512, built on first use with the machine's C++
compiler into one library (``specd/csrc/``).

**Attention** (``attention.cpp``, :func:`attention`). The lean forward
(:mod:`specd.fastpath`) calls it for passes of at least :data:`MIN_TOKENS` new tokens over a
float32 cache with 64-dimensional heads: a prefill, from an empty cache or a chunk on top
of one (a tree mask is taken too). On a 2-vCPU AMD EPYC it ran the causal attention of a
1,024-token prompt (9 query heads, 3 key/value heads) in 6.2 ms a layer where PyTorch's CPU
flash kernel took 12.4 ms (``scripts/attention_kernel.py``). Its outputs differ from
``scaled_dot_product_attention``'s by float32 rounding (the order of the sums), as two such
kernels do; greedy output stayed token-identical to plain decoding in every benchmark run
(docs/benchmarks.md).

**The step** (``decode_step.cpp``, :class:`specd.decode_step.DecodeStep`). A whole decode or verify pass of
1-:data:`STEP_TOKENS` new tokens of a Llama-style decoder in one call: the compiled step's
``kernel`` backend (:mod:`specd.compiled`). On the same EPYC a one-token step at 1,024
cached tokens took ~15 ms against ~34 eager, an 8-token pass ~22 against ~41
(``scripts/step_kernel.py``).

Built once per machine into the cache directory (:func:`specd.models.cache_dir`), keyed by
the sources, the compiler and its flags; where there is no compiler, no AVX-512, or the
build fails, the reason is logged once and everything runs through PyTorch as before.
``SPECD_CPU_KERNELS=off`` turns both off.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
#: The kernels' sources, built into one library; the header is part of the build's key.
SOURCES = (CSRC / "attention.cpp", CSRC / "decode_step.cpp")
HEADERS = (CSRC / "vec.h",)
#: The instruction sets the kernel is written for (what PyTorch calls ``AVX512``).
ISA_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma")
FLAGS = ("-O3", "-std=c++17", "-fopenmp", "-shared", "-fPIC", *ISA_FLAGS)
#: The head size the kernel is written for.
HEAD_DIM = 64
#: The fewest new tokens a pass hands the kernel. Each call transposes the whole cache's
#: keys once, which a prefill chunk repays many times over; with verify passes of 2-9
#: tokens through it too, editor requests spent 14-20% longer verifying (docs/benchmarks.md).
MIN_TOKENS = 16
#: ``SPECD_CPU_KERNELS`` values that turn the kernels off.
OFF = ("0", "off", "false", "no")

_lock = threading.Lock()
_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_step_fn: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_step_work: ctypes._CFuncPtr | None = None  # type: ignore[name-defined]
_tried = False
#: why the kernel is not in use ("" when it is, or before the first try)
reason = ""


def available() -> bool:
    """Whether the attention kernel is built and loaded (building it on the first call)."""
    if not _tried:
        _load()
    return _fn is not None


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
    if _fn is None and not available():
        raise RuntimeError(f"the CPU attention kernel is not available: {reason}")
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
    scratch = _scratch(kv * d * ld)
    assert _fn is not None
    _fn(
        q.data_ptr(), q.stride(1), q.stride(2),
        keys.data_ptr(), keys.stride(1), keys.stride(2),
        values.data_ptr(), values.stride(1), values.stride(2),
        out.data_ptr(), out.stride(2), out.stride(1),
        tree.data_ptr() if tree is not None else None,
        hq, kv, t, past, scale, scratch.data_ptr(), ld, torch.get_num_threads(),
    )  # fmt: skip
    return out.transpose(1, 2)


#: The most new tokens the step kernel takes (:class:`specd.decode_step.DecodeStep`).
STEP_TOKENS = 16


_local = threading.local()


def _buffer(name: str, n: int) -> torch.Tensor:
    """This thread's buffer ``name``, grown to ``n`` floats and kept: a fresh one per call
    (hundreds of KB at 1k tokens) would be fresh pages to fault in each time."""
    buf = getattr(_local, name, None)
    if buf is None or buf.numel() < n:
        buf = torch.empty(n, dtype=torch.float32)
        setattr(_local, name, buf)
    return buf


def _scratch(n: int) -> torch.Tensor:
    """This thread's buffer for the attention kernel's transposed keys."""
    return _buffer("buf", n)


# -- building ---------------------------------------------------------------------------------


def _load() -> None:
    global _fn, _step_fn, _step_work, _tried, reason
    with _lock:
        if _tried:
            return
        try:
            _fn, _step_fn, _step_work = _open(_build())
            reason = ""
            log.info("CPU attention kernel in use")
        except _Unavailable as e:
            reason = str(e)
            log.info("CPU attention kernel off: %s", reason)
        except Exception as e:  # a compiler or loader failure of any kind
            reason = f"{type(e).__name__}: {e}"
            log.warning("CPU attention kernel off, attention runs through PyTorch: %s", reason)
        _tried = True


class _Unavailable(Exception):
    """This machine or setting does not use the kernel (not an error)."""


def _compiler() -> str:
    named = os.environ.get("CXX")
    if named:
        found = shutil.which(named)
        if not found:
            raise _Unavailable(f"the C++ compiler CXX={named!r} was not found")
        return found
    cxx = shutil.which("c++") or shutil.which("g++")
    if not cxx:
        raise _Unavailable("no C++ compiler (install g++, or set CXX)")
    return cxx


def _build() -> Path:
    if os.environ.get("SPECD_CPU_KERNELS", "").strip().lower() in OFF:
        raise _Unavailable("turned off by SPECD_CPU_KERNELS")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise _Unavailable(f"written for x86-64, this is {platform.machine()}")
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        raise _Unavailable(
            f"needs AVX-512, this CPU offers {torch.backends.cpu.get_cpu_capability()}"
        )
    cxx = _compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    key = hashlib.sha256()
    for part in (
        *(f.read_bytes() for f in (*SOURCES, *HEADERS)),
        " ".join(FLAGS).encode(),
        cxx.encode(),
        version.stdout.encode(),
    ):
        key.update(part)
    from ..paths import cache_dir

    where = cache_dir() / "kernels"
    lib = where / f"kernels-{key.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    where.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=where)
    os.close(fd)
    try:
        done = subprocess.run(
            [cxx, *FLAGS, *map(str, SOURCES), "-o", tmp],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cxx} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, lib)  # atomic: another process building it at once is harmless
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


def _open(lib: Path) -> tuple[Any, Any, Any]:
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
        ptr, i64, ptr,  # layer weights, layers, cache buffers
        i64, i64, i64, i64, i64,  # hidden, intermediate, query heads, key/value heads, head size
        ctypes.c_float, ctypes.c_float,  # norm epsilon, attention scale
        ptr, ptr, ptr, i64, i64, ptr,  # embeddings, cos, sin, new tokens, cached, tree
        ptr, ptr, ptr, i64,  # final norm, LM head, its bias, vocabulary
        ptr, ptr, ptr, ctypes.c_int,  # logits, hidden, work, threads
    ]  # fmt: skip
    step.restype = None
    work = dll.specd_decode_step_work
    work.argtypes = [i64, i64, i64, i64, i64, i64, i64, ctypes.c_int]
    work.restype = i64
    if dll.specd_decode_step_max_tokens() != STEP_TOKENS:
        raise RuntimeError(f"{lib} was built for another step size")
    return fn, step, work


def _reset() -> None:
    """Forget the loaded kernels, so the next call tries again (tests)."""
    global _fn, _step_fn, _step_work, _tried, reason
    with _lock:
        _fn, _step_fn, _step_work, _tried, reason = None, None, None, False, ""
