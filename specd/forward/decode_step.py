"""specd's step kernel from Python: a decode or verify pass of a Llama-style decoder in one
call of ``specd/csrc/decode_step.cpp`` (built and loaded by :mod:`specd.cpu_kernels`), built
over a lean forward's weights (:func:`for_decoder`) and run on a cache (:func:`run`) by the
``kernel`` step backend (:class:`specd.forward.compiled.KernelStep`), which also checks it
against the eager pass (:func:`specd.forward.step.check`).
"""

from __future__ import annotations

import weakref

import torch

from ..kvcache import KVCache
from . import cpu_kernels, interleave
from .blocks import BlockWeight
from .fastpath import FastDecoder

#: The order of a layer's weights in :class:`DecodeStep` (biases may be None).
LAYER_WEIGHTS = ("ln1", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln2", "wg", "wu", "wd")


#: A weight as the step takes it: float32, or blocks (:class:`~specd.forward.blocks.BlockWeight`)
#: that the kernel decodes as it streams them.
Weight = torch.Tensor | BlockWeight


class DecodeStep:
    """A decode or verify pass (1-:data:`~specd.cpu_kernels.STEP_TOKENS` new tokens over a float32
    or float16 KV cache) of a Llama-style decoder, the whole of it in one call
    (``specd/csrc/decode_step.cpp``).

    :param layers: each layer's weights in :data:`LAYER_WEIGHTS` order, as ``[out, in]``
        matrices (float32 or blocks) and float32 vectors.
    :param embed: ``[V, H]``, or None for a step fed its inputs (:meth:`forward`);
        ``norm``: the final norm ``[H]``, or None for none (the outputs are then the residual
        stream: an EAGLE head's predicted features); ``lm_head``: ``[V, H]``.
    :raises ValueError: weights or sizes the kernel does not take, naming them.
    """

    def __init__(
        self,
        layers: list[tuple[Weight | None, ...]],
        embed: Weight | None,
        norm: torch.Tensor | None,
        lm_head: Weight,
        lm_bias: torch.Tensor | None,
        *,
        heads: int,
        kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
    ) -> None:
        if not cpu_kernels.available():
            raise RuntimeError(f"the CPU kernels are not available: {cpu_kernels.reason}")
        gate = layers[0][LAYER_WEIGHTS.index("wg")] if layers else None
        if gate is None:
            raise ValueError("decode step kernel: a model without layers or MLP weights")
        hidden, inter = gate.shape[1], gate.shape[0]
        sizes = {"hidden size": hidden, "MLP size": inter, "head size": head_dim}
        if any(v % 16 for v in sizes.values()) or heads % kv_heads:
            raise ValueError(
                f"decode step kernel: needs sizes that are multiples of 16 and whole groups of "
                f"query heads; this model has {', '.join(f'{k} {v}' for k, v in sizes.items())}, "
                f"{heads} query and {kv_heads} key/value heads"
            )
        expected = {
            "ln1": (hidden,), "wq": (heads * head_dim, hidden), "bq": (heads * head_dim,),
            "wk": (kv_heads * head_dim, hidden), "bk": (kv_heads * head_dim,),
            "wv": (kv_heads * head_dim, hidden), "bv": (kv_heads * head_dim,),
            "wo": (hidden, heads * head_dim), "bo": (hidden,), "ln2": (hidden,),
            "wg": (inter, hidden), "wu": (inter, hidden), "wd": (hidden, inter),
        }  # fmt: skip
        ptrs: list[int] = []
        formats: list[int] = []
        #: how many of its matrices are woven (int8 products, :mod:`.interleave`)
        self.woven = 0
        self._keep: list[Weight] = []
        for i, weights in enumerate(layers):
            for name, w in zip(LAYER_WEIGHTS, weights, strict=True):
                if w is None and name.startswith("b"):
                    ptrs.append(0)
                    formats.append(0)
                    continue
                blocks = name.startswith("w")  # a matrix; norms and biases are float32
                self._checked(f"layer {i} {name}", w, expected[name], blocks)
                ptr, code = self._storage(w)
                ptrs.append(ptr)
                formats.append(code)
        v = lm_head.shape[0]
        if embed is not None:
            self._checked("embedding", embed, (embed.shape[0], hidden), blocks=True)
        self._embed_rows = embed
        self._norm = self._checked("final norm", norm, (hidden,)) if norm is not None else 0
        self._checked("LM head", lm_head, (v, hidden), blocks=True)
        self._lm, self._lm_format = self._storage(lm_head)
        self._lm_b = self._checked("LM head bias", lm_bias, (v,)) if lm_bias is not None else 0
        self._table = torch.tensor(ptrs, dtype=torch.int64)
        self._formats = torch.tensor(formats, dtype=torch.int32)
        self.layers, self.hidden, self.inter, self.vocab = len(layers), hidden, inter, v
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.eps, self.scale = eps, scale
        self._rows = embed.shape[0] if embed is not None else 0
        # the cache buffers of the last pass and their table (_cache_table)
        self._buffers: list[tuple[weakref.ref, weakref.ref]] | None = None
        self._capacity = 0
        self._table_of_buffers = torch.empty(0, dtype=torch.int64)
        self._kv_half = False  # whether those buffers hold float16 (else float32)

    def _checked(
        self, name: str, w: Weight | None, shape: tuple[int, ...], blocks: bool = False
    ) -> int:
        if w is None or tuple(w.shape) != shape:
            got = "none" if w is None else tuple(w.shape)
            raise ValueError(f"decode step kernel: {name} is {got}, expected {shape}")
        if isinstance(w, BlockWeight):
            if not blocks:
                raise ValueError(f"decode step kernel: {name} must be float32, not blocks")
        elif w.dtype != torch.float32 or w.device.type != "cpu" or not w.is_contiguous():
            raise ValueError(f"decode step kernel: {name} must be contiguous float32 on CPU")
        self._keep.append(w)
        return w.data_ptr()

    def _storage(self, w: Weight | None) -> tuple[int, int]:
        """Where the kernel reads ``w`` and the code of its storage: a Q4 or Q8 weight's woven
        copy (:mod:`.interleave`) where the int8 products are on, else ``w`` as it is."""
        if w is None:
            return 0, 0
        if isinstance(w, BlockWeight) and interleave.enabled():
            woven, code = interleave.weave(w), interleave.code(w)
            if woven is not None and code is not None:
                self._keep.append(woven)
                self.woven += 1
                return woven.data_ptr(), code
        return w.data_ptr(), _format(w)

    def __call__(
        self,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        buffers: list[tuple[torch.Tensor, torch.Tensor]],
        past: int,
        tree: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the step for the new tokens ``ids`` ``[T]`` at positions ``past`` ..
        ``past + T - 1`` of ``buffers`` (each layer's ``[1, KV, capacity, D]``), where their
        keys and values go; the caller counts them.

        :param cos, sin: the rotary tables ``[T, D]`` at the tokens' positions (their depth
            in a tree).
        :param tree: bool ``[T, T]``, where new token i sees new token j (None: a chain).
            Every new token sees every cached position.
        :returns: logits ``[T, V]`` and the final norm's output ``[T, H]``.
        :raises ValueError: tokens, tables or buffers the step cannot take.
        """
        ids = ids.reshape(-1)
        if self._embed_rows is None:
            raise ValueError("decode step kernel: built without an embedding, it takes inputs")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self._rows):
            raise ValueError(f"decode step kernel: token ids outside 0..{self._rows - 1}")
        x = self._embed_rows[ids]  # [T, H] float32 (blocks decode those rows)
        return self.forward(x, cos, sin, buffers, past, tree)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        buffers: list[tuple[torch.Tensor, torch.Tensor]],
        past: int,
        tree: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`__call__` for the new tokens' inputs ``x`` ``[T, H]`` (float32) in place of
        their embeddings: an EAGLE head's entries."""
        d, t = self.head_dim, x.shape[0]
        if not 1 <= t <= cpu_kernels.STEP_TOKENS:
            raise ValueError(
                f"decode step kernel: {t} new tokens, it takes 1-{cpu_kernels.STEP_TOKENS}"
            )
        if x.shape != (t, self.hidden) or x.dtype != torch.float32:
            raise ValueError(f"decode step kernel: inputs must be float32 [{t}, {self.hidden}]")
        if len(buffers) != self.layers:
            raise ValueError(
                f"decode step kernel: {len(buffers)} cache layers, model {self.layers}"
            )
        cos, sin = cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous()
        for name, table in (("cos", cos), ("sin", sin)):
            if table.shape != (t, d) or table.dtype != torch.float32:
                raise ValueError(f"decode step kernel: {name} must be float32 [{t}, {d}]")
        if tree is not None:
            if tree.shape != (t, t):
                raise ValueError(
                    f"decode step kernel: tree mask {tuple(tree.shape)}, expected {(t, t)}"
                )
            tree = tree.to(torch.uint8).contiguous()
        table = self._cache_table(buffers, past, t)
        x = x.contiguous()
        threads = torch.get_num_threads()
        step = cpu_kernels.step_function()
        sizes = (self.hidden, self.inter, self.heads, self.kv_heads, d)
        work = cpu_kernels.buffer("step", cpu_kernels.step_work_floats(*sizes, t, past, threads))
        logits = torch.empty(t, self.vocab, dtype=torch.float32)
        hidden = torch.empty(t, self.hidden, dtype=torch.float32)
        step(
            self._table.data_ptr(), self._formats.data_ptr(), self.layers, table.data_ptr(),
            int(self._kv_half), *sizes, self.eps, self.scale, x.data_ptr(), cos.data_ptr(),
            sin.data_ptr(), t, past,
            tree.data_ptr() if tree is not None else None,
            self._norm or None, self._lm, self._lm_format, self._lm_b or None, self.vocab,
            logits.data_ptr(), hidden.data_ptr(), work.data_ptr(), threads,
        )  # fmt: skip
        return logits, hidden

    def _cache_table(
        self, buffers: list[tuple[torch.Tensor, torch.Tensor]], past: int, t: int
    ) -> torch.Tensor:
        """The kernel's table of the cache buffers (each layer's key and value pointers and
        head strides), checked to hold positions ``past .. past + t - 1``, all float32 or all
        float16 (:attr:`_kv_half`): built once for a set of buffers and kept while a cache
        passes the same ones (they change only as it grows), which saves checking 60 buffers a
        step."""
        kept = self._buffers or []
        same = len(buffers) == len(kept) > 0
        same = same and all(k is k0() and v is v0() for (k, v), (k0, v0) in zip(buffers, kept))
        end = past + t
        if same and end <= self._capacity:
            return self._table_of_buffers
        d, cache = self.head_dim, []
        dtype = buffers[0][0].dtype if buffers else torch.float32
        kind = "float32" if dtype != torch.float16 else "float16"
        for k, v in buffers:
            for x in (k, v):
                ok = x.dim() == 4 and x.shape[0] == 1 and x.shape[1] == self.kv_heads
                ok = ok and x.shape[3] == d and x.device.type == "cpu"
                ok = ok and x.dtype == dtype and dtype in (torch.float32, torch.float16)
                if not ok or x.stride(3) != 1 or x.stride(2) != d or x.shape[2] < end:
                    raise ValueError(
                        f"decode step kernel: cache buffer {tuple(x.shape)} {x.dtype} cannot take "
                        f"positions {past}-{end - 1} "
                        f"(expected {kind} [1, {self.kv_heads}, >= {end}, {d}])"
                    )
            cache += [k.data_ptr(), v.data_ptr(), k.stride(1), v.stride(1)]
        self._kv_half = dtype == torch.float16
        self._buffers = [(weakref.ref(k), weakref.ref(v)) for k, v in buffers]  # not kept alive
        self._capacity = min(x.shape[2] for kv in buffers for x in kv)
        self._table_of_buffers = torch.tensor(cache, dtype=torch.int64)
        return self._table_of_buffers


def _format(w: Weight) -> int:
    """The kernel's code of ``w``'s storage (``Format`` in ``csrc/decode_step.cpp``)."""
    return w.fmt.code if isinstance(w, BlockWeight) else 0


def for_decoder(fast: FastDecoder) -> DecodeStep:
    """The step kernel over ``fast``'s weights.

    :raises ValueError: weights or sizes it does not take; RuntimeError: no kernels here.
    """
    layers = [tuple(getattr(L, name) for name in LAYER_WEIGHTS) for L in fast.layers]
    return DecodeStep(
        layers,
        fast.embed,
        fast.norm,
        fast.lm_head,
        fast.lm_head_bias,
        heads=fast.n_heads,
        kv_heads=fast.n_kv,
        head_dim=fast.head_dim,
        eps=fast.eps,
        scale=fast.scaling,
    )


def usable(fast: FastDecoder) -> bool:
    """Whether the step kernel loads here and takes ``fast``'s model (it builds one to find
    out; a load builds its kernel once, in :class:`specd.forward.compiled.KernelStep`)."""
    if fast.embed.device.type != "cpu" or not cpu_kernels.available():
        return False
    try:
        for_decoder(fast)
    except (ValueError, RuntimeError):
        return False
    return True


def run(
    step: DecodeStep,
    fast: FastDecoder,
    cache: KVCache,
    ids: torch.Tensor,
    position_ids: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """One pass over ``ids`` ``[1, T]`` (positions ``[1, T]``; an additive mask
    ``[1, 1, T, past + T]`` for a tree, None for a chain) on top of ``cache``, which the
    caller advances.

    :returns: logits ``[T, V]`` and hidden states ``[T, H]``, or None where the pass must run
        eager (a mask hiding a cached position, a cache never written).
    :raises ValueError: a cache the kernel cannot take (another dtype).
    """
    t, past = ids.shape[1], cache.length
    tree = None
    if mask is not None:
        if bool(mask[0, 0, :, :past].any()):  # a cached position hidden
            return None
        tree = mask[0, 0, :, past:] == 0
    if past == 0:  # nothing written yet: the step writes the first positions itself
        cache.initialize(fast.n_kv, fast.head_dim)
    buffers = cache.buffers(past + t)
    if buffers is None:
        return None
    cos, sin = fast.rotary_rows(position_ids, past + t)
    return step(ids[0], cos, sin, buffers, past, tree)
