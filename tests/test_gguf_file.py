"""Reading GGUF files (specd.forward.blocks.read_gguf): Hugging Face names, blocks viewing the
file's map, q/k rows put back in Hugging Face's order, metadata, and clear errors; on a small
file written with gguf-py's writer and on the default model's file."""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GT
from gguf import quants
from test_decode_step import k_quant

from specd.errors import ModelNotFoundError
from specd.forward.blocks import BlockWeight, UnsupportedGGUFError, quantize, read_gguf

HEADS, KV, HIDDEN, FFN, VOCAB = 4, 2, 64, 96, 40
KV_ROWS = HIDDEN // HEADS * KV


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) on whole rows."""
    shape = rows.shape
    return rows.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def model_tensors(seed: int = 0) -> dict[str, tuple[torch.Tensor, GT]]:
    """Hugging Face name -> (float32 values, the type the file stores them in)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    layer = "model.layers.0."
    return {
        "model.embed_tokens.weight": (r(VOCAB, HIDDEN), GT.Q8_0),
        layer + "input_layernorm.weight": (r(HIDDEN), GT.Q8_0),  # vectors of blocks: float32
        layer + "self_attn.q_proj.weight": (r(HIDDEN, HIDDEN), GT.Q4_0),
        layer + "self_attn.q_proj.bias": (r(HIDDEN), GT.F32),
        layer + "self_attn.k_proj.weight": (r(KV_ROWS, HIDDEN), GT.Q4_1),
        layer + "self_attn.v_proj.weight": (r(KV_ROWS, HIDDEN), GT.BF16),
        layer + "self_attn.o_proj.weight": (r(HIDDEN, HIDDEN), GT.F16),
        layer + "post_attention_layernorm.weight": (r(HIDDEN), GT.F32),
        layer + "mlp.gate_proj.weight": (r(FFN, HIDDEN), GT.Q8_0),
        layer + "mlp.up_proj.weight": (r(FFN, HIDDEN), GT.Q4_1),
        layer + "mlp.down_proj.weight": (r(HIDDEN, FFN), GT.Q4_1),
        "model.norm.weight": (r(HIDDEN), GT.BF16),
        "lm_head.weight": (r(VOCAB, HIDDEN), GT.Q8_0),
    }


GGUF_NAMES = {
    "model.embed_tokens": "token_embd",
    "model.norm": "output_norm",
    "lm_head": "output",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    base, kind = hf.rsplit(".", 1)
    if base.startswith("model.layers."):
        _, _, n, part = base.split(".", 3)
        return f"blk.{n}.{GGUF_NAMES[part]}.{kind}"
    return f"{GGUF_NAMES[base]}.{kind}"


def stored(values: torch.Tensor, kind: GT) -> np.ndarray:
    """What the file holds for ``values`` in Hugging Face's row order."""
    if kind == GT.F32:
        return values.numpy()
    if kind == GT.F16:
        return values.numpy().astype(np.float16)
    return quants.quantize(values.numpy(), kind)


def write(path: Path, tensors: dict[str, tuple[torch.Tensor, GT]], arch: str = "llama",
          extra: dict[str, tuple[np.ndarray, GT]] | None = None, permuted: bool = True,
          ) -> Path:  # fmt: skip
    """A GGUF file of ``tensors`` (q and k rows reordered as llama.cpp's converter does when
    ``permuted``), ``extra`` raw tensors under GGUF names added."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_array("general.tags", ["a", "b"])
    w.add_token_list([f"token{i}" for i in range(VOCAB * 3)])  # long: left out of the metadata
    w.add_token_scores([0.5] * (VOCAB * 3))
    for hf, (values, kind) in tensors.items():
        data = stored(values, kind)
        part = hf.split(".")[4] if hf.startswith("model.layers.") else ""
        if permuted and part in ("q_proj", "k_proj"):
            data = permute(data, HEADS if part == "q_proj" else KV)
        w.add_tensor(gguf_name(hf), data, raw_dtype=None if kind in (GT.F32, GT.F16) else kind)
    for name, (data, kind) in (extra or {}).items():
        w.add_tensor(name, data, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> tuple[Path, dict[str, tuple[torch.Tensor, GT]]]:
    tensors = model_tensors()
    return write(tmp_path_factory.mktemp("gguf") / "small.gguf", tensors), tensors


def file_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges this process maps ``path`` at (Linux)."""
    target = str(path.resolve())
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


def in_map(t: torch.Tensor | BlockWeight, ranges: list[tuple[int, int]]) -> bool:
    start = t.data_ptr()
    end = start + (t.nbytes if isinstance(t, BlockWeight) else t.numel() * t.element_size())
    return any(lo <= start and end <= hi for lo, hi in ranges)


needs_maps = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="/proc/self/maps (Linux) shows the mappings"
)


def test_every_type_comes_back_under_its_hugging_face_name(small):
    path, expected = small
    tensors, _ = read_gguf(path)
    assert set(tensors) == set(expected)
    for hf, (values, kind) in expected.items():
        got = tensors[hf]
        if kind in (GT.F32, GT.F16) or values.dim() == 1:
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float32, hf
            data = stored(values, kind)
            if kind not in (GT.F32, GT.F16):
                data = quants.dequantize(data, kind)
            assert torch.equal(got, torch.from_numpy(data.astype(np.float32))), hf
            continue
        assert isinstance(got, BlockWeight), hf
        assert got.fmt.name == kind.name.lower() and got.shape == values.shape, hf
        # q and k: the rows of blocks in Hugging Face's order again, the blocks untouched
        assert torch.equal(got.data, torch.from_numpy(stored(values, kind))), hf
        want = quants.dequantize(stored(values, kind), kind)
        assert torch.equal(got.dequantize(), torch.from_numpy(want)), hf


def test_without_output_weight_there_is_no_lm_head(tmp_path):
    tensors = model_tensors()
    del tensors["lm_head.weight"]
    got, meta = read_gguf(write(tmp_path / "tied.gguf", tensors))
    assert "lm_head.weight" not in got and "model.embed_tokens.weight" in got
    assert meta["hf_config"]["tie_word_embeddings"] is True


def test_qwen2_files_keep_their_q_and_k_rows(tmp_path):
    """llama.cpp reorders q and k rows for its llama architecture only."""
    tensors = model_tensors()
    got, meta = read_gguf(write(tmp_path / "qwen2.gguf", tensors, arch="qwen2", permuted=False))
    assert meta["architecture"] == "qwen2" and meta["head_count_kv"] == KV
    for part in ("q_proj", "k_proj"):
        values, kind = tensors[f"model.layers.0.self_attn.{part}.weight"]
        block = got[f"model.layers.0.self_attn.{part}.weight"]
        assert isinstance(block, BlockWeight)
        assert torch.equal(block.data, torch.from_numpy(stored(values, kind))), part


def test_metadata_names_the_shape(small):
    _, meta = read_gguf(small[0])
    assert meta["architecture"] == "llama" == meta["general.architecture"]
    assert (meta["head_count"], meta["head_count_kv"]) == (HEADS, KV)
    assert meta["llama.attention.head_count_kv"] == KV
    assert meta["general.tags"] == ["a", "b"]
    assert "tokenizer.ggml.tokens" not in meta and "tokenizer.ggml.scores" not in meta
    assert meta["hf_config"] == {
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "max_position_embeddings": 128,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "rope_theta": 10000.0,
        "rms_norm_eps": pytest.approx(1e-5),
        "vocab_size": VOCAB,  # no llama.vocab_size key: the embedding's rows
        "tie_word_embeddings": False,
    }


def test_the_header_reads_as_gguf_py_reads_it(small):
    """Metadata and every tensor's bytes as gguf.GGUFReader finds them."""
    path, _ = small
    tensors, meta = read_gguf(path)
    reader = gguf.GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith(("GGUF.", "tokenizer.ggml.")):
            assert meta[key] == pytest.approx(field.contents()), key
    names = {gguf_name(hf): hf for hf in tensors}
    for t in reader.tensors:
        got = tensors[names[t.name]]
        if ".attn_q." in t.name or ".attn_k." in t.name:
            continue  # reordered: checked against the writer's input above
        theirs = np.array(t.data)
        if isinstance(got, BlockWeight):
            assert torch.equal(got.data, torch.from_numpy(theirs)), t.name
            continue
        if t.tensor_type not in (GT.F32, GT.F16):  # a vector of blocks
            theirs = quants.dequantize(theirs, t.tensor_type)
        assert torch.equal(got, torch.from_numpy(theirs.astype(np.float32))), t.name


@needs_maps
def test_blocks_view_the_file_and_only_q_and_k_are_copied(small):
    path, _ = small
    tensors, _ = read_gguf(path)
    ranges = file_ranges(path)
    assert ranges
    for hf, t in tensors.items():
        # o_proj is F16, two norms vectors of blocks: all three de-quantized
        copied = any(p in hf for p in ("q_proj", "k_proj", "o_proj", "input_", "model.norm"))
        assert in_map(t, ranges) != copied, hf


def test_unsupported_block_types_are_named(tmp_path):
    q2_k = np.zeros((2, 84), dtype=np.uint8)  # two rows of one 256-value Q2_K block
    path = write(
        tmp_path / "k.gguf", model_tensors(), extra={"blk.0.ffn_extra.weight": (q2_k, GT.Q2_K)}
    )
    with pytest.raises(UnsupportedGGUFError, match="ffn_extra.weight' has no Llama-style"):
        read_gguf(path)
    tensors = model_tensors()
    tensors.pop("model.layers.0.mlp.up_proj.weight")
    path = write(tmp_path / "k2.gguf", tensors, extra={"blk.0.ffn_up.weight": (q2_k, GT.Q2_K)})
    with pytest.raises(UnsupportedGGUFError, match=r"'blk.0.ffn_up.weight' is stored as Q2_K") as e:
        read_gguf(path)
    assert "Q4_K, Q5_K, Q6_K" in str(e.value)  # what it does read


def test_k_quant_matrices_come_back_as_their_blocks(tmp_path):
    """A Q4_K_M-like file (llama.cpp's mix: Q4_K, Q5_K, Q6_K, and Q5_0/Q5_1/Q8_0 where a
    row is no whole super-block) reads as blocks of each type, decoding as gguf-py does."""
    tensors = model_tensors()
    tensors["model.layers.0.mlp.gate_proj.weight"] = (
        tensors["model.layers.0.mlp.gate_proj.weight"][0],
        GT.Q5_0,
    )
    tensors["model.layers.0.mlp.up_proj.weight"] = (
        tensors["model.layers.0.mlp.up_proj.weight"][0],
        GT.Q5_1,
    )
    extra = {}
    for part, kind in (("ffn_gate_k", GT.Q4_K), ("ffn_up_k", GT.Q5_K), ("ffn_down_k", GT.Q6_K)):
        data = k_quant((3, 512), kind.name.lower(), seed=kind.value).data.numpy()
        extra[f"blk.0.{part}.weight"] = (data, kind)
    path = write(tmp_path / "kq.gguf", tensors)
    got, _ = read_gguf(path)
    for hf in ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        values, kind = tensors[hf]
        assert isinstance(got[hf], BlockWeight) and got[hf].fmt.name == kind.name.lower()
        want = quants.dequantize(stored(values, kind), kind)
        assert torch.equal(got[hf].dequantize(), torch.from_numpy(want))
    for name, (data, kind) in extra.items():  # no Llama-style name: read them one at a time
        tensors = model_tensors()
        hf = "model.layers.0.mlp.down_proj.weight"
        tensors.pop(hf)
        one = write(
            tmp_path / f"{name}.gguf", tensors, extra={"blk.0.ffn_down.weight": (data, kind)}
        )
        w = read_gguf(one)[0][hf]
        assert isinstance(w, BlockWeight) and w.fmt.name == kind.name.lower()
        assert w.shape == (3, 512) and torch.equal(w.data, torch.from_numpy(data))
        want = torch.from_numpy(quants.dequantize(data, kind))
        assert torch.equal(w.dequantize(), want) and torch.equal(w[[2, 0]], want[[2, 0]])


def test_files_it_cannot_read_are_refused_naming_why(tmp_path, small):
    with pytest.raises(UnsupportedGGUFError, match="architecture 'gpt2' is not supported"):
        read_gguf(write(tmp_path / "gpt2.gguf", model_tensors(), arch="gpt2"))
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        read_gguf(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_bytes(b"not a model at all")
    with pytest.raises(UnsupportedGGUFError, match="not a GGUF file"):
        read_gguf(tmp_path / "text.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(UnsupportedGGUFError, match="not a readable GGUF file"):
        read_gguf(tmp_path / "empty.gguf")
    whole = small[0].read_bytes()
    (tmp_path / "header.gguf").write_bytes(whole[:200])
    with pytest.raises(UnsupportedGGUFError, match="not a readable GGUF file"):
        read_gguf(tmp_path / "header.gguf")
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) - 100])
    with pytest.raises(UnsupportedGGUFError, match="lies past the end of the file"):
        read_gguf(tmp_path / "cut.gguf")
    odd = bytearray(whole)
    odd[4:8] = (1).to_bytes(4, "little")
    (tmp_path / "v1.gguf").write_bytes(bytes(odd))
    with pytest.raises(UnsupportedGGUFError, match="GGUF version 1 is not supported"):
        read_gguf(tmp_path / "v1.gguf")


@pytest.fixture(scope="module")
def real() -> tuple[Path, dict, dict]:
    from specd.forward.models import ALIASES, gguf_path

    path = gguf_path(ALIASES["smollm2-135m"])
    tensors, meta = read_gguf(path)
    return path, tensors, meta


def test_the_default_model_reads_as_blocks(real):
    _, tensors, meta = real
    assert len(tensors) == 272 and "lm_head.weight" not in tensors  # tied
    embed = tensors["model.embed_tokens.weight"]
    assert isinstance(embed, BlockWeight) and embed.fmt.name == "q8_0"
    assert embed.shape == (49152, 576)
    q = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, BlockWeight) and q.fmt.name == "q4_1" and q.shape == (576, 576)
    norm = tensors["model.layers.29.input_layernorm.weight"]
    assert isinstance(norm, torch.Tensor) and norm.shape == (576,)
    assert (meta["architecture"], meta["head_count"], meta["head_count_kv"]) == ("llama", 9, 3)
    assert sum(t.nbytes for t in tensors.values() if isinstance(t, BlockWeight)) < 100e6


def test_the_default_model_decodes_as_ggml_does(real):
    _, tensors, _ = real
    embed = tensors["model.embed_tokens.weight"]
    rows = embed.data[:4096].numpy()
    assert torch.equal(embed[:4096], torch.from_numpy(quants.dequantize(rows, GT.Q8_0)))
    for name in ("self_attn.v_proj", "mlp.down_proj"):
        w = tensors[f"model.layers.7.{name}.weight"]
        ref = quants.dequantize(w.data.numpy(), GT.Q4_1)
        assert torch.equal(w.dequantize(), torch.from_numpy(ref)), name
    # ggml's q8_0 gives its own output back: same values, same blocks
    again = quantize(embed[:4096], "q8_0")
    assert torch.equal(again.dequantize(), embed[:4096])
    assert torch.equal(again.data, embed.data[:4096])


@needs_maps
def test_the_default_model_is_not_copied(real):
    path, tensors, _ = real
    ranges = file_ranges(path)
    for hf, t in tensors.items():
        copied = ".q_proj." in hf or ".k_proj." in hf
        assert in_map(t, ranges) != copied, hf


@pytest.mark.slow
def test_the_default_model_equals_transformers_conversion_bit_for_bit(real):
    """Every tensor, de-quantized, equals the float32 copy transformers' GGUF loader made
    (which undoes the q/k permutation its own way)."""
    from safetensors.torch import load_file

    from specd.forward.models import converted_dir

    _, tensors, _ = real
    ref = load_file(converted_dir("smollm2-135m") / "model.safetensors")
    assert set(ref) == set(tensors)
    for name, t in tensors.items():
        got = t.dequantize() if isinstance(t, BlockWeight) else t
        assert torch.equal(got, ref[name]), name


@pytest.mark.slow
def test_the_default_model_header_reads_as_gguf_py_reads_it(real):
    path, tensors, meta = real
    reader = gguf.GGUFReader(path)
    for key, field in reader.fields.items():
        if not key.startswith(("GGUF.", "tokenizer.ggml.")):
            assert meta[key] == pytest.approx(field.contents()), key
    embed = tensors["model.embed_tokens.weight"]
    (theirs,) = (t for t in reader.tensors if t.name == "token_embd.weight")
    assert torch.equal(embed.data, torch.from_numpy(np.array(theirs.data)))
