"""specd's CPU attention kernel (specd/forward/csrc/attention.cpp): what it computes, for
every build of it this CPU runs, when the lean forward uses it, and that it steps aside where
it cannot run (tests/test_kernel_builds.py: which build runs where)."""

from __future__ import annotations

import logging
import platform

import pytest
import torch
import torch.nn.functional as F

from specd.engine import Engine
from specd.forward import cpu_kernels, kernel_build
from specd.forward.tiny import tiny_target
from specd.sampling import SamplingParams

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"CPU kernels unavailable: {cpu_kernels.reason}"
)


def use_build(name: str) -> None:
    """Run the kernels built for ``name`` (the rest of the test), or skip the test naming
    why this host cannot."""
    if name not in cpu_kernels.runnable_isas():
        pytest.skip(
            f"this CPU ({kernel_build.host()}) cannot run the {name} kernels "
            f"(scripts/check_kernels.sh {name} runs their self-test elsewhere)"
        )
    if not cpu_kernels.available():
        pytest.skip(f"CPU kernels unavailable: {cpu_kernels.reason}")
    cpu_kernels.use(name)


@pytest.fixture(params=cpu_kernels.ISAS)
def build(request):
    """Each build of the kernels in turn (those this CPU cannot run skipped by name); the
    default choice again after."""
    use_build(request.param)
    yield request.param
    cpu_kernels._reset()


def _reference(q, keys, values, scale, tree=None):
    """float64 attention: every new query sees the cache, then the chain or the tree."""
    t, span = q.shape[2], keys.shape[2]
    past = span - t
    seen = torch.ones(t, span, dtype=torch.bool)
    seen[:, past:] = torch.ones(t, t).tril().bool() if tree is None else tree
    return F.scaled_dot_product_attention(
        q.double(), keys.double(), values.double(), attn_mask=seen, scale=scale, enable_gqa=True
    )


def _inputs(t, past, heads, kv, *, capacity_extra=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # queries as the lean forward makes them: a [1, T, H, D] product viewed as [1, H, T, D]
    q = torch.randn(1, t, heads, 64, generator=gen).transpose(1, 2) * 2
    # keys and values as a cache holds them: the first past + T positions of longer buffers
    cap = past + t + capacity_extra
    kb = torch.randn(1, kv, cap, 64, generator=gen)
    vb = torch.randn(1, kv, cap, 64, generator=gen)
    return q, kb[:, :, : past + t], vb[:, :, : past + t]


@needs_kernel
@pytest.mark.parametrize(
    "t,past,heads,kv",
    [(16, 0, 9, 3), (64, 0, 9, 3), (65, 0, 4, 4), (130, 0, 4, 2), (1023, 0, 9, 3),
     (37, 5, 9, 3), (256, 700, 9, 3), (1, 40, 2, 1), (3, 0, 2, 2)],
)  # fmt: skip
def test_causal_attention_matches_float64(build, t, past, heads, kv):
    q, keys, values = _inputs(t, past, heads, kv)
    out = cpu_kernels.attention(q, keys, values, 0.125)
    ref = _reference(q, keys, values, 0.125)
    assert out.shape == (1, heads, t, 64)
    err = (out.double() - ref).abs().max().item()
    assert err < 2e-5
    # float32 rounding of the same sums: within a few times PyTorch's own error
    sdpa = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=torch.ones(t, past + t).tril(past).bool(), scale=0.125,
        enable_gqa=True,
    )  # fmt: skip
    assert err <= 8 * max((sdpa.double() - ref).abs().max().item(), 1e-6)


@needs_kernel
@pytest.mark.parametrize("past", [0, 50, 300])
def test_tree_mask_attention_matches_float64(build, past):
    t = 20
    gen = torch.Generator().manual_seed(past)
    parent = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, t)]
    tree = torch.eye(t, dtype=torch.bool)
    for i in range(1, t):  # a node sees its ancestors
        tree[i] |= tree[parent[i]]
    q, keys, values = _inputs(t, past, 6, 2, seed=past)
    out = cpu_kernels.attention(q, keys, values, 0.2, tree)
    assert (out.double() - _reference(q, keys, values, 0.2, tree)).abs().max() < 2e-5


@needs_kernel
def test_extreme_scores_stay_finite(build):
    # one key far above the rest (an attention sink) and rows whose other scores underflow
    q, keys, values = _inputs(40, 10, 2, 1)
    keys = keys.clone()
    keys[:, :, 0] = q[0, 0, 0] * 40
    out = cpu_kernels.attention(q, keys, values, 1.0)
    assert torch.isfinite(out).all()
    assert (out.double() - _reference(q, keys, values, 1.0)).abs().max() < 1e-4


@needs_kernel
def test_output_is_laid_out_for_the_output_projection():
    q, keys, values = _inputs(32, 0, 4, 2)
    out = cpu_kernels.attention(q, keys, values, 0.125)
    assert out.transpose(1, 2).is_contiguous()  # [1, T, H, D]: reshaped without a copy


@needs_kernel
def test_bad_inputs_are_refused_with_what_was_wrong():
    q, keys, values = _inputs(20, 0, 4, 2)
    with pytest.raises(ValueError, match="queries"):
        cpu_kernels.attention(q[..., :32], keys[..., :32], values[..., :32], 0.1)
    with pytest.raises(ValueError, match="float32"):
        cpu_kernels.attention(q.double(), keys, values, 0.1)
    with pytest.raises(ValueError, match="tree mask"):
        cpu_kernels.attention(q, keys, values, 0.1, torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="queries"):
        cpu_kernels.attention(q, keys[:, :, :10], values[:, :, :10], 0.1)  # fewer keys than T
    with pytest.raises(ValueError, match="queries"):  # one sequence at a time
        cpu_kernels.attention(q.expand(2, -1, -1, -1), keys, values, 0.1)
    with pytest.raises(ValueError, match="values"):
        cpu_kernels.attention(q, keys, values[:, :, :-1], 0.1)


def test_small_passes_and_other_shapes_stay_with_pytorch():
    cpu = torch.device("cpu")
    assert not cpu_kernels.supports(cpu_kernels.MIN_TOKENS - 1, torch.float32, cpu, 64)
    assert not cpu_kernels.supports(512, torch.bfloat16, cpu, 64)
    assert not cpu_kernels.supports(512, torch.float32, cpu, 128)
    assert not cpu_kernels.supports(512, torch.float32, torch.device("meta"), 64)


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """The kernel forgotten and rebuilt into an empty cache directory, chosen as by default
    (whatever SPECD_KERNEL_ISA or SPECD_CPU_KERNELS the run was started with); restored after."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_KERNEL_ISA", raising=False)
    monkeypatch.delenv("SPECD_CPU_KERNELS", raising=False)
    cpu_kernels._reset()
    yield tmp_path
    monkeypatch.undo()
    cpu_kernels._reset()


def test_turned_off_by_the_environment(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setenv("SPECD_CPU_KERNELS", "off")
    with caplog.at_level(logging.INFO, logger="specd.forward.cpu_kernels"):
        assert not cpu_kernels.available()
    assert "SPECD_CPU_KERNELS" in cpu_kernels.reason
    assert "SPECD_CPU_KERNELS" in caplog.text
    assert not list(fresh_kernel.rglob("*.so"))


def _host(monkeypatch, machine: str, capability: str) -> None:
    """Make this host look like another CPU to the kernels' host checks: a test of what
    follows them must not depend on the CPU it runs on."""
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)


def _lean_forward_runs() -> None:
    """The lean forward of a model the kernel would take runs, through PyTorch."""
    target = tiny_target(hidden_size=256, dtype=torch.float32)
    engine = Engine(target, drafter="none")
    out = engine.generate(list(range(5, 45)), SamplingParams(max_tokens=4))
    assert len(out.token_ids) == 4


def test_a_missing_compiler_leaves_attention_to_pytorch(fresh_kernel, monkeypatch):
    """Guards against a missing compiler failing the first prefill, or being reported as
    something else; on any host, since the CPU checks come before the compiler's."""
    _host(monkeypatch, "x86_64", "AVX512")
    monkeypatch.setenv("CXX", str(fresh_kernel / "no-such-compiler"))
    assert not cpu_kernels.available()
    assert "no-such-compiler" in cpu_kernels.reason
    _lean_forward_runs()


def _counted(monkeypatch) -> list[int]:
    """Count the kernel's calls (one per layer of each pass it serves)."""
    calls: list[int] = []
    real = cpu_kernels.attention

    def attention(q, *args, **kwargs):
        calls.append(q.shape[2])
        return real(q, *args, **kwargs)

    monkeypatch.setattr(cpu_kernels, "attention", attention)
    return calls


def _lean(seed: int, layers: int = 2):
    """A tiny float32 target with 64-wide heads, and its lean forward."""
    target = tiny_target(hidden_size=256, num_layers=layers, dtype=torch.float32, seed=seed)
    assert target.fast is not None and target.fast.head_dim == cpu_kernels.HEAD_DIM
    return target, target.fast


@needs_kernel
def test_lean_forward_prefill_with_the_kernel_matches_pytorch(monkeypatch):
    target, fast = _lean(seed=3, layers=3)
    ids = torch.randint(0, 96, (1, 200), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(200)[None]

    def run(use_kernel: bool, chunk: int):
        monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 16 if use_kernel else 10**9)
        cache = target.new_cache(capacity=256)
        logits = []
        for s in range(0, 200, chunk):  # chunks on top of the cache take the kernel too
            out, _ = fast.forward(cache, ids[:, s : s + chunk], pos[:, s : s + chunk], None)
            logits.append(out)
        return torch.cat(logits)

    calls = _counted(monkeypatch)
    ref = run(False, 200)
    assert not calls
    for chunk in (200, 64):
        assert torch.allclose(run(True, chunk), ref, atol=1e-4, rtol=1e-4)
    # three layers: one 200-token pass, then three 64-token chunks (the last 8 tokens are
    # too few for the kernel)
    assert calls == [200] * 3 + [64] * 9


@needs_kernel
def test_tree_verify_pass_with_the_kernel_matches_pytorch(monkeypatch):
    target, fast = _lean(seed=4)
    t, past = 20, 60
    tree = torch.eye(t, dtype=torch.bool)
    for i in range(1, t):
        tree[i] |= tree[(i - 1) // 2]  # a binary tree in breadth-first order
    mask = torch.zeros(1, 1, t, past + t)
    mask[0, 0, :, past:].masked_fill_(~tree, torch.finfo(torch.float32).min)
    ids = torch.randint(0, 96, (1, past + t), generator=torch.Generator().manual_seed(2))

    def run(use_kernel: bool):
        monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 16 if use_kernel else 10**9)
        cache = target.new_cache(capacity=128)
        fast.forward(cache, ids[:, :past], torch.arange(past)[None], None)
        depth = tree.sum(1) - 1
        out, _ = fast.forward(cache, ids[:, past:], (past + depth)[None], mask)
        return out

    calls = _counted(monkeypatch)
    assert torch.allclose(run(True), run(False), atol=1e-4, rtol=1e-4)
    assert calls == [60, 60, 20, 20]  # two layers: the prefill, then the tree


@needs_kernel
def test_greedy_output_with_the_kernel_is_plain_decoding(monkeypatch):
    target = tiny_target(hidden_size=256, dtype=torch.float32, seed=5, logit_scale=4.0)
    prompt = [
        int(x) for x in torch.randint(1, 96, (120,), generator=torch.Generator().manual_seed(3))
    ]
    outs = {}
    calls = _counted(monkeypatch)
    for use_kernel in (True, False):
        monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 16 if use_kernel else 10**9)
        for drafter in ("none", "ngram"):
            engine = Engine(target, drafter=drafter, prefix_cache_entries=1)
            out = engine.generate(prompt, SamplingParams(max_tokens=24))
            outs[use_kernel, drafter] = out.token_ids
    assert len(set(map(tuple, outs.values()))) == 1
    assert calls  # the prompt's prefill ran the kernel


@needs_kernel
def test_a_mask_that_hides_cached_positions_stays_with_pytorch(monkeypatch):
    target, fast = _lean(seed=6)
    t, past = 20, 30
    mask = torch.zeros(1, 1, t, past + t)
    mask[0, 0, :, past:] = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)
    mask[0, 0, 5, 3] = torch.finfo(torch.float32).min  # one query may not see cached token 3
    ids = torch.randint(0, 96, (1, past + t), generator=torch.Generator().manual_seed(7))
    cache = target.new_cache(capacity=64)
    fast.forward(cache, ids[:, :past], torch.arange(past)[None], None)
    calls = _counted(monkeypatch)
    out, _ = fast.forward(cache, ids[:, past:], torch.arange(past, past + t)[None], mask)
    assert not calls
    cache.crop(past)
    free, _ = fast.forward(cache, ids[:, past:], torch.arange(past, past + t)[None], None)
    assert calls  # without the hidden position the same pass takes the kernel
    assert not torch.allclose(out[5], free[5], atol=1e-3)  # the mask was obeyed
    assert torch.allclose(out[:5], free[:5], atol=1e-4)  # rows that never see token 5


@needs_kernel
def test_queries_of_weight_major_products_are_taken(monkeypatch):
    """Where a few-row product is computed weight-major (specd.forward.products), a pass of up to 16
    tokens gets transposed queries; the kernel takes them (a 16-token prompt once failed)."""
    target, fast = _lean(seed=8)
    monkeypatch.setattr(fast, "_weight_major", True)
    ids = torch.randint(0, 96, (1, 16), generator=torch.Generator().manual_seed(4))
    calls = _counted(monkeypatch)
    cache = target.new_cache(capacity=32)
    got, _ = fast.forward(cache, ids, torch.arange(16)[None], None)
    assert calls == [16, 16]
    monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 10**9)
    want, _ = fast.forward(target.new_cache(capacity=32), ids, torch.arange(16)[None], None)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
