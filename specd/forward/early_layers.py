"""The first layers of a Hugging Face decoder over new tokens, then its final norm and LM
head: the early exit of a model the lean forward does not run (``Target.forward_early``)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch

from ..kvcache import KVCache
from .passes import tree_mask


def forward(model: Any, cache: KVCache, tokens: Sequence[int], layers: int) -> torch.Tensor:
    """Run ``model``'s first ``layers`` decoder layers over ``tokens`` (a chain on top of the
    cache), appending their keys and values to those layers of the cache.

    :returns: logits ``[T, V]`` of the final norm and LM head over the last layer's output.
    """
    embed, rotary, decoder_layers, norm = _decoder_parts(model)
    params = inspect.signature(decoder_layers[0].forward).parameters
    cache_kw = "past_key_values" if "past_key_values" in params else "cache"
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    past = cache.length
    n = len(tokens)
    ids = torch.tensor([list(tokens)], dtype=torch.long, device=device)  # [1, T]
    position_ids = torch.arange(past, past + n, device=device).unsqueeze(0)
    mask = None
    if n > 1:
        _, mask = tree_mask(list(range(-1, n - 1)), past, dtype, device)
    h = embed(ids)  # [1, T, H]
    pos_emb = rotary(h, position_ids=position_ids)
    for layer in decoder_layers[:layers]:
        h = layer(
            h,
            attention_mask=mask,
            position_ids=position_ids,
            position_embeddings=pos_emb,
            use_cache=True,
            **{cache_kw: cache.hf},
        )
        if isinstance(h, tuple):
            h = h[0]
    return model.get_output_embeddings()(norm(h))[0]


def _decoder_parts(model: Any) -> tuple:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    parts = tuple(
        getattr(decoder, a, None) for a in ("embed_tokens", "rotary_emb", "layers", "norm")
    )
    if decoder is None or any(p is None for p in parts):
        raise NotImplementedError(
            f"{type(model).__name__} does not expose embed_tokens/rotary_emb/layers/norm; "
            "early exit needs a Llama-style decoder"
        )
    return parts
