"""The lean forward computes what the model's own forward computes, and a token tree is
attended the way the tree says, on both paths."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specd.forward import architectures, cpu_kernels, fastpath, products, weight_products
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

VOCAB = 50


def qwen2_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    torch.manual_seed(3)
    return Qwen2ForCausalLM(cfg).double().eval()


MODELS = {"llama": tiny_model(VOCAB, num_layers=3, seed=1), "qwen2": qwen2_model()}


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_supported(arch):
    assert architectures.supports(MODELS[arch])


@settings(max_examples=40)
@given(
    arch=st.sampled_from(sorted(MODELS)),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30),
    fed=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
    rnd=st.randoms(use_true_random=False),
    tree=st.booleans(),
)
def test_fast_forward_equals_the_model_forward(arch, prompt, fed, rnd, tree):
    model = MODELS[arch]
    fast = Target(model, CharTokenizer(VOCAB), fast=True)
    slow = Target(model, CharTokenizer(VOCAB), fast=False)
    assert fast.fast is not None and slow.fast is None
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, len(fed))] if tree else None
    outs = []
    for target in (fast, slow):
        cache = target.new_cache(capacity=8)
        target.prefill(cache, prompt)
        logits = target.forward(cache, fed, parents).logits
        cache.crop(len(prompt))
        early = target.forward_early(cache, fed[:1], 1)
        outs.append((logits, early))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-10, atol=1e-10)


def reference_tree_logits(model, prompt, fed, parents) -> torch.Tensor:
    """The model's own forward, without a cache, over prompt + tree, with a 4D additive mask
    and position ids built here from the tree: node i sees the prompt, its ancestors and
    itself, and sits at position len(prompt) + (its depth below the root)."""
    n_prompt, n = len(prompt), len(prompt) + len(fed)
    visible: list[set[int]] = []
    depth: list[int] = []
    for i, p in enumerate(parents):
        visible.append({i} | (visible[p] if p >= 0 else set()))
        depth.append(depth[p] + 1 if p >= 0 else 0)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n_prompt):
        allowed[i, : i + 1] = True
    for i, seen in enumerate(visible):
        allowed[n_prompt + i, :n_prompt] = True
        allowed[n_prompt + i, [n_prompt + j for j in seen]] = True
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(n, n, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    positions = list(range(n_prompt)) + [n_prompt + d for d in depth]
    with torch.inference_mode():
        out = model(
            torch.tensor([prompt + fed]),
            attention_mask=mask[None, None],  # [1, 1, n, n]
            position_ids=torch.tensor([positions]),
        )
    return out.logits[0, n_prompt:]  # [T, V]


@settings(max_examples=25)
@given(
    arch=st.sampled_from(sorted(MODELS)),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20),
    fed=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=8),
    rnd=st.randoms(use_true_random=False),
)
def test_tree_forward_equals_the_models_forward_with_an_explicit_mask(arch, prompt, fed, rnd):
    """Guards against a tree mask or tree positions that both paths share being wrong (a
    node seeing only its parent, a sibling, or chain positions): the reference is built
    here, and for each node checked once more against a plain forward over its own path."""
    model = MODELS[arch]
    parents = [-1] + [rnd.randrange(-1, i) for i in range(1, len(fed))]
    want = reference_tree_logits(model, prompt, fed, parents)
    for i in rnd.sample(range(len(fed)), 2):  # the reference itself: node i's path, no mask
        path = [i]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        with torch.inference_mode():
            alone = model(torch.tensor([prompt + [fed[j] for j in reversed(path)]])).logits[0, -1]
        torch.testing.assert_close(want[i], alone, rtol=1e-9, atol=1e-9)
    for fast in (True, False):
        target = Target(model, CharTokenizer(VOCAB), fast=fast)
        cache = target.new_cache(capacity=8)
        target.prefill(cache, prompt)
        got = target.forward(cache, fed, parents).logits
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"fast={fast}")


def test_unsupported_models_use_their_own_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)
    ).eval()
    target = Target(model, CharTokenizer(VOCAB))
    assert target.fast is None
    cache = target.new_cache()
    target.prefill(cache, [1, 2, 3])
    got = target.forward(cache, [4]).logits[-1]
    with torch.inference_mode():
        want = model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_bfloat16_prefill_fills_a_float32_cache_that_decoding_reads():
    """A bfloat16 prefill computes the prompt's keys in bfloat16 and stores them in the
    float32 cache that the float32 decode reads. Guards against the option being ignored
    (keys equal to a float32 prefill's) and against a cache left in bfloat16 (the decode
    would then run on rounded keys of its own tokens too)."""
    model = tiny_model(VOCAB, num_layers=2, seed=4, dtype=torch.float32)
    plain = Target(model, CharTokenizer(VOCAB))
    mixed = Target(model, CharTokenizer(VOCAB))
    mixed.set_prefill_dtype(torch.bfloat16)
    assert mixed.prefill_fast is not None and mixed.prefill_fast.embed.dtype == torch.bfloat16
    prompt = list(range(1, 40))
    caches = []
    for target in (plain, mixed):
        cache = target.new_cache(capacity=8)
        target.prefill(cache, prompt)
        caches.append(cache)
    k_plain, k_mixed = (c.layer(1).keys for c in caches)
    assert k_mixed.dtype == torch.float32
    assert not torch.equal(k_plain, k_mixed)
    torch.testing.assert_close(k_mixed, k_plain, rtol=0.05, atol=0.05)
    logits = [t.forward(c, [7, 8]).logits for t, c in zip((plain, mixed), caches)]
    assert logits[1].dtype == torch.float32
    torch.testing.assert_close(logits[1], logits[0], rtol=0.05, atol=0.05)
    # the decode's own keys are float32 arithmetic: equal where the prompt played no part
    torch.testing.assert_close(
        caches[1].layer(0).keys[:, :, -2:], caches[0].layer(0).keys[:, :, -2:], rtol=0, atol=0
    )


def test_prefill_dtype_needs_the_lean_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    from specd.errors import BadInputError

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=4)).eval()
    with pytest.raises(BadInputError, match="prefill"):
        Target(model, CharTokenizer(VOCAB)).set_prefill_dtype(torch.bfloat16)


class _Counted:
    """oneDNN's prepacked product, counting its calls (plain and with a fused operation)."""

    def __init__(self, calls: list[str]) -> None:
        self.real, self.calls = torch.ops.mkldnn._linear_pointwise, calls

    def __call__(self, *args):
        self.calls.append(args[3])  # the fused activation, or "none"
        return self.real(*args)

    def binary(self, *args):
        self.calls.append(args[4])  # "add" or "mul"
        return self.real.binary(*args)


@pytest.mark.skipif(not products.fuses(), reason="needs oneDNN's fused products")
@pytest.mark.parametrize("fed_len", [1, 9, 40])
def test_fused_products_compute_what_separate_operations_do(monkeypatch, fed_len):
    """On prepacked weights a prefill pass (more than 16 tokens) runs the residual adds, the
    activation and the gate's product inside the products; the logits are the separate
    operations' to float32 rounding. Steps and verify passes keep the separate ones."""
    model = tiny_model(VOCAB, num_layers=2, seed=5).float()
    target = Target(model, CharTokenizer(VOCAB), fast=True)
    assert target.pack_weights("on")
    calls: list[str] = []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", _Counted(calls))
    prompt, fed = list(range(1, 30)), [(5 * i) % VOCAB for i in range(fed_len)]
    outs = {}
    for fused in (True, False):
        monkeypatch.setitem(products._FUSES, "ok", fused)
        cache = target.new_cache(capacity=8)
        target.prefill(cache, prompt)
        calls.clear()
        outs[fused] = target.forward(cache, fed).logits
        # per layer: q, k, v, then o + residual, silu(gate), up * gate, down + residual
        fused_ops = {"add", "mul", "swish"} & set(calls)
        assert fused_ops == ({"add", "mul", "swish"} if fused and fed_len > 16 else set())
    torch.testing.assert_close(outs[True], outs[False], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("fed_len", [1, 2, 3, 8, 16, 17])
def test_prepacked_weights_compute_what_the_loaded_ones_do(monkeypatch, fed_len):
    """Passes of one token (a step), of 3-16 (a verify pass) and of more (a prefill) run on
    oneDNN's prepacked copy of the weights (``--packed-weights on``, or ``auto`` where that
    measured faster); the logits are the loaded weights' to float32 rounding."""
    model = tiny_model(VOCAB, num_layers=2, seed=4).float()
    targets = {p: Target(model, CharTokenizer(VOCAB), fast=True) for p in (True, False)}
    assert targets[True].pack_weights("on") and not targets[False].pack_weights("off")
    for faster in (True, False):
        monkeypatch.setattr(products, "packed_is_faster", lambda *a, faster=faster, **_: faster)
        assert Target(model, CharTokenizer(VOCAB)).pack_weights("auto") == faster
    calls: list[str] = []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", _Counted(calls))
    prompt, fed = list(range(1, 40)), [(7 * i) % VOCAB for i in range(fed_len)]
    outs = []
    for packed in (True, False):
        cache = targets[packed].new_cache(capacity=8)
        targets[packed].prefill(cache, prompt)
        assert bool(calls) == packed  # a prefill of 39 tokens
        calls.clear()
        outs.append(targets[packed].forward(cache, fed).logits)
        assert bool(calls) == packed
        calls.clear()
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_auto_packs_prefills_only_where_that_measures_faster(monkeypatch):
    """``auto`` times the prepacked product separately for a prefill's row count: on a CPU
    where it helps verify passes but not large passes, a prefill keeps the loaded weights."""
    model = tiny_model(VOCAB, num_layers=2, seed=4).float()
    for prefill_faster in (True, False):
        monkeypatch.setattr(
            products,
            "packed_is_faster",
            lambda w, f, rows=(8, 12), p=prefill_faster, **_: (
                p or rows != (weight_products.PACKED_PREFILL_ROWS,)
            ),
        )
        target = Target(model, CharTokenizer(VOCAB), fast=True)
        assert target.pack_weights("auto")
        assert target.fast._packed_prefill == prefill_faster  # type: ignore[union-attr]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("step_faster", [True, False])
def test_auto_packs_one_token_steps_only_where_that_measures_faster(monkeypatch, step_faster):
    """``auto`` times one- and two-row products (the decoder's and the LM head's) on their
    own: where the prepacked copy is not faster for them, a step keeps the loaded weights
    while a verify pass of 3-16 tokens still uses it."""
    model = tiny_model(VOCAB, num_layers=2, seed=4).float()
    asked = []

    def faster(weights, linear, rows=(8, 12), **_):
        asked.append(rows)
        return step_faster or rows != (1, 2)

    monkeypatch.setattr(products, "packed_is_faster", faster)
    target = Target(model, CharTokenizer(VOCAB), fast=True)
    assert target.pack_weights("auto") and (1, 2) in asked
    calls: list[str] = []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", _Counted(calls))
    cache = target.new_cache(capacity=64)
    target.prefill(cache, list(range(1, 40)))
    for fed, expected in (([5], step_faster), ([5, 6, 7, 8], True)):
        calls.clear()
        target.forward(cache, fed)
        # every decoder weight and the LM head, when used
        assert len(calls) == (2 * 7 + 1 if expected else 0)


def test_decoders_of_one_model_use_the_same_products(monkeypatch):
    """Guards against each decoder timing the products on its own: on a noisy machine two
    targets over the same weights could pick different ones and round differently."""
    answers = iter([True, False, True, False])
    monkeypatch.setattr(weight_products, "_WEIGHT_MAJOR", {})
    monkeypatch.setattr(products, "weight_major_is_faster", lambda w: next(answers))
    model = tiny_model(VOCAB, num_layers=2, seed=5, dtype=torch.float32)
    picks = {Target(model, CharTokenizer(VOCAB)).fast._weight_major for _ in range(3)}
    assert picks == {True}


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_the_weight_major_product_takes_rows_in_any_layout(rows):
    """The rows a weight-major product gets are often a transposed view (the output of the
    product before it); it must compute x @ w.T from them all the same."""
    torch.manual_seed(0)
    w = torch.randn(24, 10)
    x = torch.randn(10, rows).T  # column-major rows
    torch.testing.assert_close(products.weight_major(x, w), x @ w.T)
    torch.testing.assert_close(products.weight_major(x[None], w), (x @ w.T)[None])


@pytest.mark.parametrize("major", [True, False])
@pytest.mark.parametrize("kernels", [True, False])
def test_target_linear_is_the_kernels_product_or_the_lean_forwards(monkeypatch, major, kernels):
    """A drafter's product (``Target.linear``): the step kernel's where the kernels run;
    elsewhere the product the lean forward measured fastest for a few rows."""
    from specd.forward import cpu_kernels

    if kernels and not cpu_kernels.available():
        pytest.skip(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    monkeypatch.setattr(weight_products, "_WEIGHT_MAJOR", {})
    monkeypatch.setattr(products, "weight_major_is_faster", lambda w: major)
    if not kernels:
        monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    calls = []
    monkeypatch.setattr(products, "weight_major", lambda x, w: calls.append(1) or x @ w.T)
    model = tiny_model(VOCAB, num_layers=2, seed=5, dtype=torch.float32)
    target = Target(model, CharTokenizer(VOCAB))
    x, w = torch.randn(3, 16), torch.randn(8, 16)
    torch.testing.assert_close(target.linear(x, w), x @ w.T)
    assert bool(calls) == (major and not kernels)


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_a_prefill_fills_every_layer_as_a_full_forward_does(arch):
    """The prefill stops the last layer after its keys and values (nobody reads its output).
    Guards against that layer's cache entries going missing or differing from a full
    forward's, and against the prefill computing logits it throws away."""
    target = Target(MODELS[arch], CharTokenizer(VOCAB), fast=True)
    prompt = [(7 * i) % VOCAB for i in range(37)]
    full, lean = target.new_cache(capacity=8), target.new_cache(capacity=8)
    target.forward(full, prompt)
    assert target.prefill(lean, prompt) == ""
    assert lean.length == full.length == len(prompt)
    n_layers = len(target.fast.layers)  # type: ignore[union-attr]
    for i in range(n_layers):
        torch.testing.assert_close(lean.layer(i).keys, full.layer(i).keys, rtol=0, atol=1e-12)
        torch.testing.assert_close(lean.layer(i).values, full.layer(i).values, rtol=0, atol=1e-12)
    ids = torch.tensor([prompt[:3]])
    pos = torch.arange(3)[None]
    cache = target.new_cache(capacity=8)
    logits, hidden = target.fast.forward(cache, ids, pos, None, keep=1, logits=False)  # type: ignore[union-attr]
    assert logits.shape == (0, target.vocab_size) and hidden is None and cache.length == 3


def test_prefill_passes_start_with_one_long_pass_into_an_empty_cache():
    from specd.forward.passes import FIRST_CHUNK, PREFILL_CHUNK, prefill_pieces

    assert prefill_pieces(0, 10) == [(0, 10)]
    assert prefill_pieces(0, FIRST_CHUNK + 300) == [
        (0, FIRST_CHUNK),
        (FIRST_CHUNK, FIRST_CHUNK + PREFILL_CHUNK),
        (FIRST_CHUNK + PREFILL_CHUNK, FIRST_CHUNK + 300),
    ]
    assert prefill_pieces(5, PREFILL_CHUNK + 1) == [
        (0, PREFILL_CHUNK),
        (PREFILL_CHUNK, PREFILL_CHUNK + 1),
    ]
    assert prefill_pieces(0, 0) == []


def test_a_long_prefill_on_blocks_multiplies_by_prepacked_values(monkeypatch):
    """Guards against a prefill on blocks that packs the wrong values (a stale scratch
    buffer, another weight's) or skips the packed products: every product of a prompt
    longer than the step kernel's prefill multiplies by a prepacked copy of the blocks'
    values, and fills the cache as ``F.linear`` on those values does, to float32 rounding."""
    from specd.forward.tiny import tiny_blocks_target

    if not products.packable():
        pytest.skip("this torch build has no oneDNN prepacked linear")
    target = tiny_blocks_target(VOCAB, "q8", seed=3)
    target.kv_dtype = torch.float32  # the products compared, not a rounding to halves after them
    target.fast._block_prefill = "prepacked"  # type: ignore[union-attr]  # as if it won
    prompt = [(5 * i + 1) % VOCAB for i in range(300)]  # past STEP_PREFILL_TOKENS
    packed = []
    real = products.pack
    monkeypatch.setattr(products, "pack", lambda w: packed.append(tuple(w.shape)) or real(w))
    fast = target.new_cache()
    target.prefill(fast, prompt)
    layers = len(target.fast.layers)  # type: ignore[union-attr]
    assert len(packed) >= 7 * (layers - 1)  # q, k, v, o, gate, up, down of each full layer
    target.fast._block_prefill = "linear"  # type: ignore[union-attr]
    plain = target.new_cache()
    target.prefill(plain, prompt)
    for i in range(layers):
        torch.testing.assert_close(fast.layer(i).keys, plain.layer(i).keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            fast.layer(i).values, plain.layer(i).values, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_a_long_prefill_on_woven_blocks_runs_the_int8_products(monkeypatch, weights):
    """Guards against an int8 prefill that multiplies the wrong bytes (the blocks as stored
    read as woven, another weight's copy, the wrong format's code) or skips the int8
    products: every product of a prompt longer than the step kernel's prefill goes through
    the kernel's product on the weight's woven copy, and its cache stays within the int8
    rounding of the float32 products' cache."""
    from specd.forward import interleave
    from specd.forward.tiny import tiny_blocks_target

    if not cpu_kernels.available():
        pytest.skip(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    target = tiny_blocks_target(VOCAB, weights, seed=3)
    target.kv_dtype = torch.float32  # the products compared, not a rounding to halves after them
    fast_decoder = target.fast
    assert fast_decoder is not None and "int8" in fast_decoder._prefill_products()
    fast_decoder._block_prefill = "int8"  # as if it won
    woven = {
        w.woven.data_ptr(): interleave.code(w)
        for L in fast_decoder.layers
        for w in (L.wq, L.wk, L.wv, L.wo, L.wg, L.wu, L.wd)
    }
    calls = []
    real = cpu_kernels.product

    def product(x, ptr, code, *args, **kwargs):
        calls.append((x.shape[0], woven.get(ptr) == code))
        return real(x, ptr, code, *args, **kwargs)

    monkeypatch.setattr(cpu_kernels, "product", product)
    prompt = [(5 * i + 1) % VOCAB for i in range(300)]  # past STEP_PREFILL_TOKENS
    int8 = target.new_cache()
    target.prefill(int8, prompt)
    layers = len(fast_decoder.layers)
    long = [ok for rows, ok in calls if rows > 16]
    assert len(long) >= 7 * (layers - 1) and all(long)  # q, k, v, o, gate, up, down
    fast_decoder._block_prefill = "linear"
    plain = target.new_cache()
    target.prefill(plain, prompt)
    for i in range(layers):
        for got, want in ((int8.layer(i).keys, plain.layer(i).keys),
                          (int8.layer(i).values, plain.layer(i).values)):  # fmt: skip
            err = (got - want).abs().max() / want.abs().max()
            assert 0 < err < 0.05, (i, float(err))  # rounded to int8, and only that


def test_a_short_prefill_runs_as_step_passes_only_where_the_lean_passes_are_slower():
    """Guards against short prompts kept on the step kernel's passes when the lean forward's
    int8 products serve them faster (or sent to the lean forward's float32 copies when they
    do not): a prompt of one pass runs the step kernel; one of up to STEP_PREFILL_TOKENS
    runs the step kernel unless a prefill multiplies by the int8 products."""
    from specd.forward.passes import STEP_PREFILL_TOKENS
    from specd.forward.tiny import tiny_blocks_target

    if not cpu_kernels.available():
        pytest.skip(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    target = tiny_blocks_target(VOCAB, "q4", seed=3)
    assert target.fast is not None and target.compiled is not None and target.compiled.ready
    one = target.compiled.max_tokens
    for how, short in (("int8", False), ("prepacked", True), ("linear", True)):
        target.fast._block_prefill = how
        assert target._prefill_steps(one), how
        assert target._prefill_steps(one + 1) is short, how
        assert target._prefill_steps(STEP_PREFILL_TOKENS) is short, how
        assert not target._prefill_steps(STEP_PREFILL_TOKENS + 1), how


@pytest.mark.parametrize("fastest", ["int8", "prepacked", "linear"])
def test_a_prefill_on_blocks_multiplies_the_way_that_measured_faster(
    monkeypatch, tmp_path, fastest
):
    """Guards against a choice of products that keeps a slower one (the verdict read the
    wrong way round) or measures anew for every decoder, so that two decoders of one model
    compute different caches: every product but ``fastest`` is made slower here, ``fastest``
    is chosen, kept, and read back by a fresh process's decoder."""
    from specd.forward.tiny import tiny_blocks_target

    ways = tiny_blocks_target(VOCAB, "q8", seed=3).fast._prefill_products()  # type: ignore[union-attr]
    if fastest not in ways:
        pytest.skip(f"{fastest} products do not run here (this host has {ways})")
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECD_PRICE_CACHE", "on")
    monkeypatch.setattr(weight_products, "_BLOCK_PREFILL", {})
    real_mlp, timed = fastpath.FastDecoder.mlp, []

    def mlp(self, *args):
        timed.append(self._block_prefill)
        if self._block_prefill != fastest:
            time.sleep(0.02)
        return real_mlp(self, *args)

    monkeypatch.setattr(fastpath.FastDecoder, "mlp", mlp)
    fast = tiny_blocks_target(VOCAB, "q8", seed=3).fast
    assert fast is not None
    assert fast._prefill_product() == fastest
    assert sorted(set(timed)) == sorted(ways)  # every way was timed
    timed.clear()
    monkeypatch.setattr(weight_products, "_BLOCK_PREFILL", {})  # a new process: read back
    again = tiny_blocks_target(VOCAB, "q8", seed=3).fast
    assert again is not None and again._prefill_product() == fastest and not timed
    for kept in (tmp_path / "remembered").iterdir():  # the same process: no second measure
        kept.unlink()
    other = tiny_blocks_target(VOCAB, "q8", seed=3).fast
    assert other is not None and other._prefill_product() == fastest and not timed


def test_rotary_rows_are_the_rotary_modules_values_bit_for_bit():
    fast = Target(MODELS["llama"], CharTokenizer(VOCAB)).fast
    assert fast is not None
    for positions, end in [([0], 1), ([5, 6, 7], 8), ([300], 301), ([2, 3, 3, 4], 600)]:
        pos = torch.tensor([positions])
        cos, sin = fast.rotary_rows(pos, end)  # the tables grow past 256 rows on the way
        want_cos, want_sin = fast.rotary_at(pos)
        assert torch.equal(cos, want_cos[0, 0]) and torch.equal(sin, want_sin[0, 0])
        assert cos.shape == (len(positions), fast.head_dim)
    assert fast._cos_rows.shape[0] >= 600  # grown past its first 256 rows


WIDE = tiny_model(VOCAB, hidden_size=256, num_layers=2, seed=3, dtype=torch.float32)


@pytest.mark.parametrize("chunk", [256, 7])
@pytest.mark.parametrize(
    "model, rows",
    [("llama", 1), ("llama", 5), ("llama", 50), ("wide", 20)],  # wide: 64-wide float32 heads,
)  # which the attention kernel takes where it loads (rows >= its 16)
def test_a_prefill_for_the_last_features_writes_the_same_cache(monkeypatch, chunk, model, rows):
    from specd.forward import target as target_module

    monkeypatch.setattr(target_module, "PREFILL_CHUNK", chunk)
    monkeypatch.setattr(target_module, "prefill_pieces", _pieces_of(chunk))
    t = Target(MODELS["llama"] if model == "llama" else WIDE, CharTokenizer(VOCAB))
    prompt = [(7 * i + 3) % VOCAB for i in range(41)]
    full, last = t.new_cache(), t.new_cache()
    every: list[torch.Tensor] = []
    some: list[torch.Tensor] = []
    t.prefill(full, prompt, hidden=every)
    t.prefill(last, prompt, hidden=some, hidden_rows=rows)
    want = torch.cat(every)[-rows:]
    got = torch.cat(some)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for i in range(t.num_layers):  # the keys and values are the full prefill's, bit for bit
        assert torch.equal(last.layer(i).keys, full.layer(i).keys)
        assert torch.equal(last.layer(i).values, full.layer(i).values)


def _pieces_of(chunk: int):
    from specd.forward.passes import prefill_pieces

    def pieces(past, n, _chunk=chunk, *, first=False):
        return prefill_pieces(past, n, chunk, first=True)

    return pieces
