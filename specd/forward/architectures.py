"""Which models the lean forward (:class:`~specd.forward.fastpath.FastDecoder`) runs with the
same arithmetic as their own ``forward``: Llama-style decoders with SiLU MLPs and full
attention."""

from __future__ import annotations

from typing import Any

SUPPORTED = frozenset({"llama", "qwen2", "mistral"})


def supports(model: Any) -> bool:
    """Whether :class:`FastDecoder` can run ``model`` with the same arithmetic."""
    if not supports_config(model.config):
        return False
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    needed = ("embed_tokens", "rotary_emb", "layers", "norm")
    return (
        decoder is not None
        and all(hasattr(decoder, a) for a in needed)
        and model.get_output_embeddings() is not None
    )


def supports_config(cfg: Any) -> bool:
    """Whether a model of configuration ``cfg`` is one :class:`FastDecoder` runs: a
    supported architecture with SiLU MLPs without biases and full attention in every layer."""
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        if cfg.model_type == "mistral":
            return False
    layer_types = getattr(cfg, "layer_types", None)
    return not (layer_types and any(t != "full_attention" for t in layer_types))
