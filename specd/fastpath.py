"""A lean forward pass for Llama-style decoders.

Hugging Face's forward spends much of a one-token decode step in Python: module calls,
keyword plumbing, mask construction. This module runs the same arithmetic (RMSNorm in
float32, rotary embeddings from the model's own rotary module, grouped-query SDPA, SiLU
MLP) directly on the model's weight tensors and on the engine's KV cache, with a handful
of tensor operations per layer. It is used for the architectures listed in
``SUPPORTED``; every other model runs through its own ``forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .kvcache import KVCache

SUPPORTED = frozenset({"llama", "qwen2", "mistral"})


@dataclass
class _Layer:
    ln1: torch.Tensor
    ln2: torch.Tensor
    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    wg: torch.Tensor
    wu: torch.Tensor
    wd: torch.Tensor


def supports(model: Any) -> bool:
    """Whether :class:`FastDecoder` can run ``model`` with the same arithmetic."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "mlp_bias", False):
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        if cfg.model_type == "mistral":
            return False
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return False
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    needed = ("embed_tokens", "rotary_emb", "layers", "norm")
    return (
        decoder is not None
        and all(hasattr(decoder, a) for a in needed)
        and model.get_output_embeddings() is not None
    )


class FastDecoder:
    """Runs a supported model over new tokens on top of a :class:`KVCache`."""

    def __init__(self, model: Any) -> None:
        decoder = model.get_decoder()
        cfg = model.config
        self.rotary = decoder.rotary_emb
        self.embed = decoder.embed_tokens.weight
        self.norm = decoder.norm.weight
        self.eps = float(decoder.norm.variance_epsilon)
        self.lm_head = model.get_output_embeddings().weight
        self.lm_head_bias = getattr(model.get_output_embeddings(), "bias", None)
        first = decoder.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.scaling = float(first.scaling)
        # The model's own parameters are used as they are (no copies: weights loaded from
        # safetensors stay memory-mapped, and resident memory holds them once).
        self.layers = []
        for block in decoder.layers:
            a, m = block.self_attn, block.mlp
            self.layers.append(
                _Layer(
                    ln1=block.input_layernorm.weight,
                    ln2=block.post_attention_layernorm.weight,
                    wq=a.q_proj.weight,
                    bq=a.q_proj.bias,
                    wk=a.k_proj.weight,
                    bk=a.k_proj.bias,
                    wv=a.v_proj.weight,
                    bv=a.v_proj.bias,
                    wo=a.o_proj.weight,
                    bo=a.o_proj.bias,
                    wg=m.gate_proj.weight,
                    wu=m.up_proj.weight,
                    wd=m.down_proj.weight,
                )
            )
        # Which matrix product streams weights fastest depends on device and dtype.
        self._weight_major = self.embed.device.type == "cpu" and self.embed.dtype == torch.float32

    def _linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ w.T + b`` for ``x`` of shape ``[..., K]``.

        On CPU in float32, a product with a handful of rows is much faster computed as
        ``w @ x.T`` (MKL streams the weight at ~29 GB/s instead of ~6-10 GB/s with
        ``F.linear``), with one row padded to two.
        """
        if not self._weight_major:
            return F.linear(x, w, b)
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n > 16:
            return F.linear(x, w, b)
        if n == 1:
            rows = torch.cat([rows, rows])
        y = (w @ rows.T).T[:n]  # [n, N]
        if b is not None:
            y = y + b
        return y.reshape(*lead, w.shape[0])

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * x.to(dtype)

    def forward(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        keep: int = 0,
        layers: int | None = None,
        hidden: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:param ids: ``[1, T]`` token ids. :param position_ids: ``[1, T]``.
        :param mask: additive ``[1, 1, T, past + T]`` mask, or None for causal order.
        :param keep: logits for the last ``keep`` positions only (0: all).
        :param layers: stop after this many decoder layers (early exit).
        :returns: logits ``[T', V]`` and, when asked, the last hidden states ``[T, H]`` after
        the final norm."""
        t = ids.shape[1]
        h = F.embedding(ids, self.embed)  # [1, T, H]
        cos, sin = self.rotary(h, position_ids)  # [1, T, D]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        half = self.head_dim // 2
        past = cache.length
        n_rep = self.n_heads // self.n_kv
        causal_from_zero = mask is None and t > 1 and past == 0
        if mask is None and t > 1 and past > 0:
            causal = torch.ones(t, past + t, dtype=torch.bool, device=h.device).tril_(past)
            mask = causal[None, None]
        if mask is not None and n_rep > 1:
            # Grouped-query attention runs on the key/value heads: the n_rep query heads
            # of a group become n_rep * T query rows (much faster than repeating keys and
            # values, notably in bfloat16 on CPU), so the mask is tiled to match.
            mask = mask.repeat(1, 1, n_rep, 1)
        for i, L in enumerate(self.layers[:layers]):
            x = self._rms(h, L.ln1)
            q = self._linear(x, L.wq, L.bq)
            k = self._linear(x, L.wk, L.bk)
            v = self._linear(x, L.wv, L.bv)
            q = q.view(1, t, self.n_heads, self.head_dim).transpose(1, 2)
            k = k.view(1, t, self.n_kv, self.head_dim).transpose(1, 2)
            v = v.view(1, t, self.n_kv, self.head_dim).transpose(1, 2)
            # rotary: x * cos + rotate_half(x) * sin
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
            keys, values = cache.layer(i).update(k, v)  # [1, KV, S, D]
            if causal_from_zero:
                o = F.scaled_dot_product_attention(
                    q, keys, values, is_causal=True, scale=self.scaling, enable_gqa=n_rep > 1
                )
            else:
                packed = q.reshape(1, self.n_kv, n_rep * t, self.head_dim)  # [1, KV, R*T, D]
                o = F.scaled_dot_product_attention(
                    packed, keys, values, attn_mask=mask, scale=self.scaling
                )
                o = o.view(1, self.n_heads, t, self.head_dim)
            o = o.transpose(1, 2).reshape(1, t, self.n_heads * self.head_dim)
            h = h + self._linear(o, L.wo, L.bo)
            x = self._rms(h, L.ln2)
            h = h + self._linear(F.silu(self._linear(x, L.wg)) * self._linear(x, L.wu), L.wd)
        normed = self._rms(h, self.norm)  # [1, T, H]: what the LM head reads
        out = normed[:, -keep:] if keep else normed
        return self._lm_head(out[0]), (normed[0] if hidden else None)

    def _lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[T, V]`` from final hidden states ``[T, H]``."""
        return self._linear(x, self.lm_head, self.lm_head_bias)
