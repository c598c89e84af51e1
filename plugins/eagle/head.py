"""The EAGLE head: one decoder layer that predicts the target's next feature.

A *feature* is the target's last hidden state after its final norm, the vector its LM head
reads. Entry ``j`` of the head's sequence is ``fc([f_j, e(x_{j+1})])``: the feature of
token ``j`` and the embedding of the token that followed it. The layer (self-attention over
earlier entries, then an MLP) maps it to a prediction of ``f_{j+1}``, which the target's own
LM head, restricted to the draft vocabulary, turns into a distribution for ``x_{j+2}``.

While drafting, the head feeds its own predictions back as the next entry's feature. The
training-time test (:meth:`EagleHead.unrolled`) trains it on exactly that: at unroll step
``s`` the entry at position ``j`` carries the feature predicted at step ``s - 1`` and
attends to true entries up to ``j - s + 1`` and to the predicted entries between, the way
a draft chain sees them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    """Shapes of a head; taken from the target's configuration."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float
    eps: float

    @classmethod
    def for_target(cls, config: Any) -> HeadConfig:
        cfg = config.get_text_config(decoder=True)
        heads = int(cfg.num_attention_heads)
        hidden = int(cfg.hidden_size)
        rope = getattr(cfg, "rope_theta", None)
        if rope is None:
            params = getattr(cfg, "rope_parameters", None) or {}
            rope = params.get("rope_theta", 10000.0)
        return cls(
            hidden=hidden,
            heads=heads,
            kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
            intermediate=int(cfg.intermediate_size),
            rope_theta=float(rope),
            eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HeadConfig:
        return cls(**json.loads(text))


class EagleHead(nn.Module):
    """:param config: shapes. :param draft_vocab: ``[Vd]`` target token ids the head may
    propose (the most frequent next tokens of the training corpus). :param init: initialise
    the linear layers' weights at random; without it they are left to ``load_state_dict(...,
    assign=True)`` (a head loaded from its file: the random draws took ~30 ms of a load)."""

    draft_vocab: torch.Tensor  # [Vd] buffers, declared for type checkers
    inv_freq: torch.Tensor  # [D / 2]
    #: ``product(x, w)`` computes ``x @ w.T`` for every linear layer; None: the layers' own
    #: ``F.linear``. Drafting sets the target's ``Target.linear`` (the product it measured
    #: fastest for a few rows); training leaves it None.
    product: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: Per linear layer, the weight :attr:`product` reads for at most :attr:`few_rows` rows
    #: (``Target.small_weight``: Q8_0 blocks where the target runs on blocks); a layer not
    #: here, or more rows, reads its float weight. Set by :meth:`use_small_weights`.
    small: dict[nn.Module, Any]
    few_rows = 0

    def __init__(self, config: HeadConfig, draft_vocab: torch.Tensor, init: bool = True) -> None:
        super().__init__()
        c = config
        self.config = c
        at = None if init else torch.device("meta")  # no storage, no random draws

        def linear(inputs: int, outputs: int) -> nn.Linear:
            return nn.Linear(inputs, outputs, bias=False, device=at)

        self.fc = linear(2 * c.hidden, c.hidden)
        self.ln1 = nn.Parameter(torch.ones(c.hidden))
        self.ln2 = nn.Parameter(torch.ones(c.hidden))
        self.wq = linear(c.hidden, c.heads * c.head_dim)
        self.wk = linear(c.hidden, c.kv_heads * c.head_dim)
        self.wv = linear(c.hidden, c.kv_heads * c.head_dim)
        self.wo = linear(c.heads * c.head_dim, c.hidden)
        self.gate = linear(c.hidden, c.intermediate)
        self.up = linear(c.hidden, c.intermediate)
        self.down = linear(c.intermediate, c.hidden)
        self.register_buffer("draft_vocab", draft_vocab.to(torch.long), persistent=True)
        self.small = {}
        self._stacked: dict[tuple[nn.Module, ...], Any] = {}  # use_small_weights
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    # -- pieces -------------------------------------------------------------------------

    def use_small_weights(self, convert: Callable[[torch.Tensor], Any], rows: int) -> None:
        """Products of at most ``rows`` rows read ``convert(w)`` for each linear layer's weight
        ``w`` (drafting a few nodes at a time); larger ones, the float weights. The layers
        that read the same input (the queries, keys and values; the MLP's gate and up) are
        converted stacked only, one product for each such set (:meth:`_lins`): each output
        row is computed as alone, whatever rows are stacked with it."""
        groups = ((self.wq, self.wk, self.wv), (self.gate, self.up))
        stacked = {m for group in groups for m in group}  # read stacked only (_lins)
        w = {m: m.weight.detach() for m in self.modules() if isinstance(m, nn.Linear)}
        self.small = {m: convert(x) for m, x in w.items() if m not in stacked}
        self._stacked = {group: convert(torch.cat([w[m] for m in group])) for group in groups}
        self.few_rows = int(rows)

    def _lin(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if self.product is None:
            return layer(x)
        few = x.numel() <= self.few_rows * x.shape[-1]
        return self.product(x, self.small.get(layer, layer.weight) if few else layer.weight)

    def _lins(self, layers: tuple[nn.Linear, ...], x: torch.Tensor) -> list[torch.Tensor]:
        """``[_lin(m, x) for m in layers]``, in one product where they are stacked."""
        stacked = self._stacked.get(layers)
        if self.product is None or stacked is None or x.numel() > self.few_rows * x.shape[-1]:
            return [self._lin(m, x) for m in layers]
        return list(self.product(x, stacked).split([m.out_features for m in layers], -1))

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.eps)
        return w * xf.to(x.dtype)

    def _angles(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary embedding's cosines and sines ``[T, D]`` at absolute positions ``pos``."""
        ang = pos.to(self.inv_freq.dtype)[:, None] * self.inv_freq[None]  # [T, D/2]
        ang = torch.cat([ang, ang], dim=-1)
        return ang.cos().to(dtype), ang.sin().to(dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: ``[B, h, T, D]`` rotated by ``_angles``' cosines and sines."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def entries(self, feat: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """The layer's input: ``fc([f_j, e(x_{j+1})])``, ``[B, T, H]``."""
        return self._lin(self.fc, torch.cat([feat, emb], dim=-1))

    def keys_values(
        self, x: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[B, h, T, D]``, keys and values ``[B, kv, T, D]`` of entries ``x``."""
        c = self.config
        b, t, _ = x.shape
        h = self._rms(x, self.ln1)
        q, k, v = self._lins((self.wq, self.wk, self.wv), h)
        q = q.reshape(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = k.reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.reshape(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._angles(pos, x.dtype)  # once for both
        return self._rope(q, cos, sin), self._rope(k, cos, sin), v

    def finish(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention of ``q`` over ``keys``/``values`` (``mask``: ``[T, S]`` bool, True =
        may attend; None = causal with the queries last: one query sees every key), then the
        MLP. :returns: predicted next features ``[B, T, H]``."""
        c = self.config
        b, t, _ = x.shape
        rep = c.heads // c.kv_heads
        s = keys.shape[2]
        add = None  # one causal query: no mask to build (a drafter's step feeds one entry)
        if mask is not None or t > 1:
            if mask is None:
                mask = torch.ones(t, s, dtype=torch.bool, device=x.device).tril_(s - t)
            # Additive, and grouped-query attention on the key/value heads (each group's
            # query heads as rows): on CPU a boolean mask, or keys repeated per query head,
            # sent attention down a path several times slower.
            add = torch.zeros(t, s, dtype=q.dtype, device=q.device)
            add = add.masked_fill_(~mask, torch.finfo(q.dtype).min).repeat(rep, 1)
        rows = q.reshape(b, c.kv_heads, rep * t, c.head_dim)
        o = F.scaled_dot_product_attention(rows, keys, values, attn_mask=add)
        o = o.view(b, c.heads, t, c.head_dim)
        h = x + self._lin(self.wo, o.transpose(1, 2).reshape(b, t, c.heads * c.head_dim))
        m = self._rms(h, self.ln2)
        gate, up = self._lins((self.gate, self.up), m)
        act = F.silu(gate) * up
        return h + self._lin(self.down, act)

    # -- training -----------------------------------------------------------------------

    def unrolled(self, feat: torch.Tensor, emb: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Predicted features at each unroll step (the training-time test).

        :param feat: ``[B, T, H]`` true features f_j. :param emb: ``[B, T, H]`` embeddings of
            x_{j+1}. :param steps: how many draft positions to train.
        :returns: ``steps`` tensors ``[B, T, H]``; step s's row j predicts f_{j+1} having
            fed predictions for the last s - 1 entries (rows j < s - 1 have no such chain).
        """
        t = feat.shape[1]
        pos = torch.arange(t, device=feat.device)
        outs: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        x_feat = feat
        for s in range(steps):
            x = self.entries(x_feat, emb)
            q, k, v = self.keys_values(x, pos)
            keys.append(k)
            values.append(v)
            mask = _unroll_mask(t, s, feat.device)
            out = self.finish(x, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            outs.append(out)
            # the next step's entry j carries the feature this step predicted for it
            x_feat = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        return outs

    def logits(self, feat: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """Scores over the draft vocabulary ``[..., Vd]`` from predicted features, through
        the rows ``lm_head`` ``[Vd, H]`` of the target's LM head."""
        return feat @ lm_head.T


def _unroll_mask(t: int, step: int, device: torch.device) -> torch.Tensor:
    """``[T, (step + 1) * T]``: at unroll step ``s`` (0-based) query j sees true entries
    ``0..j - s`` and, from each step m in 1..s, the entry at ``j - s + m`` (itself at m = s,
    so no row is empty)."""
    j = torch.arange(t, device=device)
    blocks = [j[None, :] <= (j[:, None] - step)]
    for m in range(1, step + 1):
        blocks.append(j[None, :] == (j[:, None] - step + m))
    return torch.cat(blocks, dim=1)
