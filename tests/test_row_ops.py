"""The CPU kernels' row-wise operations (specd/forward/row_ops.py): what they compute, for
every build this CPU runs, and which passes of the lean forward use them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_cpu_kernels import build, needs_kernel  # noqa: F401  (the fixture)

from specd.forward import cpu_kernels, row_ops
from specd.forward.tiny import tiny_target


def _ops():
    ops = cpu_kernels.row_ops(64, torch.float32, torch.device("cpu"))
    assert ops is not None
    return ops


def _rotate(x, cos, sin):  # float64, as the lean forward's PyTorch operations compute it
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@needs_kernel
@pytest.mark.parametrize("t,h", [(16, 576), (37, 64), (200, 256)])
def test_rmsnorm_matches_float64(build, t, h):  # noqa: F811
    gen = torch.Generator().manual_seed(t)
    x, w = torch.randn(1, t, h, generator=gen) * 3, torch.randn(h, generator=gen)
    out = _ops().rmsnorm(x, w, 1e-5)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert out.shape == x.shape and out.dtype == torch.float32
    assert (out.double() - ref).abs().max() < 1e-5 * ref.abs().max()


@needs_kernel
@pytest.mark.parametrize("t,heads,d", [(16, 9, 64), (50, 3, 64), (33, 2, 32)])
def test_rotary_matches_float64(build, t, heads, d):  # noqa: F811
    gen = torch.Generator().manual_seed(d + t)
    x = torch.randn(1, t, heads * d, generator=gen)
    angle = torch.rand(t, d // 2, generator=gen) * 6.28
    cos = torch.cat((angle.cos(), angle.cos()), -1)[None, None]  # [1, 1, T, D], as the model's
    sin = torch.cat((angle.sin(), angle.sin()), -1)[None, None]
    out = _ops().rotary(x, cos, sin, heads)
    ref = _rotate(x.double().view(t, heads, d).transpose(0, 1), cos[0].double(), sin[0].double())
    assert out.shape == x.shape
    assert (out.double().view(t, heads, d).transpose(0, 1) - ref).abs().max() < 1e-5


@needs_kernel
@pytest.mark.parametrize("n", [16 * 1536, 4096 * 3 + 7, 5])
def test_silu_mul_matches_float64(build, n):  # noqa: F811
    gen = torch.Generator().manual_seed(n)
    g, u = torch.randn(n, generator=gen) * 4, torch.randn(n, generator=gen)
    out = _ops().silu_mul(g, u)
    ref = F.silu(g.double()) * u.double()
    assert (out.double() - ref).abs().max() < 1e-5 * ref.abs().max()


@needs_kernel
def test_shapes_they_do_not_take_are_left_to_pytorch():
    ops = _ops()
    assert ops.rmsnorm(torch.randn(1, 20, 24), torch.randn(24), 1e-5) is None  # 24: no 16s
    cos = torch.ones(1, 1, 20, 64)
    assert ops.rotary(torch.randn(1, 20, 100), cos, cos, 2) is None  # not heads * D
    assert ops.silu_mul(torch.randn(8), torch.randn(9)) is None


@needs_kernel
def test_only_passes_of_many_float32_tokens_on_the_cpu_use_them():
    cpu = torch.device("cpu")
    assert cpu_kernels.row_ops(cpu_kernels.MIN_TOKENS, torch.float32, cpu) is not None
    # a step or a verify pass stays with PyTorch (the step kernel computes those)
    assert cpu_kernels.row_ops(cpu_kernels.MIN_TOKENS - 1, torch.float32, cpu) is None
    assert cpu_kernels.row_ops(64, torch.bfloat16, cpu) is None
    assert cpu_kernels.row_ops(64, torch.float32, torch.device("meta")) is None


def test_kernels_off_leave_them_to_pytorch(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    assert cpu_kernels.row_ops(64, torch.float32, torch.device("cpu")) is None


@needs_kernel
def test_a_prefill_through_them_matches_pytorchs(monkeypatch):
    target = tiny_target(hidden_size=256, num_layers=3, dtype=torch.float32, seed=7)
    fast = target.fast
    assert fast is not None
    ids = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(120)[None]
    real = cpu_kernels.row_ops
    used: list[int] = []

    def counted(tokens, dtype, device):
        ops = real(tokens, dtype, device)
        if ops is not None:
            used.append(tokens)
        return ops

    def run(rows: bool):
        monkeypatch.setattr(cpu_kernels, "row_ops", counted if rows else lambda *a: None)
        out, _ = fast.forward(target.new_cache(capacity=128), ids, pos, None)
        return out

    ref = run(False)
    out = run(True)
    # per layer two norms, the queries' and keys' rotation, the activation; the final norm
    assert used == [120] * (4 * 3 + 1)
    assert torch.allclose(out, ref, atol=1e-4, rtol=1e-4)
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95


def test_a_build_of_earlier_sources_runs_without_them():
    # a loaded library whose sources had no row functions: ctypes raises AttributeError
    assert row_ops.bind(object()) is None
