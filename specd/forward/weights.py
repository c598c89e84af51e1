"""How a model's weights are stored: ``--weights auto|f32|bf16|q8|q4|native``.

A model's matrices (the decoder's q, k, v, o, gate, up and down projections, the token
embedding and the LM head) are kept either as float tensors or as blocks
(:class:`~specd.forward.blocks.BlockWeight`, GGUF's layout: a step reads those bytes and
de-quantizes as it multiplies). Norms and biases always stay float32 tensors.

- ``native``: a GGUF model's blocks as the file stores them (the default model: Q4_1
  matrices, a Q8_0 embedding tied to the LM head).
- ``f32``: float weights (a GGUF model's de-quantized copy), in ``--dtype``.
- ``bf16``, ``q8``, ``q4``: float weights quantized on load, weight-only, in groups of 32
  values (``blocks.quantize`` to ``bf16``, ``q8_0``, ``q4_1``).
- ``auto`` (the default): ``native`` for a GGUF model where the lean forward runs it, else
  ``f32``.

Blocks compute in float32 and only on the lean forward (the CPU, a Llama-style model).
``--kv-dtype auto|float16|float32`` says how the KV cache stores keys and values
(:func:`choose_kv_dtype`). Nothing here imports torch until a model loads, so the command
line's help stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BadInputError, ModelNotFoundError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

#: ``--weights`` values, the default first.
CHOICES = ("auto", "f32", "bf16", "q8", "q4", "native")
#: ``--kv-dtype`` choices: what the KV cache stores (:func:`choose_kv_dtype`).
KV_DTYPES = ("auto", "float16", "float32")
#: The block format each quantizing choice stores (:data:`specd.forward.blocks.FORMATS`).
QUANTIZED = {"bf16": "bf16", "q8": "q8_0", "q4": "q4_1"}
#: The matrices of one decoder layer stored as blocks (biases and norms are not).
LAYER_MATRICES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
#: Short names of float tensor dtypes, as :func:`format_of` names them (bfloat16 tensors
#: hold the same bytes as ``bf16`` blocks).
DENSE = {
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
}


def check(choice: str) -> str:
    """``choice`` when it is a ``--weights`` value; BadInputError listing them otherwise."""
    if choice not in CHOICES:
        raise BadInputError(f"unknown --weights {choice!r}; choose one of {', '.join(CHOICES)}")
    return choice


def is_matrix(name: str) -> bool:
    """Whether the tensor ``name`` (Hugging Face naming) is one that may be stored as blocks."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return True
    prefix, _, rest = name.partition(".layers.")
    if prefix != "model" or not rest.endswith(".weight"):
        return False
    _, _, proj = rest.removesuffix(".weight").partition(".")
    return proj in LAYER_MATRICES


def quantize(tensors: dict[str, Any], choice: str, model: str) -> dict[str, Any]:
    """``tensors`` with every matrix (:func:`is_matrix`) quantized to ``choice``'s format
    (:data:`QUANTIZED`) from its float32 values; a tensor seen twice (tied) stays one object.

    :param model: the model's name, for the message when a matrix cannot be quantized."""
    import torch

    from . import blocks

    fmt = QUANTIZED[choice]
    done: dict[int, Any] = {}
    out = dict(tensors)
    for name, t in tensors.items():
        if not is_matrix(name) or not isinstance(t, torch.Tensor):
            continue
        if t.data_ptr() not in done:
            try:
                done[t.data_ptr()] = blocks.quantize(t.detach().to(torch.float32), fmt)
            except ValueError as e:
                raise BadInputError(
                    f"--weights {choice}: cannot store {name} of {model} (shape "
                    f"{tuple(t.shape)}) as {fmt} blocks: {e}; use --weights f32"
                ) from e
        out[name] = done[t.data_ptr()]
    return out


def read_gguf(path: Path, cfg: Any, where: Path) -> dict[str, Any]:
    """The tensors of the GGUF file ``path`` (blocks as stored, :func:`blocks.read_gguf`),
    checked against the head counts of ``cfg``, read from ``where``, its converted copy."""
    from . import blocks

    tensors, meta = blocks.read_gguf(path)
    for key, ours in (
        ("head_count", cfg.num_attention_heads),
        ("head_count_kv", cfg.num_key_value_heads),
    ):
        theirs = meta.get(key)
        if theirs is not None and int(theirs) != int(ours):
            raise ModelNotFoundError(
                f"{path} has {key} {theirs} but its converted config.json says {ours}; "
                f"delete the converted copy in {where} to convert it again"
            )
    return tensors


def check_serving(model: Any, prefill: torch.dtype | None, packed: str) -> None:
    """Refuse, with block weights, what runs on float copies of the weights: a prefill dtype
    other than float32 and ``--packed-weights on`` (a BadInputError naming the combination;
    ``auto`` packs nothing where the weights are blocks)."""
    import torch

    blocks = getattr(model, "block_weights", None)
    if blocks is None or not blocks():
        return
    fmt = model.weight_format
    if prefill is not None and prefill != torch.float32:
        name = str(prefill).removeprefix("torch.")
        raise BadInputError(
            f"--prefill-dtype {name} runs the prefill on {name} copies of float weights, and "
            f"this model's are {fmt} blocks (--weights); leave --prefill-dtype unset or load "
            "it with --weights f32"
        )
    if packed == "on":
        raise BadInputError(
            f"--packed-weights on keeps a float copy of the weights, and this model's are "
            f"{fmt} blocks (--weights); leave --packed-weights off or load it with --weights f32"
        )


def matrices(model: Any) -> list[Any]:
    """The weights of ``model``'s matrices (:func:`is_matrix`), each object once: a tied
    embedding and LM head are one."""
    decoder = model.get_decoder()
    found = [decoder.embed_tokens.weight, model.get_output_embeddings().weight]
    for layer in decoder.layers:
        found += [layer.get_submodule(name).weight for name in LAYER_MATRICES]
    seen: set[int] = set()
    out = []
    for w in found:
        if id(w) not in seen:
            seen.add(id(w))
            out.append(w)
    return out


def format_of(model: Any) -> str:
    """How ``model``'s matrices are stored: the formats present, the one holding the most
    bytes first, joined by ``+`` (``q4_1+q8_0`` for the default model as stored, ``q8_0``,
    ``f32`` for float32 tensors; ``f16``, ``bf16``, ``f64`` for the others)."""
    sizes: dict[str, int] = {}
    for w in _weights(model):
        name = _format(w)
        sizes[name] = sizes.get(name, 0) + nbytes(w)
    return "+".join(sorted(sizes, key=lambda k: -sizes[k]))


def nbytes(w: Any) -> int:
    """The bytes ``w`` stores: a block weight's blocks, a tensor's elements."""
    from . import blocks

    if isinstance(w, blocks.BlockWeight):
        return int(w.nbytes)
    return int(w.numel() * w.element_size())


def total_bytes(model: torch.nn.Module, extra: list[Any]) -> int:
    """Bytes stored by ``model``'s parameters and by ``extra`` (block weights, which are no
    parameters), each storage counted once."""
    seen: set[int] = set()
    total = 0
    for w in [*model.parameters(), *extra]:
        if w.data_ptr() not in seen:
            seen.add(w.data_ptr())
            total += nbytes(w)
    return total


def _weights(model: Any) -> list[Any]:
    try:
        return matrices(model)
    except AttributeError:  # a model without a Llama-style decoder: all its parameters
        return list(model.parameters())


def _format(w: Any) -> str:
    fmt = getattr(w, "fmt", None)
    return fmt.name if fmt is not None else DENSE.get(str(w.dtype), str(w.dtype))


def choose_kv_dtype(target: Any, mode: str = "auto") -> torch.dtype:
    """What ``target``'s caches store keys and values as.

    ``float16`` halves the bytes a step reads of the cache (45 MiB at 1k positions for the
    default model in float32) and its memory; each key and value is rounded to the nearest
    half once, when the cache takes it, and every pass attends to the rounded values, so plain
    decoding and speculation stay token-identical to each other. ``auto`` is ``float16`` where
    specd's step kernel serves a float32 model on the CPU, the model's dtype elsewhere.

    :raises BadInputError: ``float16`` or ``float32`` where they cannot serve (another device,
        another model dtype, a compiled step other than the kernel), naming why.
    """
    import torch

    step = target.compiled.backend if target.compiled is not None else "eager"
    cpu32 = target.device.type == "cpu" and target.dtype == torch.float32
    if mode == "auto":
        return torch.float16 if cpu32 and step == "kernel" else target.dtype
    if mode == "float32":
        if target.dtype != torch.float32:
            raise BadInputError(
                f"--kv-dtype float32 needs a float32 model; this one runs in {target.dtype} "
                "(leave --kv-dtype auto, or load it with --dtype float32)"
            )
        return torch.float32
    if not cpu32 or step not in ("kernel", "eager"):
        raise BadInputError(
            f"--kv-dtype float16 is for a float32 model on the CPU served by specd's step kernel "
            f"or eager passes; this one runs in {target.dtype} on {target.device} with the "
            f"{step} step (leave --kv-dtype auto)"
        )
    return torch.float16
