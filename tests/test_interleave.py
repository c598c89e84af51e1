"""Q4 weights woven 16 rows together for the step kernel's int8 products
(:mod:`specd.forward.interleave`): the woven copy holds the blocks' values exactly, the
products stay close to float32's, every token of a pass is computed bit for bit as a one-token
step computes it (so speculation emits plain decoding's tokens), and ``SPECD_INT8_PRODUCTS=off``
brings back the float products."""

from __future__ import annotations

import pytest
import torch
from test_cpu_kernels import use_build
from test_lean_load import VOCAB, write_tokenizer

from specd import Engine, SamplingParams
from specd.forward import blocks, cpu_kernels, interleave, models
from specd.forward.decode_step import for_decoder

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"CPU kernels unavailable: {cpu_kernels.reason}"
)
PROMPT = [5, 17, 42, 9, 120, 33, 250, 7, 64, 91, 3, 18] * 3


@pytest.fixture(params=cpu_kernels.ISAS)
def build(request):
    """Each build of the kernels this CPU runs (the others skipped by name)."""
    use_build(request.param)
    yield request.param
    cpu_kernels._reset()


@pytest.fixture
def threads():
    """Three threads: rows and positions split unevenly."""
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small Llama of the default model's head shape (three query heads of 64 on one
    key/value head, tied embedding), as a Hugging Face directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=192, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=512,
        tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(11)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(20.0)  # logits far apart: greedy is decisive
    where = tmp_path_factory.mktemp("llama-64-heads")
    model.save_pretrained(where)
    write_tokenizer(where)
    return where


def _weight(fmt: str, rows: int = 50, cols: int = 96, seed: int = 0) -> blocks.BlockWeight:
    g = torch.Generator().manual_seed(seed)
    return blocks.quantize(torch.randn(rows, cols, generator=g), fmt)


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_the_woven_copy_holds_the_blocks_values_exactly(fmt):
    w = _weight(fmt)  # 50 rows: the last group of 16 padded
    woven, code = interleave.weave(w), interleave.code(w)
    assert woven is not None and code is not None
    assert woven.shape == (4, 3 * interleave.GROUP_BYTES[code])
    assert interleave.weave(w) is woven  # made once
    values = cpu_kernels.dequantize(woven.data_ptr(), code, 50, 96)
    assert torch.equal(values, w.dequantize())


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_the_kernels_weave_as_the_reference_does(fmt):
    w = _weight(fmt, rows=37)
    if fmt == "q4_0":  # subnormal scales, small and large: -8 d normalised exactly
        raw = w.data.view(37, 3, 18)
        raw[0, 0, 0:2] = torch.tensor([0x07, 0x00], dtype=torch.uint8)
        raw[1, 1, 0:2] = torch.tensor([0xFF, 0x83], dtype=torch.uint8)
    want = interleave.reference(w)
    assert want is not None
    got = interleave.weave(w)
    assert got is not None and torch.equal(got, want)


def test_other_formats_and_unholdable_scales_are_not_woven():
    assert interleave.weave(_weight("q5_0")) is None and interleave.code(_weight("bf16")) is None
    w = _weight("q4_0")
    w.data.view(50, 3, 18)[0, 0, 0:2] = torch.tensor([0x00, 0x70], dtype=torch.uint8)  # d 8192
    assert interleave.weave(w) is None  # -8 d is past a half's range


@needs_kernel
@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0"])
def test_int8_products_stay_close_to_the_float_product(build, fmt):
    w = _weight(fmt, rows=64, cols=576)
    woven, code = interleave.weave(w), interleave.code(w)
    assert woven is not None and code is not None
    x = torch.randn(5, 576, generator=torch.Generator().manual_seed(1))
    got = cpu_kernels.product(x, woven.data_ptr(), code, 64, 576, None)
    want = x @ w.dequantize().T
    off = float((got - want).norm() / want.norm())
    assert 0 < off < 0.02  # rounded activations: close, and not the float product


@needs_kernel
@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_the_step_weaves_quantized_matrices_unless_turned_off(checkpoint, monkeypatch, weights):
    target = models.load_target(str(checkpoint), weights=weights)
    assert target.fast is not None
    step = for_decoder(target.fast)
    assert step.woven == 7 * len(target.fast.layers) + 1  # every matrix and the LM head
    monkeypatch.setenv("SPECD_INT8_PRODUCTS", "off")
    assert for_decoder(target.fast).woven == 0


@needs_kernel
@pytest.mark.parametrize("weights", ["q4", "q8"])
def test_a_pass_computes_each_token_as_one_token_steps_do(checkpoint, build, threads, weights):
    """Chains of 2-16 tokens over caches that cross the attention's chunks of 128 positions:
    logits and hidden states equal bit for bit to those of one-token steps, on 3 threads."""
    target = models.load_target(str(checkpoint), weights=weights)
    step = target.compile("on", backend="kernel")
    assert step is not None and step.ready and step.backend == "kernel"
    g = torch.Generator().manual_seed(4)
    for past, t in ((0, 5), (60, 16), (120, 9), (250, 2)):
        cache = target.new_cache()
        if past:
            target.prefill(cache, torch.randint(0, 256, (past,), generator=g).tolist())
        tokens = torch.randint(0, 256, (t,), generator=g).tolist()
        whole = target.forward(cache, tokens, hidden=True)
        cache.crop(past)
        steps = [target.forward(cache, [tok], hidden=True) for tok in tokens]
        assert torch.equal(whole.logits, torch.cat([s.logits for s in steps])), (past, t)
        assert whole.hidden is not None
        assert torch.equal(whole.hidden, torch.cat([s.hidden for s in steps]))  # type: ignore[misc]


@needs_kernel
def test_a_chain_longer_than_a_pass_is_computed_in_passes(checkpoint):
    """A draft past the kernel's 16 tokens runs as kernel passes, not one eager pass: its
    logits are the one-token steps' bit for bit."""
    target = models.load_target(str(checkpoint), weights="q4")
    target.compile("on", backend="kernel")
    assert target.compiled is not None and target.compiled.max_tokens == 16
    tokens = list(range(40, 60))
    cache = target.new_cache()
    target.prefill(cache, PROMPT)
    whole = target.forward(cache, tokens).logits
    assert cache.length == len(PROMPT) + 20
    cache.crop(len(PROMPT))
    steps = torch.cat([target.forward(cache, [t]).logits for t in tokens])
    assert torch.equal(whole, steps)


@needs_kernel
def test_greedy_speculation_emits_plain_decodings_tokens(checkpoint):
    engine = Engine.load(str(checkpoint), weights="q4", max_draft=20, exit_policy="fixed")
    params = SamplingParams(max_tokens=40)
    plain = engine.generate(PROMPT, params, drafter="none")
    spec = engine.generate(PROMPT, params, drafter="ngram")
    assert spec.stats.drafted > 0
    assert spec.token_ids == plain.token_ids


@needs_kernel
def test_each_node_of_a_tree_is_computed_as_the_steps_along_its_path(checkpoint, threads):
    """A verify pass over a tree: each node's logits equal bit for bit those of the one-token
    steps that decode its path (its siblings and cousins change nothing), over a cache that
    ends inside one of the attention's chunks."""
    target = models.load_target(str(checkpoint), weights="q4")
    target.compile("on", backend="kernel")
    parents = [-1, 0, 0, 1, 1, 2, 3, 5, 5, 7]
    tokens = [11, 40, 41, 60, 61, 62, 80, 81, 82, 90]
    cache = target.new_cache()
    target.prefill(cache, PROMPT * 4)  # 144 cached: the second chunk of 128 begun
    past = cache.length
    tree = target.forward(cache, tokens, parents).logits
    for i in range(len(tokens)):
        path = [i]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        cache.crop(past)
        for n in reversed(path):
            last = target.forward(cache, [tokens[n]]).logits
        assert torch.equal(tree[i], last[0]), i
