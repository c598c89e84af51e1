"""specd's step kernel (specd/forward/csrc/decode_step.cpp, the ``kernel`` compile backend): every
pass it serves computes what the eager lean forward computes, greedy output stays
token-identical to plain decoding, and it steps aside, saying why, where it cannot run."""

from __future__ import annotations

import logging

import pytest
import torch
from test_compiled import VOCAB, replay_session
from test_cpu_kernels import use_build

from specd import Engine, SamplingParams
from specd.forward import cpu_kernels
from specd.forward.compiled import default_backend
from specd.forward.decode_step import for_decoder as kernel_step
from specd.forward.decode_step import usable as kernel_usable
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"CPU kernels unavailable: {cpu_kernels.reason}"
)


@pytest.fixture(params=cpu_kernels.ISAS)
def build(request):
    """Each build of the kernels in turn (those this CPU cannot run skipped by name); the
    default choice again after."""
    use_build(request.param)
    yield request.param
    cpu_kernels._reset()


def _model(hidden: int = 64, layers: int = 2, seed: int = 5):
    """A tiny float32 Llama the kernel takes (16-wide heads)."""
    return tiny_model(VOCAB, hidden_size=hidden, num_layers=layers, seed=seed, logit_scale=8.0,
                      dtype=torch.float32)  # fmt: skip


def _qwen2(seed: int = 6):
    """A tiny float32 Qwen2: biases on the query, key and value products."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True, use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)  # biases that matter
    return model


def _pair(model, kv: torch.dtype = torch.float32) -> tuple[Target, Target]:
    eager = Target(model, CharTokenizer(VOCAB))
    kernel = Target(model, CharTokenizer(VOCAB))
    step = kernel.compile("on", backend="kernel")
    assert step is not None and step.ready, step and step.reason
    eager.kv_dtype = kernel.kv_dtype = kv  # what both caches store
    return eager, kernel


def _wide():
    """64-wide heads: the kernel's blocked scores (four query heads by four keys)."""
    return _model(hidden=256, seed=10)


def _wide3(seed: int = 12):
    """64-wide heads, three query heads a group (the small model's shape): blocks of four,
    then of one, two or three query rows."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


@needs_kernel
@pytest.mark.parametrize(
    "make,seed", [(_model, 7), (_model, 8), (_qwen2, 9), (_wide, 11), (_wide3, 13)]
)
def test_every_pass_equals_the_eager_pass(build, make, seed):
    """Chains and trees of 1 to 16 tokens over a cache that grows, keeping a random path
    after each as the engine does: logits and hidden states to float32 rounding, with each
    build of the kernel this CPU runs."""
    eager, kernel = _pair(make())
    step = kernel.compiled
    assert step.backend == "kernel" and step.max_tokens == 16
    assert replay_session(eager, kernel, seed=seed, steps=14, tol=2e-5) == 14
    assert step.served == 14 and step.ready


@needs_kernel
@pytest.mark.parametrize("make,seed", [(_model, 17), (_qwen2, 19), (_wide3, 23)])
def test_every_pass_over_a_float16_cache_equals_the_eager_pass(make, seed):
    """Both forwards round each new key and value to a half and attend to the rounded ones:
    they agree as closely as two roundings of slightly different float32 keys allow (one
    may land a half's step away where the two straddle a midpoint)."""
    eager, kernel = _pair(make(), torch.float16)
    assert replay_session(eager, kernel, seed=seed, steps=14, tol=2e-3) == 14


@needs_kernel
def test_a_float16_cache_holds_the_nearest_half_of_each_key_and_value(build):
    """The first layer's new keys and values (the same float32 values either way, before any
    attention) stored by the kernel as halves are what torch rounds them to."""
    caches = {}
    for kv in (torch.float32, torch.float16):
        _, kernel = _pair(_wide3(), kv)
        cache = kernel.new_cache(capacity=64)
        kernel.prefill(cache, [3, 1, 4, 1, 5])
        kernel.forward(cache, [9, 2, 6])  # a pass of three through the kernel
        caches[kv] = cache.layer(0)
    k32, v32 = caches[torch.float32].keys, caches[torch.float32].values
    k16, v16 = caches[torch.float16].keys, caches[torch.float16].values
    assert k16.dtype == v16.dtype == torch.float16 and k16.shape == k32.shape
    assert torch.equal(k16[:, :, 5:], k32[:, :, 5:].half())
    assert torch.equal(v16[:, :, 5:], v32[:, :, 5:].half())


@needs_kernel
@pytest.mark.parametrize("kv", [torch.float32, torch.float16])
def test_a_pass_equals_its_one_token_steps_bit_for_bit(build, kv):
    """What makes speculation emit what plain decoding emits: a verify pass's logits are
    those of the one-token steps that would decode its tokens, over either cache (a new
    token attends to its own key and value as the cache will hold them)."""
    _, kernel = _pair(_wide3(), kv)
    prompt, fed = [3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8]
    cache = kernel.new_cache(capacity=64)
    kernel.prefill(cache, prompt)
    passed = kernel.forward(cache, fed).logits
    cache = kernel.new_cache(capacity=64)
    kernel.prefill(cache, prompt)
    stepped = torch.cat([kernel.forward(cache, [t]).logits for t in fed])
    assert kernel.compiled.served >= 6
    assert torch.equal(passed, stepped)


@needs_kernel
@pytest.mark.parametrize("kv", [torch.float32, torch.float16])
def test_greedy_output_is_identical_to_plain_decoding(build, kv):
    eager, kernel = _pair(_model(layers=3), kv)
    params = SamplingParams(max_tokens=48)
    prompt = "abcabcabd abcab abcabc"
    plain = Engine(eager, drafter="none").generate(prompt, params)
    for drafter in ("none", "ngram"):
        before = kernel.compiled.served
        out = Engine(kernel, drafter=drafter).generate(prompt, params)
        assert out.token_ids == plain.token_ids, drafter
        assert kernel.compiled.served > before  # its passes ran the kernel


@needs_kernel
def test_auto_compile_on_cpu_uses_the_kernel_where_it_takes_the_model():
    target = Target(_model(), CharTokenizer(VOCAB))
    assert default_backend(target.fast) == "kernel"
    step = target.compile("auto")
    assert step is not None and step.backend == "kernel" and step.ready
    # 32-wide model: 8-wide heads the kernel does not take; auto stays eager on a CPU
    odd = Target(tiny_model(VOCAB, dtype=torch.float32), CharTokenizer(VOCAB))
    assert not kernel_usable(odd.fast)
    assert default_backend(odd.fast) == "inductor"
    assert odd.compile("auto") is None
    with pytest.raises(ValueError, match="multiples of 16.*head size 8"):
        kernel_step(odd.fast)


@needs_kernel
def test_a_model_it_cannot_take_falls_back_to_eager_with_the_reason(caplog):
    target = Target(tiny_model(VOCAB, dtype=torch.float32), CharTokenizer(VOCAB))
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        step = target.compile("on", backend="kernel")
    assert step is not None and step.state == "failed"
    assert "head size 8" in step.reason and "head size 8" in caplog.text
    cache = target.new_cache()
    target.prefill(cache, [1, 2, 3])
    assert target.forward(cache, [4]).logits.shape == (1, VOCAB)  # eager


@needs_kernel
def test_float64_weights_are_refused_naming_them():
    target = Target(_model().double(), CharTokenizer(VOCAB))
    with pytest.raises(ValueError, match="contiguous float32"):
        kernel_step(target.fast)
    step = target.compile("on", backend="kernel")
    assert step is not None and step.state == "failed" and "float32" in step.reason


@needs_kernel
def test_bad_calls_are_refused_with_what_was_wrong():
    eager, kernel = _pair(_model())
    fast = kernel.fast
    run = kernel_step(fast)
    cache = kernel.new_cache(capacity=32)
    kernel.prefill(cache, [1, 2, 3, 4])
    bufs = cache.buffers(6)
    cos, sin = fast.rotary_tables(fast.embed[None, :1], torch.tensor([[4]]))
    with pytest.raises(ValueError, match="outside 0..39"):
        run(torch.tensor([VOCAB]), cos, sin, bufs, 4)
    with pytest.raises(ValueError, match="17 new tokens"):
        run(torch.zeros(17, dtype=torch.long), cos, sin, bufs, 4)
    with pytest.raises(ValueError, match="1 cache layers"):
        run(torch.tensor([1]), cos, sin, bufs[:1], 4)
    with pytest.raises(ValueError, match="cos must be float32"):
        run(torch.tensor([1]), cos.double(), sin, bufs, 4)
    with pytest.raises(ValueError, match="tree mask"):
        run(torch.tensor([1, 2]), cos.expand(1, 1, 2, -1), sin.expand(1, 1, 2, -1), bufs, 4,
            torch.ones(3, 3, dtype=torch.bool))  # fmt: skip
    for odd in (
        [(k.bfloat16(), v.bfloat16()) for k, v in bufs],  # neither float32 nor float16
        [(k, v.half()) for k, v in bufs],  # keys and values stored alike, or refused
        [(k.half(), v.half()) for k, v in bufs[:1]] + bufs[1:],  # every layer alike
    ):
        with pytest.raises(ValueError, match="cannot take positions 4-4"):
            run(torch.tensor([1]), cos, sin, odd, 4)
    short = [(k[:, :, :4], v[:, :, :4]) for k, v in bufs]
    with pytest.raises(ValueError, match="cannot take positions 4-4"):
        run(torch.tensor([1]), cos, sin, short, 4)
    # the same buffers as a pass that took them are still checked against the positions
    run(torch.tensor([1]), cos, sin, bufs, 4)
    end = bufs[0][0].shape[2]
    with pytest.raises(ValueError, match=f"cannot take positions {end}-{end}"):
        run(torch.tensor([1]), cos, sin, bufs, end)


@needs_kernel
def test_a_cache_in_another_dtype_turns_the_step_off_and_runs_eager(caplog):
    eager, kernel = _pair(_model())
    cache = kernel.new_cache(capacity=16)
    for layer in cache._layers:  # a dtype the kernel does not read
        layer._dtype = torch.bfloat16
    kernel.prefill(cache, [1, 2, 3])
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        out = kernel.forward(cache, [4])
    assert out.logits.shape == (1, VOCAB)
    assert kernel.compiled.state == "failed" and "bfloat16" in kernel.compiled.reason


@needs_kernel
def test_a_mask_hiding_cached_positions_runs_eager():
    eager, kernel = _pair(_model())
    step = kernel.compiled
    cache = kernel.new_cache(capacity=16)
    kernel.prefill(cache, [1, 2, 3, 4])
    ids = torch.tensor([[5, 6]])
    mask = torch.zeros(1, 1, 2, 6)
    mask[0, 0, 1, 2] = torch.finfo(torch.float32).min
    assert step.run(cache, ids, torch.tensor([[4, 5]]), mask) is None
    assert cache.length == 4 and step.ready


def test_the_environment_switch_leaves_the_step_to_inductor(monkeypatch):
    monkeypatch.setenv("SPECD_CPU_KERNELS", "off")
    cpu_kernels._reset()
    try:
        target = Target(_model(), CharTokenizer(VOCAB))
        assert default_backend(target.fast) == "inductor"
        assert target.compile("auto") is None  # a CPU without the kernel: eager, as before
        step = target.compile("on", backend="kernel")
        assert step is not None and step.state == "failed" and "SPECD_CPU_KERNELS" in step.reason
    finally:
        monkeypatch.delenv("SPECD_CPU_KERNELS")
        cpu_kernels._reset()


@needs_kernel
def test_thread_counts_that_split_unevenly_compute_the_same(build):
    """Three and five threads: rows and positions split unevenly, and some threads get no
    position at all in a short cache (their parts are empty and skipped in the merge)."""
    threads = torch.get_num_threads()
    try:
        for n in (3, 5):
            torch.set_num_threads(n)
            eager, kernel = _pair(_wide3(seed=20 + n))
            for fed in ([5], [6, 7], list(range(1, 12))):
                caches = [t.new_cache(capacity=4) for t in (eager, kernel)]
                for target, cache in zip((eager, kernel), caches, strict=True):
                    target.prefill(cache, [3])  # one cached position: fewer than the threads
                want, got = (
                    t.forward(c, fed, hidden=True) for t, c in zip((eager, kernel), caches)
                )
                torch.testing.assert_close(got.logits, want.logits, rtol=2e-5, atol=2e-5)
                torch.testing.assert_close(got.hidden, want.hidden, rtol=2e-5, atol=2e-5)
            assert kernel.compiled.served == 3 and kernel.compiled.ready
    finally:
        torch.set_num_threads(threads)


def _steps_over(fast, fmt: str):
    """The step kernel over ``fast``'s matrices (embedding and LM head too) stored as ``fmt``
    blocks, and over the float32 values those blocks hold."""
    from specd.forward import blocks
    from specd.forward.decode_step import LAYER_WEIGHTS, DecodeStep

    stored: dict[int, blocks.BlockWeight] = {}

    def as_blocks(w):
        if id(w) not in stored:
            stored[id(w)] = (
                blocks.quantize(w, fmt) if fmt in blocks.QUANTIZABLE else k_quant(w.shape, fmt)
            )
        return stored[id(w)]

    def layers(convert):
        return [
            tuple(convert(w) if n.startswith("w") else w for n, w in zip(
                LAYER_WEIGHTS, (getattr(L, n) for n in LAYER_WEIGHTS), strict=True))
            for L in fast.layers
        ]  # fmt: skip

    sizes = dict(heads=fast.n_heads, kv_heads=fast.n_kv, head_dim=fast.head_dim, eps=fast.eps,
                 scale=fast.scaling)  # fmt: skip
    quantized = DecodeStep(layers(as_blocks), as_blocks(fast.embed), fast.norm,
                           as_blocks(fast.lm_head), None, **sizes)  # fmt: skip

    def values(w):
        return as_blocks(w).dequantize()

    floats = DecodeStep(layers(values), values(fast.embed), fast.norm, values(fast.lm_head),
                        None, **sizes)  # fmt: skip
    return quantized, floats


def k_quant(shape, fmt: str, seed: int = 0):
    """Random super-blocks of the K-quant ``fmt`` (nothing here makes them from values) with
    fp16 scales about 2^-11 (|values| below about 0.5), as a matrix of ``shape``."""
    from specd.forward import blocks

    f = blocks.FORMATS[fmt]
    rows, cols = shape
    g = torch.Generator().manual_seed(seed + rows * 7 + cols)
    data = torch.randint(0, 256, (rows, cols // f.values, f.block_bytes), generator=g)
    data = data.to(torch.uint8)
    for off in (208,) if fmt == "q6_k" else (0, 2):
        data[..., off + 1] = 0x10 | (data[..., off + 1] & 0x83)
    return blocks.BlockWeight(data.reshape(rows, -1), f, (rows, cols))


@needs_kernel
@pytest.mark.parametrize(
    "fmt", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "q4_k", "q5_k", "q6_k"]
)
def test_weights_as_blocks_compute_what_their_float32_values_compute_bit_for_bit(
    build, fmt, monkeypatch
):
    """A step over quantized blocks decodes each block exactly and sums in the float32
    step's order: logits, hidden states and the keys and values written are equal bit for
    bit, chains of 1-16 tokens over an empty and a filled cache (K-quants: a model whose
    products all run along whole super-blocks of 256). Q4 blocks with their int8 products
    off (tests/test_interleave.py has them on)."""
    monkeypatch.setenv("SPECD_INT8_PRODUCTS", "off")
    model = _wide3() if fmt[-1] != "k" else tiny_model(VOCAB, hidden_size=256, dtype=torch.float32)
    fast = Target(model, CharTokenizer(VOCAB)).fast
    quantized, floats = _steps_over(fast, fmt)
    gen = torch.Generator().manual_seed(3)
    cap, d = 64, fast.head_dim
    for past, t in ((0, 1), (0, 7), (20, 1), (20, 16), (40, 5)):
        ids = torch.randint(0, VOCAB, (t,), generator=gen)
        pos = torch.arange(past, past + t)[None]
        cos, sin = fast.rotary_at(pos)
        outs = []
        for step in (quantized, floats):
            g = torch.Generator().manual_seed(past)
            buffers = [
                tuple(torch.randn(1, fast.n_kv, cap, d, generator=g) for _ in range(2))
                for _ in fast.layers
            ]
            logits, hidden = step(ids, cos[0, 0], sin[0, 0], buffers, past)
            outs.append((logits, hidden, buffers))
        (lq, hq, bq), (lf, hf, bf) = outs
        assert torch.equal(lq, lf) and torch.equal(hq, hf), (past, t)
        for (kq, vq), (kf, vf) in zip(bq, bf, strict=True):
            assert torch.equal(kq, kf) and torch.equal(vq, vf)
        assert not torch.equal(lq, torch.zeros_like(lq))


@needs_kernel
def test_a_norm_as_blocks_is_refused_naming_it():
    from specd.forward import blocks
    from specd.forward.decode_step import LAYER_WEIGHTS, DecodeStep

    fast = Target(_wide3(), CharTokenizer(VOCAB)).fast
    layers = [tuple(getattr(L, n) for n in LAYER_WEIGHTS) for L in fast.layers]
    bad = list(layers[0])
    bad[LAYER_WEIGHTS.index("ln1")] = blocks.quantize(fast.embed[:1].repeat(2, 1), "q8_0")
    layers[0] = tuple(bad)
    with pytest.raises(ValueError, match="layer 0 ln1"):
        DecodeStep(layers, fast.embed, fast.norm, fast.lm_head, None, heads=fast.n_heads,
                   kv_heads=fast.n_kv, head_dim=fast.head_dim, eps=fast.eps,
                   scale=fast.scaling)  # fmt: skip


@needs_kernel
def test_a_passed_check_is_remembered_per_model_and_build(monkeypatch, tmp_path):
    """A start does not re-run the kernel's check against the eager pass for a model and
    build that passed it on this machine; another model, another build or
    SPECD_PRICE_CACHE=off checks again."""
    from specd.forward import compiled

    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECD_PRICE_CACHE", raising=False)
    calls = []
    real = compiled.check
    monkeypatch.setattr(compiled, "check", lambda *a, **k: calls.append(1) or real(*a, **k))

    def start(seed: int = 5):
        step = Target(_model(seed=seed), CharTokenizer(VOCAB)).compile("on", backend="kernel")
        assert step is not None and step.ready
        return step

    start()
    start()  # the next start
    assert len(calls) == 1
    start(seed=6)  # other weights
    assert len(calls) == 2
    monkeypatch.setattr(cpu_kernels, "library_file", lambda: "kernels-other.so")
    start()
    assert len(calls) == 3
    monkeypatch.setenv("SPECD_PRICE_CACHE", "off")
    start()
    assert len(calls) == 4
