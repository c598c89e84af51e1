"""Llama-style checkpoints loaded without transformers.

Importing transformers and building its model costs seconds at every start; the lean forward
(:mod:`.fastpath`) needs only the weights. Where it serves a model (see
:func:`~specd.forward.architectures.supports_config`) and the weights are safetensors,
:func:`load` reads ``config.json``, memory-maps the weights and wraps them in
:class:`LeanCausalLM`: the module tree of a Hugging Face Llama model (the same parameter
names, the same ``get_decoder()`` parts), holding the weights and no forward of its own.
Its matrices may be blocks instead (``--weights``, :mod:`.weights`): a GGUF file's as
stored, or quantized on load. Whatever needs a real transformers model (``generate`` in the
bench's baselines) gets one sharing these weights from :func:`transformers_model` (float32
copies of the blocks: their state dict holds their values).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import BadInputError, ModelNotFoundError
from . import architectures
from . import weights as stored

log = logging.getLogger(__name__)

#: config.json keys without which the model's shape is unknown (transformers would fill in
#: its own per-architecture defaults, which this module does not repeat).
REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "rms_norm_eps",
)
#: Defaults transformers applies alike to every architecture in ``architectures.SUPPORTED``.
DEFAULTS = {"tie_word_embeddings": False, "hidden_act": "silu", "mlp_bias": False}


class LeanConfig:
    """A model's ``config.json`` with attribute access, like a transformers config: a key
    that is not there is an ``AttributeError`` (so ``getattr(cfg, key, None)`` is None)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:  # only for keys the file does not have
        raise AttributeError(name)

    def get_text_config(self, decoder: bool = False) -> LeanConfig:
        return self

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class GenerationDefaults:
    """``generation_config.json``: the token ids a model stops at (``eos_token_id``)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.eos_token_id = values.get("eos_token_id")
        self.bos_token_id = values.get("bos_token_id")
        self.pad_token_id = values.get("pad_token_id")


class _Weighted(nn.Module):
    """A module whose ``weight`` may be blocks: its state dict holds their float32 values, so
    whatever reads a model's tensors by name (a weights hash) sees the same matrices as from
    the float copy."""

    weight: Any

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        if not isinstance(self.weight, torch.Tensor):
            destination[prefix + "weight"] = self.weight.dequantize()
        super()._save_to_state_dict(destination, prefix, keep_vars)


class Linear(_Weighted):
    """``x @ weight.T + bias``; ``weight`` a parameter, or a block weight
    (:class:`~specd.forward.blocks.BlockWeight`: a plain attribute, which ``F.linear``
    dispatches to)."""

    def __init__(self, weight: Any, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = _param(weight)
        self.bias = None if bias is None else _param(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(_Weighted):
    def __init__(self, weight: Any) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    """Llama's RMSNorm: normalised in float32, scaled in the input's dtype."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = _param(weight)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Default rotary embeddings, computed as transformers' Llama computes them."""

    inv_freq: torch.Tensor

    def __init__(self, theta: float, head_dim: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        """cos and sin ``[B, T, D]`` in ``x``'s dtype for ``position_ids`` ``[B, T]``."""
        inv_freq = self.inv_freq.to(device=x.device, dtype=torch.float)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Attention(nn.Module):
    def __init__(self, w: dict[str, Any], head_dim: int) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, Linear(w[name + ".weight"], w.get(name + ".bias")))
        self.head_dim = head_dim
        self.scaling = head_dim**-0.5


class MLP(nn.Module):
    def __init__(self, w: dict[str, Any]) -> None:
        super().__init__()
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, name, Linear(w[name + ".weight"], None))


class DecoderLayer(nn.Module):
    def __init__(self, w: dict[str, Any], head_dim: int, eps: float) -> None:
        super().__init__()
        self.self_attn = Attention(_under(w, "self_attn."), head_dim)
        self.mlp = MLP(_under(w, "mlp."))
        self.input_layernorm = RMSNorm(w["input_layernorm.weight"], eps)
        self.post_attention_layernorm = RMSNorm(w["post_attention_layernorm.weight"], eps)


class Decoder(nn.Module):
    def __init__(self, w: dict[str, Any], cfg: LeanConfig, embed: Any) -> None:
        super().__init__()
        eps = float(cfg.rms_norm_eps)
        self.embed_tokens = Embedding(embed)
        self.rotary_emb = RotaryEmbedding(_rope_theta(cfg), int(cfg.head_dim))
        self.layers = nn.ModuleList(
            DecoderLayer(_under(w, f"layers.{i}."), int(cfg.head_dim), eps)
            for i in range(int(cfg.num_hidden_layers))
        )
        self.norm = RMSNorm(w["norm.weight"], eps)


class LeanCausalLM(nn.Module):
    """A Llama-style causal LM's weights under transformers' names and module tree, for
    :class:`~specd.forward.fastpath.FastDecoder`; it runs no forward of its own."""

    def __init__(self, w: dict[str, Any], cfg: LeanConfig, source: Path) -> None:
        super().__init__()
        self.config = cfg
        self.source = source
        embed = _param(w["model.embed_tokens.weight"])
        self.model = Decoder(_under(w, "model."), cfg, embed)
        # Tied: the LM head is the embedding's own parameter, as in transformers.
        self.lm_head = Linear(embed if cfg.tie_word_embeddings else w["lm_head.weight"], None)
        gen = source / "generation_config.json"
        self.generation_config = GenerationDefaults(_read_json(gen) if gen.is_file() else {})

    def get_decoder(self) -> Decoder:
        return self.model

    @property
    def weight_format(self) -> str:
        """How the matrices are stored (:func:`.weights.format_of`): ``f32``, ``q8_0``,
        ``q4_1+q8_0``, ..."""
        return stored.format_of(self)

    @property
    def weight_bytes(self) -> int:
        """Bytes stored by all weights, blocks as stored, tied weights once: what a step
        reads of them."""
        return stored.total_bytes(self, self.block_weights())

    def block_weights(self) -> list[Any]:
        """The matrices stored as blocks (no parameters of this module), each once."""
        return [w for w in stored.matrices(self) if not isinstance(w, torch.Tensor)]

    def get_input_embeddings(self) -> Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> Linear:
        return self.lm_head


def load(
    where: Path,
    dtype: torch.dtype,
    *,
    weights: str = "f32",
    gguf: Path | None = None,
) -> LeanCausalLM | None:
    """The model in ``where`` as a :class:`LeanCausalLM` on the CPU, or None (with the reason
    logged) when the lean forward does not serve it or its weights are not safetensors.

    :param weights: how to store the matrices (:mod:`.weights`): ``f32`` (float tensors in
        ``dtype``), ``bf16``/``q8``/``q4`` (quantized on load) or ``native`` (``gguf``'s
        blocks as stored); anything but ``f32`` needs the lean forward, and a model it does
        not serve is then a BadInputError.
    :param gguf: read the tensors from this GGUF file instead of ``where``'s safetensors
        (``where`` still gives the configuration and the generation defaults).
    """
    cfg = read_config(where)
    why = unsupported(cfg, where, gguf=gguf is not None)
    if why:
        if weights != "f32":
            raise BadInputError(
                f"--weights {weights} needs specd's lean forward, which does not run {where}: "
                f"{why}; use --weights f32"
            )
        log.debug("loading %s with transformers: %s", where, why)
        return None
    tensors = stored.read_gguf(gguf, cfg, where) if gguf is not None else _read_safetensors(where)
    expected = expected_names(cfg, tensors)
    if set(tensors) != expected:
        extra = sorted(set(tensors) - expected)[:3]
        missing = sorted(expected - set(tensors))[:3]
        if gguf is not None or weights != "f32":
            raise ModelNotFoundError(
                f"{gguf or where} does not hold the tensors its config.json describes: "
                f"names {extra} unexpected, {missing} missing"
            )
        log.debug(
            "loading %s with transformers: names %s unexpected, %s missing", where, extra, missing
        )
        return None
    if weights in stored.QUANTIZED:
        tensors = stored.quantize(tensors, weights, str(where))
    converted: dict[int, torch.Tensor] = {}
    for key, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.dtype != dtype:
            tensors[key] = converted.setdefault(t.data_ptr(), t.to(dtype))
    return LeanCausalLM(tensors, cfg, where).eval()


def _read_safetensors(where: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(where):
        with safe_open(str(file), framework="pt") as f:  # memory-mapped
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def read_config(where: Path) -> LeanConfig:
    """``config.json`` with the defaults transformers gives every supported architecture."""
    values = _read_json(where / "config.json")
    if not isinstance(values, dict):
        raise ModelNotFoundError(f"{where / 'config.json'} does not hold a JSON object")
    values = {**DEFAULTS, **values}
    heads = values.get("num_attention_heads")
    if isinstance(heads, int) and isinstance(values.get("hidden_size"), int):
        values["num_key_value_heads"] = values.get("num_key_value_heads") or heads
        values["head_dim"] = values.get("head_dim") or values["hidden_size"] // heads
    return LeanConfig(values)


def unsupported(cfg: LeanConfig, where: Path, *, gguf: bool = False) -> str:
    """Why :func:`load` leaves the model in ``where`` to transformers ("" when it does not);
    with ``gguf`` its tensors come from a GGUF file, not ``where``'s safetensors."""
    missing = [k for k in REQUIRED if getattr(cfg, k, None) is None]
    if missing:
        return f"config.json lacks {', '.join(missing)}"
    if getattr(cfg, "auto_map", None):
        return "the checkpoint ships its own model code (auto_map)"
    if not architectures.supports_config(cfg):
        return f"the lean forward does not run {getattr(cfg, 'model_type', '?')!r} as configured"
    if cfg.model_type == "mistral" and "sliding_window" not in cfg.__dict__:
        return "no sliding_window in config.json (transformers' default windows attention)"
    if cfg.model_type == "qwen2" and getattr(cfg, "use_sliding_window", False):
        return "sliding-window attention"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "?"
    if kind != "default" or getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        return f"rotary embeddings of type {kind!r}"
    if not gguf and not weight_files(where):
        return "no safetensors weights"
    return ""


def weight_files(where: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards its index names, or the one file."""
    index = where / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        return [where / s for s in shards]
    single = where / "model.safetensors"
    return [single] if single.is_file() else []


def expected_names(cfg: LeanConfig, present: dict[str, Any]) -> set[str]:
    """The tensor names a checkpoint of ``cfg`` holds (biases where ``present`` has them)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(int(cfg.num_hidden_layers)):
        p = f"model.layers.{i}."
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            names.add(f"{p}self_attn.{proj}.weight")
            if f"{p}self_attn.{proj}.bias" in present:
                names.add(f"{p}self_attn.{proj}.bias")
        names |= {f"{p}mlp.{proj}.weight" for proj in ("gate_proj", "up_proj", "down_proj")}
    return names


def transformers_model(model: Any) -> Any:
    """``model`` as a transformers model: itself when it is one, else a transformers model of
    the same checkpoint sharing a :class:`LeanCausalLM`'s weights (built once, on first use;
    weights stored as blocks are float32 copies of their values)."""
    if not isinstance(model, LeanCausalLM):
        return model
    built = model.__dict__.get("_transformers")
    if built is not None:
        return built
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    dtype = model.lm_head.weight.dtype
    config = AutoConfig.from_pretrained(model.source, local_files_only=True)
    with torch.device("meta"):
        hf: Any = AutoModelForCausalLM.from_config(config, dtype=dtype)
    hf.load_state_dict(model.state_dict(), strict=False, assign=True)
    if config.tie_word_embeddings:
        hf.get_output_embeddings().weight = hf.get_input_embeddings().weight
    inv_freq: torch.Tensor = model.model.rotary_emb.inv_freq
    for name, buf in list(hf.named_buffers()):
        owner, _, attr = name.rpartition(".")
        if not buf.is_meta:
            continue
        if not attr.endswith("inv_freq"):
            raise RuntimeError(f"{name} of {type(hf).__name__} has no value from the checkpoint")
        hf.get_submodule(owner).register_buffer(attr, inv_freq.clone(), persistent=False)
    meta = [n for n, p in hf.named_parameters() if p.is_meta]
    if meta:
        raise RuntimeError(f"{', '.join(meta[:3])} missing from {model.source}")
    if (model.source / "generation_config.json").is_file():
        hf.generation_config = GenerationConfig.from_pretrained(model.source)
    model.__dict__["_transformers"] = hf.eval()
    return hf


def _param(t: Any) -> Any:
    """A tensor as a frozen parameter; a parameter or a block weight as it is."""
    if isinstance(t, nn.Parameter) or not isinstance(t, torch.Tensor):
        return t
    return nn.Parameter(t, requires_grad=False)


def _under(w: dict[str, Any], prefix: str) -> dict[str, Any]:
    return {k[len(prefix) :]: v for k, v in w.items() if k.startswith(prefix)}


def _rope_theta(cfg: LeanConfig) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(cfg, "rope_theta", None) or 10000.0)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"cannot read {path}: {e}") from e
