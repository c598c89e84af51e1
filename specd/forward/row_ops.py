"""The CPU kernels' row-wise operations for the lean forward's passes of many tokens (a
prefill): the RMS norm, the rotary embedding and the gated activation of
``csrc/decode_step.cpp``, each one pass over the activations on the kernels' threads. In
PyTorch the same arithmetic takes five to seven passes each (``pow``, ``mean``, ``rsqrt``,
``mul``, ``cat``, ``neg``, ``silu``...): on a 2-vCPU AVX-512 EPYC PyTorch's profiler put them
at ~80 ms of a 1k-token prefill, which runs 1.05-1.07x faster with these
(``scripts/row_ops.py``). Their results differ from PyTorch's by float32 rounding (the order
of a norm's sum, a fused multiply-add), as :func:`specd.forward.cpu_kernels.attention`'s do.

:func:`specd.forward.cpu_kernels.row_ops` gives them where they serve a pass."""

from __future__ import annotations

import ctypes
from typing import Any

import torch


def bind(dll: Any) -> RowOps | None:
    """The operations of one loaded build of the kernels, or None for a build of sources
    without them (``scripts/step_kernel.py --against`` loads earlier versions)."""
    try:
        return RowOps(dll)
    except AttributeError:
        return None


class RowOps:
    """The three operations of one loaded build of the kernels (``dll``)."""

    def __init__(self, dll: Any) -> None:
        i64, ptr, f32, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
        self._rmsnorm = dll.specd_rmsnorm
        self._rmsnorm.argtypes = [ptr, ptr, i64, i64, f32, ptr, cint]
        self._rotary = dll.specd_rotary
        self._rotary.argtypes = [ptr, ptr, ptr, i64, i64, i64, ptr, cint]
        self._silu_mul = dll.specd_silu_mul
        self._silu_mul.argtypes = [ptr, ptr, i64, ptr, cint]
        for fn in (self._rmsnorm, self._rotary, self._silu_mul):
            fn.restype = None

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor | None:
        """``x / sqrt(mean(x^2) + eps) * w`` over the last dimension of ``x`` ``[..., H]``
        (float32), or None where ``H`` is no multiple of 16 (PyTorch's operations then)."""
        h = x.shape[-1]
        if h % 16 or w.shape != (h,) or w.dtype != torch.float32:
            return None
        x, w = x.contiguous(), w.contiguous()
        out = torch.empty_like(x)
        self._rmsnorm(
            x.data_ptr(), w.data_ptr(), x.numel() // h, h, eps, out.data_ptr(), _threads()
        )
        return out

    def rotary(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int
    ) -> torch.Tensor | None:
        """``x * cos + rotate_half(x) * sin`` for ``x`` ``[1, T, heads * D]`` and ``cos``,
        ``sin`` ``[1, 1, T, D]``, or None for shapes it does not take."""
        t = x.shape[1]
        d = cos.shape[-1]
        if d % 2 or x.shape != (1, t, heads * d) or cos.numel() != t * d or sin.shape != cos.shape:
            return None
        x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
        out = torch.empty_like(x)
        self._rotary(
            x.data_ptr(), cos.data_ptr(), sin.data_ptr(), t, heads, d, out.data_ptr(), _threads()
        )
        return out

    def silu_mul(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor | None:
        """``silu(g) * u``, or None where the two differ in shape."""
        if g.shape != u.shape:
            return None
        g, u = g.contiguous(), u.contiguous()
        out = torch.empty_like(g)
        self._silu_mul(g.data_ptr(), u.data_ptr(), g.numel(), out.data_ptr(), _threads())
        return out


def _threads() -> int:
    return torch.get_num_threads()
