"""Tiny random models: ``--model tiny[:SEED]``, the targets of ``specd verify``, and the
``tiny:SEED`` draft models. Exact (float64), fast, and nothing to download; a tiny model's
text is random characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import BadInputError
from . import cpu_kernels
from .target import Target

#: The model name :func:`specd.models.load_target` reads as a tiny target: ``tiny`` or
#: ``tiny:SEED``.
NAME = "tiny"
#: Output-layer scale of a ``--model tiny`` target: peaky distributions, like a trained
#: model's, so drafts are sometimes accepted.
LOGIT_SCALE = 8.0


class CharTokenizer:
    """A tokenizer for tiny models: token i is the character ``chr(32 + i)``.

    ``eos_token_id`` is None unless given, so random models do not stop early.
    """

    def __init__(
        self, vocab_size: int, eos_token_id: int | None = None, bos_token_id: int | None = 0
    ) -> None:
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - 32 for c in text if 0 <= ord(c) - 32 < self.vocab_size]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(
            chr(32 + int(i)) for i in ids if not (skip_special_tokens and i == self.eos_token_id)
        )


def tiny_model(
    vocab_size: int = 96,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    logit_scale: float = 1.0,
):
    """A randomly initialised Llama-architecture causal LM.

    :param logit_scale: multiplies the output embedding; larger values make the model's
        distributions peakier (more like a trained model), smaller ones flatter.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model: Any = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model.to(dtype).eval()


def tiny_target(vocab_size: int = 96, *, eos_token_id: int | None = None, **kwargs) -> Target:
    """A :class:`Target` around :func:`tiny_model` with a :class:`CharTokenizer`."""
    model = tiny_model(vocab_size, **kwargs)
    return Target(model, CharTokenizer(vocab_size, eos_token_id=eos_token_id), name="tiny")


#: The hidden size of :func:`tiny_blocks_target`: 16-wide heads, a shape the step kernel takes.
BLOCKS_HIDDEN = 64


def tiny_blocks_target(
    vocab_size: int, weights: str, *, seed: int = 0, logit_scale: float = 1.0
) -> Target:
    """:func:`tiny_target`'s model with its matrices (the decoder's projections, the embedding
    and the LM head) stored as blocks of ``weights``' format (``bf16``, ``q8`` or ``q4``,
    :data:`specd.forward.weights.QUANTIZED`), quantized from their float32 values, as
    ``--weights`` quantizes a checkpoint on load; norms stay float32 and it computes in
    float32, on the lean forward (:class:`~specd.forward.lean_model.LeanCausalLM`), its
    passes through the step kernel over a cache of halves where the kernels run (as
    ``--kv-dtype auto`` serves a model). :data:`BLOCKS_HIDDEN` wide."""
    from . import lean_model
    from . import weights as stored

    if weights not in stored.QUANTIZED:
        raise BadInputError(
            f"a tiny model stored as blocks takes weights {', '.join(stored.QUANTIZED)}, "
            f"not {weights!r}"
        )
    name = f"{NAME}:{seed}"
    # 16-wide heads: a shape the step kernel takes, so its passes (the int8 products over
    # woven Q4 and Q8 blocks) are what the engine runs on it, as on a real model's blocks
    model = tiny_model(vocab_size, hidden_size=BLOCKS_HIDDEN, seed=seed, logit_scale=logit_scale)
    tensors = {k: v.to(torch.float32) for k, v in model.state_dict().items()}
    cfg = lean_model.LeanConfig(model.config.to_dict())
    lm = lean_model.LeanCausalLM(stored.quantize(tensors, weights, name), cfg, Path(name))
    # Its source is a name, not a directory: whatever a path of that name holds, a tiny model
    # stops at no token.
    lm.generation_config = lean_model.GenerationDefaults({})
    # Blocks run only on the lean forward, whatever SPECD_FASTPATH says.
    target = Target(lm.eval(), CharTokenizer(vocab_size), name=name, fast=True)
    if cpu_kernels.available():
        target.compile("on", backend="kernel")
    # its cache as a served model's: halves where the step kernel serves it
    target.kv_dtype = stored.choose_kv_dtype(target)
    return target


def is_tiny(model: str) -> bool:
    """Whether ``model`` names a tiny target (``tiny`` or ``tiny:SEED``)."""
    return model == NAME or model.startswith(NAME + ":")


def load_tiny(model: str, *, dtype: torch.dtype | None = None, device: str | None = None) -> Target:
    """What ``--model tiny[:SEED]`` loads: :func:`tiny_target` with the given seed (0 when
    none), its output scaled by :data:`LOGIT_SCALE`, in float64 unless ``dtype`` says
    otherwise."""
    _, _, seed_text = model.partition(":")
    try:
        seed = int(seed_text) if seed_text else 0
    except ValueError:
        raise BadInputError(
            f"model {model!r}: expected tiny or tiny:SEED with an integer seed"
        ) from None
    lm = tiny_model(seed=seed, logit_scale=LOGIT_SCALE, dtype=dtype or torch.float64)
    return Target(lm.to(device or "cpu"), CharTokenizer(lm.config.vocab_size), name=model)
