"""The engine's KV cache: preallocated, croppable to any length, compactable to a tree path.

Hugging Face's cache classes change between releases, so everything the engine does to a
cache goes through :class:`KVCache`. Each attention layer writes into a buffer that grows by
doubling; a step appends in place (no ``torch.cat`` of the whole history per token) and
rollback is a length change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class _GrowingLayer:
    """One layer's keys and values in a buffer ``[B, H, capacity, D]`` of which the first
    ``length`` positions are live. It has the methods of a transformers cache layer; it
    becomes one (:func:`_hf_layer_class`) only when a transformers forward needs it, so the
    lean forward never imports transformers."""

    def __init__(self, capacity: int = 256, dtype: torch.dtype | None = None) -> None:
        self.is_initialized = False
        self._capacity = capacity
        self._dtype = dtype
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, d = key_states.shape
        # Zeros, not garbage: a compiled step may attend over positions it masks out, and a
        # masked NaN still poisons the sum (0 * NaN).
        dtype = self._dtype or key_states.dtype
        self._k = key_states.new_zeros((b, h, self._capacity, d), dtype=dtype)
        self._v = value_states.new_zeros(
            (b, h, self._capacity, value_states.shape[-1]), dtype=dtype
        )
        self.length = 0
        self.is_initialized = True

    # The live positions as views of the buffers, made when read: a step that moves the
    # length of every layer (advance, crop) would otherwise make two views a layer each time,
    # ~0.3 ms a step for 30 layers.
    @property
    def keys(self) -> torch.Tensor | None:
        """The live keys ``[B, H, length, D]`` (a view of the buffer), None before any."""
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        """The live values ``[B, H, length, D]`` (a view of the buffer), None before any."""
        return None if self._v is None else self._v[:, :, : self.length]

    def _reserve(self, needed: int) -> None:
        assert self._k is not None and self._v is not None
        cap = self._k.shape[2]
        if needed <= cap:
            return
        new_cap = max(needed, 2 * cap)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_zeros((old.shape[0], old.shape[1], new_cap, old.shape[3]))
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._reserve(self.length + n)
        assert self._k is not None and self._v is not None
        # Stored in the buffer's dtype (a bfloat16 prefill fills a float32 cache; a float16
        # cache rounds float32 keys and values to the nearest half, as the step kernel does),
        # and read back in the caller's: every new token attends to what the cache holds.
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        keys, values = self.keys, self.values
        assert keys is not None and values is not None
        if keys.dtype != key_states.dtype:
            keys, values = keys.to(key_states.dtype), values.to(value_states.dtype)
        return keys, values

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` positions without growing step by step."""
        if self.is_initialized:
            self._reserve(needed)
        else:
            self._capacity = max(self._capacity, needed)

    def buffers(self, needed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers ``[B, H, capacity, D]``, grown to hold
        ``needed`` positions, for a step that writes into them itself (then :meth:`advance`)."""
        self._reserve(needed)
        assert self._k is not None and self._v is not None
        return self._k, self._v

    def advance(self, n: int) -> None:
        """Count ``n`` positions written into :meth:`buffers` after the live ones."""
        self.length += n

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        if not self.is_initialized or tokens_to_remove == 0:
            return
        self.length = max(0, self.length + tokens_to_remove)

    def set_length(self, length: int) -> None:
        if self.is_initialized:
            self.length = min(length, self.length)

    def select(self, start: int, positions: torch.Tensor) -> None:
        """Keep [0, start) and then the given absolute positions, in that order."""
        if not self.is_initialized:
            return
        assert self._k is not None and self._v is not None
        n = positions.numel()
        self._k[:, :, start : start + n] = self._k.index_select(2, positions)
        self._v[:, :, start : start + n] = self._v.index_select(2, positions)
        self.length = start + n

    def reset(self) -> None:
        self.length = 0

    def nbytes(self) -> int:
        if self._k is None or self._v is None:
            return 0
        return self._k.numel() * self._k.element_size() + self._v.numel() * self._v.element_size()


_hf_layer: type | None = None


def _hf_layer_class() -> type:
    """:class:`_GrowingLayer` as a transformers ``DynamicLayer`` (its methods first)."""
    global _hf_layer
    if _hf_layer is None:
        from transformers.cache_utils import DynamicLayer

        _hf_layer = type("_HFGrowingLayer", (_GrowingLayer, DynamicLayer), {})
    return _hf_layer


class KVCache:
    """The KV cache of one sequence: what the target has seen, and nothing more."""

    def __init__(
        self, num_layers: int, capacity: int = 256, dtype: torch.dtype | None = None
    ) -> None:
        """:param dtype: what keys and values are stored as (default: as the first written)."""
        self._layers = [_GrowingLayer(capacity, dtype) for _ in range(num_layers)]
        self.dtype = dtype
        self._hf: Any = None
        #: The target's features (last hidden states) of positions ``0..F-1`` (``F <=
        #: length``), kept for drafters that read them; None when they are not known.
        self.features: torch.Tensor | None = None

    @property
    def hf(self) -> Any:
        """The same layers as a transformers ``DynamicCache``, for a transformers forward
        (built on first use: the lean forward never needs it)."""
        if self._hf is None:
            from transformers.cache_utils import DynamicCache

            cls = _hf_layer_class()
            for layer in self._layers:
                layer.__class__ = cls
            hf = DynamicCache()
            # each layer is a DynamicLayer now (its class was switched above)
            hf.layers = list(self._layers)  # type: ignore[arg-type]
            hf.layer_class_to_replicate = None
            self._hf = hf
        return self._hf

    def layer(self, i: int) -> _GrowingLayer:
        """Layer ``i``'s keys and values; ``update(k, v)`` appends and returns the live views."""
        return self._layers[i]

    def reserve(self, needed: int) -> None:
        """Room for ``needed`` positions in every layer, allocated once (a prompt about to
        be prefilled), instead of doubling buffers and copying them chunk by chunk."""
        for layer in self._layers:
            layer.reserve(needed)

    def initialize(self, kv_heads: int, head_dim: int, device: torch.device | str = "cpu") -> None:
        """Allocate every layer's buffers before anything is written (a step that writes
        into :meth:`buffers` itself from the first position on); a written cache is left as
        it is."""
        for layer in self._layers:
            if not layer.is_initialized:
                dtype = self.dtype or torch.float32
                empty = torch.empty(1, kv_heads, 0, head_dim, dtype=dtype, device=device)
                layer.lazy_initialization(empty, empty)

    def buffers(self, needed: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Every layer's whole key and value buffers ``[B, H, capacity, D]``, with room for
        ``needed`` positions, for a step that writes into them in place; None while the
        cache has never been written (its shapes are not known yet). Count what the step
        wrote with :meth:`advance`.

        A buffer stays the same tensor until a step needs more than its capacity, so a
        captured graph (CUDA) that holds it replays until then.
        """
        if not self._layers or not self._layers[0].is_initialized:
            return None
        return [layer.buffers(needed) for layer in self._layers]

    def advance(self, n: int) -> None:
        """Count ``n`` positions written into :meth:`buffers` after the live ones."""
        for layer in self._layers:
            layer.advance(n)

    @property
    def length(self) -> int:
        return self._layers[0].length if self._layers else 0

    def crop(self, length: int) -> None:
        """Roll back to the first ``length`` positions."""
        if length < 0:
            raise ValueError(f"cannot crop to a negative length ({length})")
        for layer in self._layers:
            layer.set_length(length)
        if self.features is not None and self.features.shape[0] > length:
            self.features = self.features[:length]

    def keep(self, start: int, positions: Sequence[int]) -> None:
        """Keep positions [0, start) followed by ``positions`` (absolute, ascending), e.g. the
        accepted path of a verified token tree."""
        positions = list(positions)
        if positions == list(range(start, start + len(positions))):
            self.crop(start + len(positions))
            return
        if self.features is not None and self.features.shape[0] > start:
            self.features = self.features[:start]
        idx = torch.tensor(positions, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            for layer in self._layers:
                layer.select(start, idx)

    def prompt_features(
        self, reused: int, computed: list[torch.Tensor] | None
    ) -> torch.Tensor | None:
        """The prompt's features for a drafter that reads them: those kept here for the
        ``reused`` positions followed by those the prefill ``computed``, and kept for the next
        request. When the reused part has none, only the computed ones (the drafter keeps its
        own history); when the prefill computed those of its last tokens only (a drafter's
        window), only those, and none are kept."""
        if computed is None:
            return None
        parts = list(computed)
        if sum(p.shape[0] for p in parts) != self.length - reused:  # the last tokens' only
            self.features = None
            return torch.cat(parts) if parts else None
        if reused:
            kept = self.features
            if kept is None or kept.shape[0] != reused:
                self.features = None
                return torch.cat(parts) if parts else None
            parts.insert(0, kept)
        self.features = torch.cat(parts) if parts else None
        return self.features

    @property
    def device(self) -> torch.device | str:
        for layer in self._layers:
            if layer._k is not None:
                return layer._k.device
        return "cpu"

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self._layers)
