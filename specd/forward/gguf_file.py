"""Reading a Llama-style GGUF file: its metadata and its tensors under Hugging Face names.

The file is memory-mapped (copy on write: nothing is ever written back) and its blocks are
used where they lie: a Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K or BF16 tensor (the
types of llama.cpp's Q4_K_M, Q5_K_M, Q6_K and Q8_0 files) comes as its rows of blocks viewing
the map (:func:`specd.forward.blocks.read_gguf` wraps a matrix of them in a
``BlockWeight``), an F32 tensor as a float32 tensor viewing it, an F16 tensor as a float32
copy. The only blocks copied are the rows of q and k:
llama.cpp's converter reorders them within each head for its rotary layout (the two halves
of a head interleaved), and :func:`read` puts whole rows back in Hugging Face's order, as
transformers' GGUF loader does, never de-quantizing them.

The header is parsed here rather than with ``gguf.GGUFReader``, which builds an object per
item of every array (the tokenizer's 49152 tokens and merges) and takes seconds; arrays of
more than :data:`MAX_ARRAY` items are skipped over and left out of the metadata.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..errors import BadInputError, ModelNotFoundError
from .block_formats import BF16, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, Format, decode

#: Arrays in the metadata longer than this are left out (the tokenizer's vocabulary).
MAX_ARRAY = 64
#: Architectures read, and whether llama.cpp permuted their q and k rows.
ARCHITECTURES = {"llama": True, "qwen2": False}

# GGML type id -> (values per block, bytes per block, block format or None for F32/F16)
_F32, _F16 = 0, 1
_BLOCKS = {2: Q4_0, 3: Q4_1, 6: Q5_0, 7: Q5_1, 8: Q8_0, 12: Q4_K, 13: Q5_K, 14: Q6_K}
_TYPES: dict[int, tuple[int, int, Format | None]] = {
    _F32: (1, 4, None),
    _F16: (1, 2, None),
    **{kind: (f.values, f.block_bytes, f) for kind, f in _BLOCKS.items()},
    30: (1, 2, BF16),
}
# GGUF metadata value types: struct format of the scalar ones; 8 string, 9 array
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

_TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: Tensors with no Hugging Face weight: rotary frequencies transformers derives from config.
_SKIPPED = {"rope_freqs.weight"}


class UnsupportedGGUFError(BadInputError):
    """A GGUF file holds an architecture, tensor or block type specd cannot read."""


class RawTensor(NamedTuple):
    """One tensor as the file holds it: a matrix of whole blocks as uint8 ``data`` ``[rows,
    row bytes]`` in block format ``fmt``; anything else (``fmt`` None) float32 ``data`` of
    ``shape``: F32 viewing the file, F16 and block vectors de-quantized."""

    data: torch.Tensor
    fmt: Format | None
    shape: tuple[int, ...]


class _Header:
    """The parsed header: metadata, tensor infos ``(name, dims, type, offset)``, data start."""

    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 4  # after the magic
        if bytes(buf[:4]) != b"GGUF":
            raise UnsupportedGGUFError("not a GGUF file (its first bytes are not 'GGUF')")
        (version,) = self._take("I")
        if version not in (2, 3):
            raise UnsupportedGGUFError(f"GGUF version {version} is not supported (2 or 3 are)")
        n_tensors, n_kv = self._take("QQ")
        self.meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            (kind,) = self._take("I")
            value = self._value(kind)
            if value is not _SKIP:
                self.meta[key] = value
        self.tensors: list[tuple[str, list[int], int, int]] = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._take("I")
            dims = list(self._take("Q" * n_dims))
            kind, offset = self._take("IQ")
            self.tensors.append((name, dims, kind, offset))
        align = self.meta.get("general.alignment", 32)
        if not isinstance(align, int) or align <= 0:
            raise UnsupportedGGUFError(f"general.alignment {align!r} is not a positive count")
        self.data_start = -(-self.pos // align) * align

    def _take(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def _string(self) -> str:
        (n,) = self._take("Q")
        if self.pos + n > len(self.buf):
            raise struct.error("string past the end of the file")
        text = bytes(self.buf[self.pos : self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def _value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self._take(_SCALARS[kind])[0]
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise UnsupportedGGUFError(f"unknown GGUF metadata type {kind}")
        item, count = self._take("IQ")
        if count <= MAX_ARRAY:
            return [self._value(item) for _ in range(count)]
        if item in _SCALARS:  # skip over it
            self.pos += count * struct.calcsize("<" + _SCALARS[item])
        elif item == _STRING:  # each a length and its bytes (the vocabulary: ~50k of them)
            buf, pos, length = self.buf, self.pos, _U64.unpack_from
            for _ in range(count):
                pos += 8 + length(buf, pos)[0]
            self.pos = pos
        else:
            for _ in range(count):
                self._value(item)
        if self.pos > len(self.buf):
            raise struct.error("array past the end of the file")
        return _SKIP


_SKIP = object()


def read(path: Path) -> tuple[dict[str, RawTensor], dict[str, Any]]:
    """The tensors of the GGUF file ``path`` under Hugging Face names
    (``model.embed_tokens.weight``, ``model.layers.N.self_attn.q_proj.weight``, ...,
    ``model.norm.weight``, and ``lm_head.weight`` only when the file has ``output.weight``:
    otherwise the LM head is tied to the embedding), and its metadata.

    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and BF16 matrices come as rows of blocks
    viewing the file (vectors, and BF16 matrices whose rows are no whole blocks, de-quantized
    to float32), F32 tensors as
    float32 tensors viewing it, F16 as float32 copies (:class:`RawTensor`); any other type
    is an :class:`UnsupportedGGUFError` naming the tensor and its type. The metadata holds
    the file's keys (arrays longer than :data:`MAX_ARRAY` left out) and ``architecture``,
    ``head_count``, ``head_count_kv`` and ``hf_config`` (the model's shape under
    transformers' config names, ``tie_word_embeddings`` among them)."""
    path = Path(path)
    if not path.is_file():
        raise ModelNotFoundError(f"GGUF file {path} does not exist")
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="c")
        header = _Header(raw.data)
    except UnsupportedGGUFError as e:
        raise UnsupportedGGUFError(f"{path}: {e}") from None
    except (struct.error, ValueError, OSError, MemoryError, OverflowError) as e:
        raise UnsupportedGGUFError(f"{path} is not a readable GGUF file: {e}") from e
    meta = _metadata(header.meta, path)
    file = torch.from_numpy(raw)
    tensors: dict[str, RawTensor] = {}
    for name, dims, kind, offset in header.tensors:
        hf = _hf_name(name, path)
        if hf is None:
            continue
        start = header.data_start + offset
        tensor = _tensor(file, start, name, dims, kind, path)
        part = name.split(".")[2] if hf.startswith("model.layers.") else ""
        if ARCHITECTURES[meta["architecture"]] and part in ("attn_q", "attn_k"):
            heads = meta["head_count" if part == "attn_q" else "head_count_kv"]
            tensor = _unpermute(tensor, heads, name)
        tensors[hf] = tensor
    config = meta["hf_config"]
    config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    embed = tensors.get("model.embed_tokens.weight")
    if embed is not None and len(embed.shape) == 2:
        config.setdefault("vocab_size", embed.shape[0])
    return tensors, meta


def _metadata(found: dict[str, Any], path: Path) -> dict[str, Any]:
    arch = found.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUFError(
            f"{path}: architecture {arch!r} is not supported; {', '.join(ARCHITECTURES)} are"
        )
    heads = found.get(f"{arch}.attention.head_count")
    if not isinstance(heads, int) or heads <= 0:
        raise UnsupportedGGUFError(f"{path}: {arch}.attention.head_count is missing or bad")
    kv = found.get(f"{arch}.attention.head_count_kv", heads)
    if not isinstance(kv, int) or kv <= 0 or heads % kv:
        raise UnsupportedGGUFError(f"{path}: {arch}.attention.head_count_kv {kv!r} is bad")
    meta = dict(found)
    meta.update(architecture=arch, head_count=heads, head_count_kv=kv)
    names = {
        "hidden_size": "embedding_length",
        "intermediate_size": "feed_forward_length",
        "num_hidden_layers": "block_count",
        "max_position_embeddings": "context_length",
        "rope_theta": "rope.freq_base",
        "rms_norm_eps": "attention.layer_norm_rms_epsilon",
        "vocab_size": "vocab_size",
        "head_dim": "attention.key_length",
    }
    config = {hf: found[f"{arch}.{key}"] for hf, key in names.items() if f"{arch}.{key}" in found}
    config.update(model_type=arch, num_attention_heads=heads, num_key_value_heads=kv)
    meta["hf_config"] = config
    return meta


def _hf_name(name: str, path: Path) -> str | None:
    if name in _SKIPPED:
        return None
    base, _, kind = name.rpartition(".")
    parts = base.split(".")
    if kind in ("weight", "bias"):
        if base in _TOP:
            return f"{_TOP[base]}.{kind}"
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
            return f"model.layers.{parts[1]}.{_LAYER[parts[2]]}.{kind}"
    raise UnsupportedGGUFError(f"{path}: tensor {name!r} has no Llama-style counterpart")


def _tensor(
    file: torch.Tensor, start: int, name: str, dims: list[int], kind: int, path: Path
) -> RawTensor:
    """One tensor; ``dims`` are GGUF's, innermost (columns) first."""
    if kind not in _TYPES:
        raise UnsupportedGGUFError(
            f"{path}: tensor {name!r} is stored as {_type_name(kind)}, which specd does not "
            f"read; it reads {', '.join(_type_name(k) for k in _TYPES)}"
        )
    per_block, block_bytes, fmt = _TYPES[kind]
    shape = tuple(dims[::-1])  # row-major: [rows, cols]
    if len(shape) not in (1, 2) or any(n <= 0 for n in shape) or dims[0] % per_block:
        raise UnsupportedGGUFError(
            f"{path}: tensor {name!r} of shape {list(shape)} in {_type_name(kind)} is not a vector "
            f"or matrix of whole blocks"
        )
    cols, rows = dims[0], (dims[1] if len(dims) == 2 else 1)
    row_bytes = cols // per_block * block_bytes
    end = start + rows * row_bytes
    if end > file.numel():
        raise UnsupportedGGUFError(f"{path}: tensor {name!r} lies past the end of the file")
    data = file[start:end].view(rows, row_bytes)
    if fmt is None:
        dtype = torch.float32 if kind == _F32 else torch.float16
        if start % 4:  # a misaligned file: copy rather than view
            data = data.clone()
        return RawTensor(data.view(dtype).reshape(shape).to(torch.float32), None, shape)
    if len(shape) == 1 or cols % fmt.values:  # no matrix of whole blocks: its float32 values
        return RawTensor(decode(data, fmt).reshape(shape), None, shape)
    return RawTensor(data, fmt, shape)


def _unpermute(t: RawTensor, heads: int, name: str) -> RawTensor:
    """Undo llama.cpp's rotary reordering of q or k rows: within each of ``heads`` heads,
    GGUF row ``2 * i + h`` is Hugging Face row ``h * half + i`` (``h`` 0 or 1). Whole rows
    are copied; blocks are never de-quantized."""
    rows = t.shape[0]
    if rows % (2 * heads):
        raise UnsupportedGGUFError(f"tensor {name!r}: {rows} rows do not split into {heads} heads")
    order = torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)
    return RawTensor(t.data[order], t.fmt, t.shape)


def _type_name(kind: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(kind).name
    except (ImportError, ValueError):
        return f"GGML type {kind}"
