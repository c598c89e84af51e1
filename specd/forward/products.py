"""Which matrix product streams a decoder's weights fastest, measured on this machine.

The lean forward (:mod:`specd.fastpath`) computes every product ``x @ w.T`` one of three
ways: ``F.linear``; weight-major ``(w @ x.T).T``, which on one AMD EPYC streamed the
weights of a few-row product at three times ``F.linear``'s speed and on an Intel Xeon at
half of it; or oneDNN's product on a prepacked (blocked) copy of the weights. Which one
wins depends on the CPU, its threads, the dtype and the row count, so it is timed here.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F

#: Row counts the prepacked layout is blocked for (the most a verify pass feeds).
PACK_ROWS = 16


def weight_major(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` for ``x`` ``[..., K]`` computed as ``(w @ x.T).T``, one row padded to two.

    The rows are copied into row-major order first: the result of an earlier weight-major
    product is a transposed view, elementwise operations keep that layout, and MKL
    multiplied such rows 2.5-3.5x slower on one AMD EPYC (copying n x K values costs
    microseconds)."""
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    rows = torch.cat([rows, rows]) if n == 1 else rows.contiguous()
    return (w @ rows.T).T[:n].reshape(*lead, w.shape[0])


def pack(w: torch.Tensor) -> torch.Tensor:
    """oneDNN's blocked copy of ``w`` ``[N, K]`` (serves any row count)."""
    return torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w.T + b`` for rows ``x`` ``[n, K]`` on ``w``'s :func:`pack` copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")


def packed_linear_then(
    x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None, op: str, other: torch.Tensor
) -> torch.Tensor:
    """``(x @ w.T + b) op other`` with ``op`` ``"add"`` or ``"mul"`` applied as the product
    writes its output (oneDNN's post-op), for rows ``x`` ``[n, K]`` and ``other`` ``[n, N]``."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, b, op)


def packed_linear_silu(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``silu(x @ w.T)``, the activation applied as the product writes its output."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "swish", [], "")


_FUSES: dict[str, bool] = {}


def fuses() -> bool:
    """Whether this torch build applies :func:`packed_linear_then`'s and
    :func:`packed_linear_silu`'s operations inside the product (and gets them right)."""
    if "ok" not in _FUSES:
        ok = packable()
        if ok:
            try:
                with torch.inference_mode():
                    gen = torch.Generator().manual_seed(0)
                    x, w = torch.randn(3, 16, generator=gen), torch.randn(8, 16, generator=gen)
                    other, p = torch.randn(3, 8, generator=gen), pack(w)
                    y = x @ w.T
                    ok = (
                        torch.allclose(packed_linear_then(x, p, None, "add", other), y + other)
                        and torch.allclose(packed_linear_then(x, p, None, "mul", other), y * other)
                        and torch.allclose(packed_linear_silu(x, p), F.silu(y), atol=1e-6)
                    )
            except (RuntimeError, AttributeError):
                ok = False
        _FUSES["ok"] = ok
    return _FUSES["ok"]


def packable() -> bool:
    """Whether this torch build has oneDNN's prepacked linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        pack(torch.zeros(8, 8))
    except (RuntimeError, AttributeError):
        return False
    return True


@torch.inference_mode()
def packed_is_faster(
    weights: list[torch.Tensor], linear: Any, rows: tuple[int, ...] = (8, 12), packed: Any = None
) -> bool:
    """Whether oneDNN's prepacked product beats ``linear`` by 10% for ``rows`` rows over
    ``weights`` (the faster of two passes each; ``packed``: their packed copies by data
    pointer, where they exist already)."""
    packed = packed or {w.data_ptr(): pack(w) for w in weights}

    def product(use: bool, x: torch.Tensor, w: torch.Tensor) -> Any:
        return packed_linear(x, packed[w.data_ptr()], None) if use else linear(x, w)

    packed_s, plain_s = _timed(weights, rows, product, 2)
    return packed_s < 0.9 * plain_s


@torch.inference_mode()
def weight_major_is_faster(weights: list[torch.Tensor], repeats: int = 2) -> bool:
    """Whether ``(w @ x.T).T`` beats ``F.linear(x, w)`` for one row (padded to two) and
    four rows of ``x``, over ``weights`` (more bytes than the caches hold, so the weights
    stream from memory as in a step). The faster of ``repeats`` passes of each decides."""

    def product(major: bool, x: torch.Tensor, w: torch.Tensor) -> Any:
        return weight_major(x, w) if major else F.linear(x, w)

    major_s, linear_s = _timed(weights, (1, 4), product, repeats)
    return major_s < linear_s


def _timed(
    weights: list[torch.Tensor], rows: tuple[int, ...], product: Any, repeats: int
) -> tuple[float, float]:
    """Seconds of ``product(True, x, w)`` and of ``product(False, x, w)`` over every weight,
    summed over the row counts, each the fastest of ``repeats`` passes."""
    total = {True: 0.0, False: 0.0}
    for n in rows:
        xs = {k: torch.randn(n, k, dtype=weights[0].dtype) for k in {w.shape[1] for w in weights}}
        for which in (True, False):
            best = float("inf")
            for _ in range(repeats):
                t = time.perf_counter()
                for w in weights:
                    product(which, xs[w.shape[1]], w)
                best = min(best, time.perf_counter() - t)
            total[which] += best
    return total[True], total[False]
