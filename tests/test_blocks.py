"""Block formats (specd.forward.blocks): de-quantization and quantization bit for bit against
gguf-py's reference implementations, the round trip's error bounds, and how a BlockWeight
behaves where a float32 weight is used."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as GT
from gguf import quants

from specd.forward import blocks, cpu_kernels
from specd.forward.blocks import (
    BF16,
    FORMATS,
    Q4_0,
    Q4_1,
    Q8_0,
    QUANTIZABLE,
    BlockWeight,
    quantize,
)

GGML = {name: GT[name.upper()] for name in FORMATS}
# byte offsets of each format's fp16 fields (d, and m or dmin)
HALVES = {
    "q4_0": (0,),
    "q4_1": (0, 2),
    "q8_0": (0,),
    "bf16": (),
    "q5_0": (0,),
    "q5_1": (0, 2),
    "q4_k": (0, 2),
    "q5_k": (0, 2),
    "q6_k": (208,),
}


def bits(t: torch.Tensor | np.ndarray) -> torch.Tensor:
    """float32 values as their bits, so NaNs and signed zeros compare exactly."""
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t, dtype=np.float32))
    return t.contiguous().view(torch.int32)


def random_blocks(fmt: blocks.Format, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random bytes, with every fp16 field a random finite fp16 (subnormals and -0 too)."""
    g = torch.Generator().manual_seed(seed)
    n = cols // fmt.values
    data = torch.randint(0, 256, (rows, n, fmt.block_bytes), generator=g)
    data = data.to(torch.uint8)
    for off in HALVES[fmt.name]:
        half = torch.randint(0, 1 << 16, (rows, n), generator=g)
        half = torch.where((half & 0x7C00) == 0x7C00, half & 0x83FF, half)  # no inf/NaN
        data[..., off] = (half & 0xFF).to(torch.uint8)
        data[..., off + 1] = (half >> 8).to(torch.uint8)
    return data.reshape(rows, -1)


def test_formats_are_the_agreed_codes_and_sizes():
    assert {n: (f.code, f.block_bytes, f.values) for n, f in FORMATS.items()} == {
        "q4_0": (1, 18, 32),
        "q4_1": (2, 20, 32),
        "q8_0": (3, 34, 32),
        "bf16": (4, 64, 32),
        "q5_0": (5, 22, 32),
        "q5_1": (6, 24, 32),
        "q4_k": (7, 144, 256),
        "q5_k": (8, 176, 256),
        "q6_k": (9, 210, 256),
    }
    assert blocks.F32.code == 0 and "f32" not in FORMATS
    assert set(QUANTIZABLE) == set(FORMATS) - {"q4_k", "q5_k", "q6_k"}
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        block_size, type_size = quants.GGML_QUANT_SIZES[GGML[name]]
        assert type_size * fmt.values // block_size == fmt.block_bytes


@pytest.mark.parametrize("name", list(FORMATS))
def test_dequantize_matches_ggml_reference_bit_for_bit_on_random_blocks(name):
    fmt = FORMATS[name]
    for seed, (rows, cols) in enumerate([(7, 32), (33, 96), (64, 512)]):
        cols = cols if fmt.values == 32 else 2 * cols // 32 * fmt.values  # whole super-blocks
        data = random_blocks(fmt, rows, cols, seed)
        ours = BlockWeight(data, fmt, (rows, cols)).dequantize()
        ref = quants.dequantize(data.numpy(), GGML[name])
        assert ours.dtype == torch.float32 and ours.shape == (rows, cols)
        assert torch.equal(bits(ours), bits(ref)), f"{name} {rows}x{cols}"


def test_bf16_decodes_rows_of_any_length():
    data = torch.randint(0, 256, (3, 20), dtype=torch.uint8)  # 3 rows of 10 values
    ref = quants.dequantize(data.numpy(), GT.BF16)
    assert torch.equal(bits(blocks.decode(data, BF16)), bits(ref))


def sample(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Normal values with the cases rounding rules differ on: a zero block, a constant
    block, a block of exact halves (q8_0: d = 1), ties in magnitude of opposite sign."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * torch.rand(rows, 1, generator=g) * 4
    w[0, :32] = 0.0
    w[1, :32] = 3.0
    w[2, :32] = torch.arange(32) - 15.5  # halves in every position
    w[2, 0] = 127.0
    w[3, :32] = torch.tensor([-2.0, 2.0] * 16)
    w[3, 32:64] = torch.tensor([1.0, -1.0] * 16)
    return w


@pytest.mark.parametrize("name", list(QUANTIZABLE))
def test_quantize_matches_ggml_reference_bit_for_bit(name):
    w = sample(16, 256, seed=1)
    ours = quantize(w, name)
    ref = quants.quantize(w.numpy(), GGML[name])
    assert ours.fmt == FORMATS[name] and ours.shape == (16, 256)
    assert torch.equal(ours.data, torch.from_numpy(ref)), name


def test_q8_0_rounds_halves_away_from_zero():
    w = torch.zeros(1, 32)
    w[0, :4] = torch.tensor([127.0, 2.5, -2.5, 0.5])  # d = 1: q is x rounded
    q = quantize(w, "q8_0").data[0, 2:6].view(torch.int8)
    assert q.tolist() == [127, 3, -3, 1]


@pytest.mark.parametrize("name", list(QUANTIZABLE))
def test_round_trip_is_within_half_a_step(name):
    """Per block, within d/2 of every value (q4_0: within d where a value needed q = 16,
    its -8..7 range being one step short on the far side), plus the fp16 rounding of the
    scales; bf16 within 2^-8 relative (half an ulp of an 8-bit significand)."""
    w = sample(32, 512, seed=2)
    q = quantize(w, name)
    back = q.dequantize()
    assert back.shape == w.shape and not back.isnan().any()
    err = (back - w).abs().reshape(32, -1, 32)
    if name == "bf16":
        assert (err <= w.abs().reshape(32, -1, 32) * 2.0**-8).all()
        return
    raw = q.data.reshape(32, -1, FORMATS[name].block_bytes)
    d = raw[..., 0:2].contiguous().view(torch.float16).float().abs()  # [rows, blocks, 1]
    m = raw[..., 2:4].contiguous().view(torch.float16).float().abs() if name[-1] == "1" else 0
    steps = {"q8_0": 127, "q4_0": 8, "q4_1": 15, "q5_0": 16, "q5_1": 31}[name]
    slack = steps * d * 2.0**-10 + m * 2.0**-10  # the scales' fp16 rounding
    half = d / 2
    if name in ("q4_0", "q5_0"):  # the top q (7d, 15d) also stands for what would be 8d, 16d
        level = back.reshape(32, -1, 32) / raw[..., 0:2].contiguous().view(torch.float16).float()
        half = torch.where(level == steps - 1, d, half)
    assert (err <= half + slack).all(), (err - half - slack).max()


@pytest.mark.parametrize("name", list(QUANTIZABLE))
def test_a_zero_block_stays_zero(name):
    w = torch.zeros(2, 64)
    w[1, 32:] = torch.randn(32)
    back = quantize(w, name).dequantize()
    assert not back.isnan().any()
    assert torch.equal(back[:, :32], w[:, :32]) and torch.equal(back[0], w[0])


def test_q4_1_keeps_a_constant_block_exactly():
    w = torch.full((1, 32), -1.5)
    assert torch.equal(quantize(w, "q4_1").dequantize(), w)  # d = 0, m = the value


def test_requantizing_q8_0_values_gives_the_same_blocks():
    """ggml's q8_0 is deterministic on its own output: d = 127 |d| / 127, q = q."""
    data = random_blocks(Q8_0, 64, 256, seed=3)
    view = data.view(64, -1, 34)  # what ggml writes: d > 0, q in -127..127, one q = 127
    view[..., 1] &= 0x7F
    view[..., 0] |= 1
    view[..., 2:][view[..., 2:] == 0x80] = 0x81
    view[..., 2] = 127
    w = BlockWeight(data, Q8_0, (64, 256))
    again = quantize(w.dequantize(), "q8_0")
    assert torch.equal(again.dequantize(), w.dequantize())
    assert torch.equal(again.data, data)


def test_quantize_refuses_bad_input_naming_it():
    with pytest.raises(ValueError, match="2-D float tensor"):
        quantize(torch.zeros(64), "q8_0")
    with pytest.raises(ValueError, match="2-D float tensor"):
        quantize(torch.zeros(2, 64, dtype=torch.int32), "q8_0")
    with pytest.raises(ValueError, match=r"2x48 matrix as q4_1 blocks: cols must be"):
        quantize(torch.zeros(2, 48), "q4_1")
    with pytest.raises(ValueError, match="unknown block format 'q3_k'"):
        quantize(torch.zeros(2, 64), "q3_k")
    with pytest.raises(ValueError, match="reads q4_k blocks from GGUF files but does not make"):
        quantize(torch.zeros(2, 256), "q4_k")
    with pytest.raises(ValueError, match="unknown block format"):
        quantize(torch.zeros(2, 64), blocks.F32)
    with pytest.raises(ValueError, match="non-finite values as q8_0"):
        quantize(torch.full((2, 64), float("inf")), "q8_0")
    nan = quantize(torch.full((1, 32), float("nan")), "bf16").dequantize()
    assert nan.isnan().all()  # bf16 keeps a NaN


def weight(name: str = "q4_1", rows: int = 48, cols: int = 96) -> BlockWeight:
    cols = cols if FORMATS[name].values == 32 else FORMATS[name].values
    return BlockWeight(
        random_blocks(FORMATS[name], rows, cols, seed=4), FORMATS[name], (rows, cols)
    )


@pytest.mark.parametrize("name", list(FORMATS))
def test_linear_uses_the_dequantized_matrix(name):
    w = weight(name)
    x = torch.randn(5, w.shape[1])
    b = torch.randn(48)
    full = w.dequantize()
    if name == "bf16":  # random bits: keep the values finite for a product
        w = quantize(torch.randn(48, 96), "bf16")
        full = w.dequantize()
    assert torch.equal(F.linear(x, w), F.linear(x, full))
    assert torch.equal(F.linear(x, w, b), F.linear(x, full, b))
    assert torch.equal(F.linear(input=x, weight=w, bias=b), F.linear(x, full, b))


def test_row_lookups_decode_only_those_rows(monkeypatch):
    w = weight("q8_0", rows=300)
    full = w.dequantize()
    decoded: list[tuple[int, ...]] = []
    real = blocks.decode_rows

    def spy(raw, fmt):
        decoded.append(tuple(raw.shape))
        return real(raw, fmt)

    monkeypatch.setattr(blocks, "decode_rows", spy)
    monkeypatch.setattr(BlockWeight, "dequantize", lambda self: pytest.fail("decoded all"))
    ids = torch.tensor([[3, 299], [0, 3]])
    row = 96 // 32 * 34
    for lookup, expected, rows in [
        (lambda: w[ids], full[ids], (2, 2, row)),
        (lambda: F.embedding(ids, w), full[ids], (2, 2, row)),
        (lambda: F.embedding(ids, w, padding_idx=0), full[ids], (2, 2, row)),
        (lambda: w[3], full[3], (row,)),
        (lambda: w[:5], full[:5], (5, row)),
        (lambda: w[[7, 1]], full[[7, 1]], (2, row)),
        (lambda: w[3, :8], full[3, :8], (row,)),
        (lambda: w[ids, 5], full[ids, 5], (2, 2, row)),
    ]:
        decoded.clear()
        got = lookup()
        assert got.shape == expected.shape and torch.equal(got, expected)
        assert decoded == [rows]
    with pytest.raises(IndexError, match="row index and at most a column index"):
        w[..., 3]


def test_other_torch_functions_are_refused_naming_them():
    w = weight()
    with pytest.raises(TypeError, match=r"matmul is not supported on a quantized weight \(q4_1"):
        torch.matmul(torch.randn(2, 48), w)
    with pytest.raises(TypeError, match=r"add is not supported on a quantized weight"):
        torch.add(w, 1)
    with pytest.raises(TypeError, match="max_norm"):
        F.embedding(torch.tensor([1]), w, max_norm=1.0)


@pytest.mark.parametrize("name", list(FORMATS))
def test_an_empty_matrix_and_an_empty_lookup(name):
    cols = FORMATS[name].values * 2
    w = BlockWeight(
        torch.zeros(0, 2 * FORMATS[name].block_bytes, dtype=torch.uint8), name, (0, cols)
    )
    assert w.dequantize().shape == (0, cols) and w.nbytes == 0
    some = weight(name)
    assert some[torch.tensor([], dtype=torch.long)].shape == (0, some.shape[1])


def test_it_answers_like_a_float32_weight():
    w = weight("q4_0", rows=48, cols=96)
    assert w.shape == torch.Size([48, 96]) and w.size() == w.shape and w.size(1) == 96
    assert w.dtype == torch.float32 and w.device == torch.device("cpu")
    assert w.ndim == 2 and w.dim() == 2
    assert w.nbytes == 48 * 3 * 18 == w.data.numel()
    assert w.data_ptr() == w.data.data_ptr()
    assert "q4_0" in repr(w)


def test_bad_blocks_are_refused_naming_what_is_wrong():
    good = random_blocks(Q4_1, 4, 64, seed=5)
    with pytest.raises(ValueError, match="must be uint8, not torch.int8"):
        BlockWeight(good.view(torch.int8), Q4_1, (4, 64))
    with pytest.raises(ValueError, match="uint8 tensor, not ndarray"):
        BlockWeight(good.numpy(), Q4_1, (4, 64))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"4 rows of 40 bytes, but the data is \(4, 36\)"):
        BlockWeight(random_blocks(Q4_0, 4, 64, seed=5), Q4_1, (4, 64))
    with pytest.raises(ValueError, match="cols must be a positive multiple of 32"):
        BlockWeight(good, Q4_1, (4, 48))
    with pytest.raises(ValueError, match=r"multiple of 256 \(q6_k blocks\)"):
        BlockWeight(torch.zeros(4, 210, dtype=torch.uint8), "q6_k", (4, 224))
    with pytest.raises(ValueError, match="contiguous 2-D tensor"):
        BlockWeight(good.reshape(-1), Q4_1, (4, 64))
    with pytest.raises(ValueError, match="non-contiguous"):
        BlockWeight(torch.zeros(80, 4, dtype=torch.uint8).t(), Q4_1, (4, 64))
    with pytest.raises(ValueError, match="unknown block format"):
        BlockWeight(good, blocks.Format("q4_1", 9, 20), (4, 64))
    with pytest.raises(ValueError, match=r"shape must be \(rows, cols\)"):
        BlockWeight(good, Q4_1, (4, 64, 1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape must be \(rows, cols\)"):
        BlockWeight(good, Q4_1, (4, 64.0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rows must not be negative"):
        BlockWeight(good, Q4_1, (-4, 64))
    counts = (np.int64(4), torch.tensor(64))  # anything int-like
    assert BlockWeight(good, Q4_1, counts).shape == (4, 64)  # type: ignore[arg-type]
    assert BlockWeight(good, "q4_1", (4, 64)).fmt == Q4_1  # type: ignore[arg-type]
    assert BF16.block_bytes == 64 and Q4_0.code == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_block_weight_follows_its_input_to_the_gpu():
    w = weight("q8_0")
    x = torch.randn(2, 96, device="cuda")
    ids = torch.tensor([3, 1], device="cuda")
    assert torch.equal(F.linear(x, w).cpu(), F.linear(x.cpu(), w.dequantize()))
    assert torch.equal(F.embedding(ids, w).cpu(), w.dequantize()[[3, 1]])


@pytest.mark.parametrize("name", ["f32", *FORMATS])
def test_the_kernels_product_is_the_product_of_the_stored_values(name):
    """Guards against a drafter's product that reads blocks wrongly (a nibble order, a
    scale, a sub-block's place in its super-block, a row stride) or drops the rows past an
    uneven split between threads: the step kernel's product equals ``x @ W.T`` of the
    weight's values to float32 rounding, and a row alone computes what it computes among
    others."""
    if not cpu_kernels.available():
        pytest.skip(f"the CPU kernels do not run here: {cpu_kernels.reason}")
    g = torch.Generator().manual_seed(5)
    cols = 96 if name == "f32" or FORMATS[name].values == 32 else 512
    w, x = torch.randn(70, cols, generator=g), torch.randn(3, cols, generator=g)
    if name in ("f32", *QUANTIZABLE):
        stored = w if name == "f32" else quantize(w, name)
    else:  # K-quants are read, not made: random blocks of sane scales
        stored = BlockWeight(random_blocks(FORMATS[name], 70, cols, seed=6), name, (70, cols))
        stored.data.view(70, -1, FORMATS[name].block_bytes)[..., [HALVES[name][0] + 1]] &= 0x2F
        if name != "q6_k":
            stored.data.view(70, -1, FORMATS[name].block_bytes)[..., 3] &= 0x2F
    values = w if name == "f32" else stored.dequantize()
    assert torch.equal(values, w) or torch.equal(values, blocks.decode(stored.data, stored.fmt))
    y = blocks.product(x, stored)
    torch.testing.assert_close(y, x @ values.T, rtol=1e-5, atol=1e-4)
    assert torch.equal(blocks.product(x[1:2], stored)[0], y[1])
    bias = torch.randn(70, generator=g)
    torch.testing.assert_close(blocks.product(x, stored, bias), y + bias)


def test_rows_of_blocks_stay_blocks():
    """Guards against LM head rows for a drafter taken as a float32 copy (four times the
    bytes for every draft token) or from the wrong rows."""
    w = quantize(torch.randn(40, 64, generator=torch.Generator().manual_seed(2)), "q8_0")
    index = torch.tensor([7, 0, 39])
    rows = blocks.rows_of(w, index)
    assert isinstance(rows, BlockWeight) and rows.shape == (3, 64) and rows.fmt == Q8_0
    assert torch.equal(rows.dequantize(), w.dequantize()[index])


def test_more_rows_than_the_kernel_takes_go_through_the_fallback():
    """Guards against a prefill-sized product sent through the drafter's product."""
    w = quantize(torch.randn(8, 32), "q8_0")
    seen = []

    def fallback(x, weight, bias):
        seen.append(x.shape)
        return F.linear(x, weight.dequantize(), bias)

    blocks.product(torch.randn(blocks.PRODUCT_ROWS + 1, 32), w, fallback=fallback)
    assert seen == [(blocks.PRODUCT_ROWS + 1, 32)]
