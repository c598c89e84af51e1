"""A lean forward pass for Llama-style decoders.

Hugging Face's forward spends much of a one-token decode step in Python: module calls,
keyword plumbing, mask construction. This module runs the same arithmetic (RMSNorm in
float32, rotary embeddings from the model's own rotary module, grouped-query SDPA, SiLU
MLP) directly on the model's weight tensors and on the engine's KV cache, with a handful
of tensor operations per layer. It is used for the architectures
:mod:`.architectures` lists; every other model runs through its own ``forward``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..kvcache import KVCache
from . import cpu_kernels, products
from .blocks import BlockWeight
from .weight_products import WeightProducts

log = logging.getLogger(__name__)


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


class FastDecoder(WeightProducts):
    """Runs a supported model over new tokens on top of a :class:`KVCache`."""

    def __init__(self, model: Any, dtype: torch.dtype | None = None) -> None:
        """:param dtype: run in this dtype, on copies of the weights (default: the model's
        own weights, as they are)."""
        decoder = model.get_decoder()
        cfg = model.config
        copies: dict[int, torch.Tensor] = {}

        def w(t: torch.Tensor | BlockWeight | None) -> Any:
            if t is None or dtype is None or t.dtype == dtype:
                return t
            if isinstance(t, BlockWeight):
                raise ValueError(
                    f"a model stored as {t.fmt.name} blocks runs in float32; it cannot run "
                    f"in {dtype}"
                )
            if t.data_ptr() not in copies:  # tied weights: one copy
                copies[t.data_ptr()] = t.detach().to(dtype)
            return copies[t.data_ptr()]

        self.rotary = decoder.rotary_emb
        self._cos_rows = self._sin_rows = torch.empty(0, 0)  # rotary_rows' tables
        self.embed = w(decoder.embed_tokens.weight)
        self.norm = w(decoder.norm.weight)
        self.eps = float(decoder.norm.variance_epsilon)
        self.lm_head = w(model.get_output_embeddings().weight)
        self.lm_head_bias = w(getattr(model.get_output_embeddings(), "bias", None))
        first = decoder.layers[0].self_attn
        self.head_dim = int(first.head_dim)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.scaling = float(first.scaling)
        # Without a dtype, the model's own parameters are used as they are (no copies:
        # weights loaded from safetensors stay memory-mapped, and resident memory holds
        # them once).
        self.layers = []
        for block in decoder.layers:
            a, m = block.self_attn, block.mlp
            self.layers.append(
                _Layer(
                    ln1=w(block.input_layernorm.weight),
                    ln2=w(block.post_attention_layernorm.weight),
                    wq=w(a.q_proj.weight),
                    bq=w(a.q_proj.bias),
                    wk=w(a.k_proj.weight),
                    bk=w(a.k_proj.bias),
                    wv=w(a.v_proj.weight),
                    bv=w(a.v_proj.bias),
                    wo=w(a.o_proj.weight),
                    bo=w(a.o_proj.bias),
                    wg=w(m.gate_proj.weight),
                    wu=w(m.up_proj.weight),
                    wd=w(m.down_proj.weight),
                )
            )
        #: Whether weights are stored as blocks (:mod:`.blocks`): the step kernel reads them
        #: as they are; any other product de-quantizes the weight it multiplies.
        self.quantized = any(
            isinstance(m, BlockWeight)
            for m in [self.embed, self.lm_head, *(x for L in self.layers for x in vars(L).values())]
        )
        self._init_products()

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ops = cpu_kernels.row_ops(x.numel() // x.shape[-1], x.dtype, x.device)  # rows
        out = ops.rmsnorm(x, w, self.eps) if ops is not None else None
        if out is not None:
            return out
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
        logits: bool = True,
        hidden_rows: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:param ids: ``[1, T]`` token ids. :param position_ids: ``[1, T]``.
        :param mask: additive ``[1, 1, T, past + T]`` mask, or None for causal order.
        :param keep: logits for the last ``keep`` positions only (0: all).
        :param layers: stop after this many decoder layers (early exit).
        :param logits: False: only fill the cache (a prefill whose output nobody reads); the
            last layer then computes its keys and values and nothing after them.
        :param hidden_rows: with ``hidden`` and without ``logits``, in causal order: the
            hidden states of the last this many tokens only. The last layer writes every
            token's keys and values and runs its attention and MLP for those rows alone.
        :returns: logits ``[T', V]`` (``[0, V]`` without ``logits``) and, when asked, the last
        hidden states ``[T, H]`` after the final norm (``[hidden_rows, H]`` when fewer)."""
        t = ids.shape[1]
        chain = mask is None
        tail = hidden_rows or 0
        tail = tail if hidden and not logits and chain and 0 < tail < t else 0
        h = F.embedding(ids, self.embed)  # [1, T, H]
        cos, sin = self.rotary_tables(h, position_ids)
        past = cache.length
        n_rep = self.n_heads // self.n_kv
        # Prefills whose cached prefix every new token sees run the CPU attention kernel
        # where it loads (specd.cpu_kernels).
        kernel = cpu_kernels.supports(t, h.dtype, h.device, self.head_dim)
        tree = None
        if kernel and mask is not None:
            kernel = past == 0 or not bool(mask[0, 0, :, :past].any())
            tree = mask[0, 0, :, past:] == 0
        causal_from_zero = mask is None and t > 1 and past == 0
        if mask is None and t > 1 and past > 0 and not kernel:
            # Additive, in the activations' dtype, built once per pass: a boolean mask would
            # be converted by every layer's attention call.
            blocked = torch.ones(t, past + t, dtype=torch.bool, device=h.device).triu_(past + 1)
            mask = torch.zeros(t, past + t, dtype=h.dtype, device=h.device)
            mask = mask.masked_fill_(blocked, torch.finfo(h.dtype).min)[None, None]
        if mask is not None and not kernel:
            mask = self.pack_mask(mask)
        run = self.layers[:layers]
        cache_only = not logits and not hidden
        for i, L in enumerate(run):
            q, k, v = self.qkv(L, h, cos, sin)
            keys, values = cache.layer(i).update(k, v)  # [1, KV, S, D]
            if cache_only and i == len(run) - 1:
                return h.new_empty(0, self.lm_head.shape[0]), None
            if tail and i == len(run) - 1:
                # the last tokens' rows of the last layer: each sees every earlier position
                q = q[:, :, -tail:]
                if cpu_kernels.supports(tail, h.dtype, h.device, self.head_dim):
                    o = cpu_kernels.attention(
                        q, keys.to(q.dtype), values.to(q.dtype), self.scaling, None
                    )
                else:
                    s = keys.shape[2]
                    blocked = torch.ones(tail, s, dtype=torch.bool, device=h.device)
                    rows = torch.zeros(tail, s, dtype=h.dtype, device=h.device)
                    rows = rows.masked_fill_(blocked.triu_(s - tail + 1), torch.finfo(h.dtype).min)
                    o = self.attend(q, keys, values, self.pack_mask(rows[None, None]))
                h = self.mlp(L, h[:, -tail:], o)
                break
            if kernel:
                k32, v32 = keys.to(q.dtype), values.to(q.dtype)
                o = cpu_kernels.attention(q, k32, v32, self.scaling, tree)
            elif causal_from_zero:
                o = F.scaled_dot_product_attention(
                    q,
                    keys.to(q.dtype),
                    values.to(q.dtype),
                    is_causal=True,
                    scale=self.scaling,
                    enable_gqa=n_rep > 1,
                )
            else:
                o = self.attend(q, keys, values, mask)
            h = self.mlp(L, h, o)
        normed = self._rms(h, self.norm)  # [1, T, H]: what the LM head reads
        out = normed[:, -keep:] if keep else normed
        return self._lm_head(out[0]), (normed[0] if hidden else None)

    # One decoder layer, in the parts a compiled step (specd.compiled) shares: the cache
    # write between qkv and attend is the caller's.

    def qkv(
        self, L: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[1, heads, T, D]``, keys and values ``[1, KV, T, D]`` of ``h`` ``[1, T, H]``,
        rotated by ``cos``/``sin`` ``[1, 1, T, D]``."""
        t = h.shape[1]
        half = self.head_dim // 2
        x = self._rms(h, L.ln1)
        q2, k2 = self._linear(x, L.wq, L.bq), self._linear(x, L.wk, L.bk)  # [1, T, heads * D]
        v = self._linear(x, L.wv, L.bv).view(1, t, self.n_kv, self.head_dim).transpose(1, 2)
        ops = cpu_kernels.row_ops(t, h.dtype, h.device)
        rotated = False
        if ops is not None:  # a pass of many tokens: each rotated in one pass over it
            qr, kr = ops.rotary(q2, cos, sin, self.n_heads), ops.rotary(k2, cos, sin, self.n_kv)
            if qr is not None and kr is not None:
                q2, k2, rotated = qr, kr, True
        q = q2.view(1, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k2.view(1, t, self.n_kv, self.head_dim).transpose(1, 2)
        if not rotated:  # rotary: x * cos + rotate_half(x) * sin
            q = q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin
            k = k * cos + torch.cat((-k[..., half:], k[..., :half]), dim=-1) * sin
        return q, k, v

    def pack_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A mask ``[1, 1, T, S]`` for :meth:`attend`'s packed rows: ``[1, 1, R*T, S]``."""
        n_rep = self.n_heads // self.n_kv
        return mask.repeat(1, 1, n_rep, 1) if n_rep > 1 else mask

    def attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention of ``q`` ``[1, heads, T, D]`` over ``keys``/``values`` ``[1, KV, S, D]``
        with a packed additive ``mask`` (:meth:`pack_mask`; None: every row sees every key).

        Grouped-query attention runs on the key/value heads: the n_rep query heads of a
        group become n_rep * T query rows (much faster than repeating keys and values,
        notably in bfloat16 on CPU).
        :returns: ``[1, heads, T, D]``."""
        t = q.shape[2]
        n_rep = self.n_heads // self.n_kv
        packed = q.reshape(1, self.n_kv, n_rep * t, self.head_dim)  # [1, KV, R*T, D]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        if t == 1 and self._cpu and torch.compiler.is_compiling():
            # Compiled into two passes over the cache; the CPU's flash-attention kernel
            # reads a one-token step's keys and values at a fifth of memory speed.
            s = ((packed * self.scaling)[:, :, :, None] * keys[:, :, None]).sum(-1)  # [1,KV,R,S]
            p = torch.softmax(s if mask is None else s + mask, dim=-1)
            o = (p[..., None] * values[:, :, None]).sum(-2)  # [1, KV, R, D]
            return o.view(1, self.n_heads, t, self.head_dim)
        o = F.scaled_dot_product_attention(packed, keys, values, attn_mask=mask, scale=self.scaling)
        return o.view(1, self.n_heads, t, self.head_dim)

    def mlp(self, L: _Layer, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The rest of the layer: output projection of attention ``o`` ``[1, heads, T, D]``,
        residual, the MLP and its residual. :returns: ``[1, T, H]``."""
        t = h.shape[1]
        o = o.transpose(1, 2).reshape(1, t, self.n_heads * self.head_dim)
        fused = self._fused(t, (L.wo, L.wg, L.wu, L.wd))
        if fused is not None:
            # A prefill on prepacked weights: the residual adds, the activation and the gate's
            # product happen as each product writes its output (no separate passes over the
            # [T, 1536] activations).
            po, pg, pu, pd = fused
            h = products.packed_linear_then(o.view(t, -1), po, L.bo, "add", h.view(t, -1))
            x = self._rms(h, L.ln2)
            gate = products.packed_linear_silu(x, pg)
            a = products.packed_linear_then(x, pu, None, "mul", gate)
            return products.packed_linear_then(a, pd, None, "add", h).view(1, t, -1)
        h = h + self._linear(o, L.wo, L.bo)
        x = self._rms(h, L.ln2)
        gate, up = self._linear(x, L.wg), self._linear(x, L.wu)
        ops = cpu_kernels.row_ops(t, gate.dtype, gate.device)
        act = ops.silu_mul(gate, up) if ops is not None else None
        return h + self._linear(F.silu(gate) * up if act is None else act, L.wd)

    def rotary_tables(self, h: torch.Tensor, position_ids: torch.Tensor):
        """cos and sin ``[1, 1, T, D]`` for ``position_ids`` ``[1, T]``, in ``h``'s dtype."""
        cos, sin = self.rotary(h, position_ids)  # [1, T, D]
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def rotary_at(self, position_ids: torch.Tensor):
        """:meth:`rotary_tables` in the activations' dtype, on the weights' device."""
        like = torch.empty(1, 1, 0, dtype=self.embed.dtype, device=self.embed.device)
        return self.rotary_tables(like, position_ids)

    def rotary_rows(
        self, position_ids: torch.Tensor, end: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, D]`` at ``position_ids`` ``[1, T]`` (each below ``end``), as
        :meth:`rotary_at` computes them: rows of tables of every position below the largest
        ``end`` asked so far, made by the rotary module (a row equals what it computes for
        that position alone, bit for bit). A step indexes two tables instead of running the
        module's operations, which right after a step's stream of weights run from cold
        caches."""
        held = self._cos_rows.shape[0]
        if end > held:
            n = max(end, 2 * held, 256)
            cos, sin = self.rotary_at(torch.arange(n, device=self.embed.device)[None])
            self._cos_rows, self._sin_rows = cos[0, 0], sin[0, 0]  # [n, D]
        idx = position_ids.reshape(-1)
        return self._cos_rows[idx], self._sin_rows[idx]

    def _lm_head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[T, V]`` from final hidden states ``[T, H]``."""
        return self._linear(x, self.lm_head, self.lm_head_bias)
