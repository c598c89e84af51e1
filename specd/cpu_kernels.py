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

**The step** (``decode_step.cpp``, :class:`DecodeStep`). A whole decode or verify pass of
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


#: The most new tokens a :class:`DecodeStep` takes (the pending token and a draft).
STEP_TOKENS = 16
#: The order of a layer's weights in :class:`DecodeStep` (biases may be None).
LAYER_WEIGHTS = ("ln1", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln2", "wg", "wu", "wd")


class DecodeStep:
    """A decode or verify pass (1-:data:`STEP_TOKENS` new tokens over a float32 KV cache)
    of a Llama-style decoder, the whole of it in one call (``specd/csrc/decode_step.cpp``).

    :param layers: each layer's weights in :data:`LAYER_WEIGHTS` order, as ``[out, in]``
        matrices and vectors.
    :param embed: ``[V, H]``; ``norm``: the final norm ``[H]``; ``lm_head``: ``[V, H]``.
    :raises ValueError: weights or sizes the kernel does not take, naming them.
    """

    def __init__(
        self,
        layers: list[tuple[torch.Tensor | None, ...]],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: torch.Tensor,
        lm_bias: torch.Tensor | None,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
    ) -> None:
        if _step_fn is None and not available():
            raise RuntimeError(f"the CPU kernels are not available: {reason}")
        gate = layers[0][LAYER_WEIGHTS.index("wg")] if layers else None
        if gate is None:
            raise ValueError("decode step kernel: a model without layers or MLP weights")
        hidden, inter = embed.shape[1], gate.shape[0]
        sizes = {"hidden size": hidden, "MLP size": inter, "head size": head_dim}
        if any(v % 16 for v in sizes.values()) or heads % kv_heads:
            raise ValueError(
                f"decode step kernel: needs sizes that are multiples of 16 and whole groups of "
                f"query heads; this model has {', '.join(f'{k} {v}' for k, v in sizes.items())}, "
                f"{heads} query and {kv_heads} key/value heads"
            )
        expected = {
            "ln1": (hidden,), "wq": (heads * head_dim, hidden), "bq": (heads * head_dim,),
            "wk": (kv_heads * head_dim, hidden), "bk": (kv_heads * head_dim,),
            "wv": (kv_heads * head_dim, hidden), "bv": (kv_heads * head_dim,),
            "wo": (hidden, heads * head_dim), "bo": (hidden,), "ln2": (hidden,),
            "wg": (inter, hidden), "wu": (inter, hidden), "wd": (hidden, inter),
        }  # fmt: skip
        ptrs: list[int] = []
        self._keep: list[torch.Tensor] = []
        for i, weights in enumerate(layers):
            for name, w in zip(LAYER_WEIGHTS, weights, strict=True):
                if w is None and name.startswith("b"):
                    ptrs.append(0)
                    continue
                ptrs.append(self._checked(f"layer {i} {name}", w, expected[name]))
        v = lm_head.shape[0]
        self._checked("embedding", embed, (embed.shape[0], hidden))
        self._embed_rows = embed
        self._norm = self._checked("final norm", norm, (hidden,))
        self._lm = self._checked("LM head", lm_head, (v, hidden))
        self._lm_b = self._checked("LM head bias", lm_bias, (v,)) if lm_bias is not None else 0
        self._table = torch.tensor(ptrs, dtype=torch.int64)
        self.layers, self.hidden, self.inter, self.vocab = len(layers), hidden, inter, v
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.eps, self.scale = eps, scale
        self._rows = embed.shape[0]

    def _checked(self, name: str, w: torch.Tensor | None, shape: tuple[int, ...]) -> int:
        if w is None or tuple(w.shape) != shape:
            got = "none" if w is None else tuple(w.shape)
            raise ValueError(f"decode step kernel: {name} is {got}, expected {shape}")
        if w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
            raise ValueError(f"decode step kernel: {name} must be contiguous float32 on CPU")
        self._keep.append(w)
        return w.data_ptr()

    def __call__(
        self,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        buffers: list[tuple[torch.Tensor, torch.Tensor]],
        past: int,
        tree: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step for the new tokens ``ids`` ``[T]`` at positions ``past`` ..
        ``past + T - 1`` of ``buffers`` (each layer's ``[1, KV, capacity, D]``), where their
        keys and values go; the caller counts them.

        :param cos, sin: the rotary tables ``[T, D]`` at the tokens' positions (their depth
            in a tree).
        :param tree: bool ``[T, T]``, where new token i sees new token j (None: a chain).
            Every new token sees every cached position.
        :returns: logits ``[T, V]`` and the final norm's output ``[T, H]``.
        :raises ValueError: tokens, tables or buffers the step cannot take.
        """
        d, t = self.head_dim, ids.numel()
        ids = ids.reshape(-1)
        if not 1 <= t <= STEP_TOKENS:
            raise ValueError(f"decode step kernel: {t} new tokens, it takes 1-{STEP_TOKENS}")
        if int(ids.min()) < 0 or int(ids.max()) >= self._rows:
            raise ValueError(f"decode step kernel: token ids outside 0..{self._rows - 1}")
        if len(buffers) != self.layers:
            raise ValueError(
                f"decode step kernel: {len(buffers)} cache layers, model {self.layers}"
            )
        cos, sin = cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous()
        for name, x in (("cos", cos), ("sin", sin)):
            if x.shape != (t, d) or x.dtype != torch.float32:
                raise ValueError(f"decode step kernel: {name} must be float32 [{t}, {d}]")
        if tree is not None:
            if tree.shape != (t, t):
                raise ValueError(
                    f"decode step kernel: tree mask {tuple(tree.shape)}, expected {(t, t)}"
                )
            tree = tree.to(torch.uint8).contiguous()
        cache = []
        for k, v in buffers:
            for x in (k, v):
                ok = x.dim() == 4 and x.shape[0] == 1 and x.shape[1] == self.kv_heads
                ok = ok and x.shape[3] == d and x.dtype == torch.float32 and x.device.type == "cpu"
                if not ok or x.stride(3) != 1 or x.stride(2) != d or x.shape[2] < past + t:
                    raise ValueError(
                        f"decode step kernel: cache buffer {tuple(x.shape)} {x.dtype} cannot take "
                        f"positions {past}-{past + t - 1} "
                        f"(expected float32 [1, {self.kv_heads}, >= {past + t}, {d}])"
                    )
            cache += [k.data_ptr(), v.data_ptr(), k.stride(1), v.stride(1)]
        table = torch.tensor(cache, dtype=torch.int64)
        x = self._embed_rows[ids]  # [T, H]
        threads = torch.get_num_threads()
        assert _step_fn is not None and _step_work is not None
        sizes = (self.hidden, self.inter, self.heads, self.kv_heads, d)
        work = _buffer("step", _step_work(*sizes, t, past, threads))
        logits = torch.empty(t, self.vocab, dtype=torch.float32)
        hidden = torch.empty(t, self.hidden, dtype=torch.float32)
        _step_fn(
            self._table.data_ptr(), self.layers, table.data_ptr(), *sizes, self.eps, self.scale,
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), t, past,
            tree.data_ptr() if tree is not None else None,
            self._norm, self._lm, self._lm_b or None, self.vocab,
            logits.data_ptr(), hidden.data_ptr(), work.data_ptr(), threads,
        )  # fmt: skip
        return logits, hidden


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
    from .models import cache_dir

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
