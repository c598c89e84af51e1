"""Which product multiplies the lean forward's weights: prepacked copies (oneDNN's blocked
layout) for the passes where they measure faster, weight-major products of a few rows where
those do, and for weights stored as blocks, whichever of three products measured fastest for
a prefill's passes: the step kernel's int8 products on the woven copy, or the values decoded
for one product (multiplied by ``F.linear``, or packed for that pass).
:class:`WeightProducts` is the part of :class:`~specd.forward.fastpath.FastDecoder` that
chooses and runs them; it reads the decoder's ``layers``, ``embed``, ``lm_head`` and
``quantized``."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import torch
import torch.nn.functional as F

from . import cpu_kernels, interleave, pricing, products
from .blocks import BlockWeight

log = logging.getLogger(__name__)

#: Row counts (tokens in one pass) that use prepacked weights, where they are faster: a
#: verify pass of a few draft tokens. One or two rows use them where that measures faster.
PACKED_ROWS = range(3, products.PACK_ROWS + 1)
#: Passes of more rows than :data:`PACKED_ROWS` (a prefill) use the same prepacked weights
#: where they measure faster for this many rows.
PACKED_PREFILL_ROWS = 256
#: Decoder weights larger than this are not packed (the copy would double their memory).
PACKED_MAX_BYTES = 2 << 30
#: Which product won, per weight shapes and thread count: measured once per process, so
#: two decoders of one model compute the same arithmetic (and the same tokens).
_WEIGHT_MAJOR: dict[tuple[Any, ...], bool] = {}
#: How a prefill on blocks multiplies (one of :data:`BLOCK_PRODUCTS`), per
#: :meth:`_measure_block_prefill`'s key: measured once per process (and kept across starts
#: where the cache directory is on).
_BLOCK_PREFILL: dict[str, str] = {}
#: The products a prefill on blocks may use: the step kernel's int8 products on the woven
#: copy (:mod:`.interleave`), oneDNN's prepacked copy of the values, ``F.linear`` on them.
BLOCK_PRODUCTS = ("int8", "prepacked", "linear")


class WeightProducts:
    """Products of the lean forward's weights (a part of ``FastDecoder``)."""

    layers: list[Any]
    embed: Any
    lm_head: Any
    quantized: bool

    def _init_products(self) -> None:
        # Which matrix product streams weights fastest depends on the CPU, its threads and
        # the dtype: measured here, once.
        self._cpu32 = (
            self.embed.device.type == "cpu"
            and self.embed.dtype == torch.float32
            and not self.quantized
        )
        mlp = [m for L in self.layers for m in (L.wg, L.wu, L.wd)]
        key = (tuple(tuple(m.shape) for m in mlp), torch.get_num_threads())
        if self._cpu32 and key not in _WEIGHT_MAJOR:
            _WEIGHT_MAJOR[key] = products.weight_major_is_faster(mlp)
        self._weight_major = self._cpu32 and _WEIGHT_MAJOR[key]
        self._packed: dict[int, torch.Tensor] = {}
        self._packed_step = False  # whether passes of fewer rows than PACKED_ROWS use them
        self._packed_prefill = False  # whether passes past PACKED_ROWS use them too
        self._block_prefill: str | None = None  # :meth:`_prefill_product`, once measured
        # On a CPU, a compiled one-token step (specd.compiled) computes products and
        # attention as plain reductions the compiler fuses.
        self._cpu = self.embed.device.type == "cpu"

    @property
    def weight_major(self) -> bool:
        """Whether products of a few rows are computed weight-major (measured faster)."""
        return self._weight_major

    @torch.no_grad()
    def pack(self, mode: str = "auto") -> bool:
        """Keep oneDNN's blocked layout of each decoder weight and of the LM head for passes
        of a few tokens (:data:`PACKED_ROWS`: verifying a draft): on one 2-vCPU EPYC a pass
        of 9 tokens took 61 ms instead of 91 at 1k context (``scripts/step_cost.py``); for
        one- and two-token steps where that measures faster too (the same CPU: the step's
        products ~18 ms instead of ~27 in isolation, the LM head 2.3 ms instead of 4.2); and
        for a prefill's passes where that measures faster (~200 GFLOP/s against ~150 for
        256-1,024 rows). A copy of the weights: it costs their size in memory again.

        :param mode: ``on`` (CPU float32 weights, every pass); ``auto``: only where it
            measures at least 10% faster, for each kind of pass, and the weights are at most
            :data:`PACKED_MAX_BYTES`; ``off``.
        :returns: whether the packed weights are in use.
        """
        self._packed, self._packed_step, self._packed_prefill = {}, False, False
        weights = [m for L in self.layers for m in (L.wq, L.wk, L.wv, L.wo, L.wg, L.wu, L.wd)]
        if mode == "off" or not self._cpu32 or not products.packable():
            return False
        weights.append(self.lm_head)
        size = sum(m.numel() * m.element_size() for m in weights)
        mlp = [m for L in self.layers for m in (L.wg, L.wu, L.wd)][:24]
        if mode == "auto":
            if size > PACKED_MAX_BYTES or not products.packed_is_faster(mlp, self._linear):
                return False
        for m in weights:
            self._packed.setdefault(m.data_ptr(), products.pack(m))
        self._packed_step = mode == "on" or products.packed_is_faster(
            mlp[:12] + [self.lm_head], self._linear, (1, 2), packed=self._packed
        )
        self._packed_prefill = mode == "on" or products.packed_is_faster(
            mlp[:6], self._linear, (PACKED_PREFILL_ROWS,), packed=self._packed
        )
        uses = ["verify passes of a few tokens"]
        uses += ["one-token steps"] if self._packed_step else []
        uses += ["prefills"] if self._packed_prefill else []
        log.info("%s use prepacked weights (%d MB)", ", ".join(uses), size >> 20)
        return True

    def _linear(
        self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x @ w.T + b`` for ``x`` of shape ``[..., K]``.

        On some CPUs in float32, a product with a handful of rows is much faster computed
        as ``w @ x.T`` (MKL streamed the weight at ~29 GB/s instead of ~6-10 GB/s with
        ``F.linear`` on one machine), with one row padded to two; on others it is slower.
        Which one runs is measured when the decoder is built, and so is which passes use
        the prepacked weights (:meth:`pack`).
        """
        if isinstance(w, BlockWeight):
            n = x.numel() // x.shape[-1]
            how = self._prefill_product() if n > PACKED_ROWS[-1] else "linear"
            if how == "int8" and w.woven is not None and cpu_kernels.available():
                y = cpu_kernels.product(
                    x.reshape(n, x.shape[-1]), w.woven.data_ptr(), interleave.code(w),  # type: ignore[arg-type]
                    w.shape[0], w.shape[1], b,
                )  # fmt: skip
                return y.reshape(*x.shape[:-1], -1)
            if how == "prepacked" and n > PACKED_ROWS[-1]:  # a prefill's: oneDNN's layout
                packed = products.pack(self._block_values(w))
                rows = x.reshape(n, x.shape[-1])
                return products.packed_linear(rows, packed, b).reshape(*x.shape[:-1], -1)
            return F.linear(x, self._block_values(w), b)  # a float32 copy, then dropped
        lead = x.shape[:-1]
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if torch.compiler.is_compiling():
            if n == 1 and self._cpu:
                # One row, compiled on a CPU: a reduction over each weight row, which the
                # compiler turns into one vectorised loop streaming the weight (MKL's and
                # oneDNN's one-row products stream it at half a plain read's speed).
                y = (w * rows).sum(-1)
                return (y if b is None else y + b).reshape(*lead, w.shape[0])
            return F.linear(x, w, b)  # several rows: the compiler's own product
        packed = self._packed_weight(n, w)
        if packed is not None:
            return products.packed_linear(rows, packed, b).reshape(*lead, w.shape[0])
        if not self._weight_major or n > 16:
            return F.linear(x, w, b)
        y = products.weight_major(rows, w)  # [n, N]
        if b is not None:
            y = y + b
        return y.reshape(*lead, w.shape[0])

    @staticmethod
    def _block_values(w: BlockWeight) -> torch.Tensor:
        """``w``'s float32 values, in this thread's scratch buffer where the kernels run
        (valid until the next such call): a product's copy, dropped right after it."""
        if w.data.device.type == "cpu" and cpu_kernels.available():
            rows, cols = w.shape
            return cpu_kernels.dequantize(w.data_ptr(), w.fmt.code, rows, cols, scratch=True)
        return w.dequantize()

    def _prefill_product(self) -> str:
        """How a prefill on blocks multiplies (one of :data:`BLOCK_PRODUCTS`): by the step
        kernel's int8 products on the woven copy of each weight (the activations rounded to
        int8, as a step's are), or by the weight's float32 values decoded for that pass, through
        oneDNN's prepacked copy of them (with the MLP's operations fused into the products
        where this torch build fuses them) or ``F.linear``. Which is fastest depends on the CPU:
        on the Zen 3 EPYC of docs/benchmarks.md a 1k-token prefill on the int8 products took
        0.74x ``F.linear``'s time and 0.62x the prepacked products'; on the AVX-512 one, before
        the int8 products were a choice, the prepacked products won
        (``scripts/prefill_weights.py auto --blocks-all``). So it is measured, once per CPU, thread count and torch build
        (:meth:`_measure_block_prefill`), and kept in the cache directory: every decoder of one
        process, and every start on this machine, runs the same arithmetic and so writes the
        same tokens."""
        if not (self.quantized and self._cpu):
            return "linear"
        if self._block_prefill is None:
            self._block_prefill = self._measure_block_prefill()
        return self._block_prefill

    def _prefill_products(self) -> list[str]:
        """The products of :data:`BLOCK_PRODUCTS` this decoder can use for a prefill: int8
        where every weight of the first layer has its woven copy (the step kernel's, made at
        load), prepacked where torch has oneDNN's prepacked linear."""
        first: Any = self.layers[0]
        weights = [first.wq, first.wk, first.wv, first.wo, first.wg, first.wu, first.wd]
        woven = all(isinstance(w, BlockWeight) and w.woven is not None for w in weights)
        return [
            how
            for how in BLOCK_PRODUCTS
            if how == "linear"
            or (how == "int8" and woven and cpu_kernels.available())
            or (how == "prepacked" and products.packable())
        ]

    @torch.inference_mode()
    def _measure_block_prefill(self) -> str:
        """Time the first layer's products for a pass of :data:`PACKED_PREFILL_ROWS` rows
        each way this decoder can (the fastest of three each, alternating) or read the verdict
        kept for this machine. :returns: the product that won."""
        fast: Any = self
        first = fast.layers[0]
        weights = [first.wq, first.wk, first.wv, first.wo, first.wg, first.wu, first.wd]
        ways = self._prefill_products()
        key = {
            "kind": "block prefill products", "cpu": pricing.cpu_name(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "weights": [[_stored_as(w), *w.shape] for w in weights], "ways": ways,
            "kernel": cpu_kernels.isa() if "int8" in ways else None,
        }  # fmt: skip
        name = json.dumps(key, sort_keys=True)
        if name in _BLOCK_PREFILL:
            return _BLOCK_PREFILL[name]
        known = pricing.kept(key, "remembered")
        if known is not None and known.get("product") in ways:
            _BLOCK_PREFILL[name] = known["product"]
            return known["product"]
        if len(ways) == 1:
            _BLOCK_PREFILL[name] = ways[0]
            return ways[0]
        rows, gen = PACKED_PREFILL_ROWS, torch.Generator().manual_seed(0)
        h = torch.randn(1, rows, first.wq.shape[1], generator=gen)
        o = torch.randn(1, fast.n_heads, rows, fast.head_dim, generator=gen)
        cos, sin = fast.rotary_at(torch.arange(rows)[None])
        best = {how: float("inf") for how in ways}
        for _ in range(3):
            for how in ways:
                self._block_prefill = how
                t = time.perf_counter()
                fast.qkv(first, h, cos, sin)
                fast.mlp(first, h, o)
                best[how] = min(best[how], time.perf_counter() - t)
        won = min(ways, key=lambda how: best[how])
        log.info(
            "a prefill on blocks multiplies by %s (a layer of %d rows: %s)", won, rows,
            ", ".join(f"{how} {best[how] * 1e3:.1f} ms" for how in ways),
        )  # fmt: skip
        pricing.keep(key, "remembered", {"product": won})
        _BLOCK_PREFILL[name] = won
        return won

    def _packed_weight(self, n: int, w: torch.Tensor) -> torch.Tensor | None:
        """The prepacked copy of ``w`` where a product of ``n`` rows uses it (:meth:`pack`)."""
        if self._packed and (
            n in PACKED_ROWS
            or (n < PACKED_ROWS[0] and self._packed_step)
            or (n > PACKED_ROWS[-1] and self._packed_prefill)
        ):
            return self._packed.get(w.data_ptr())
        return None

    def _fused(self, n: int, weights: tuple[torch.Tensor, ...]) -> list[torch.Tensor] | None:
        """The prepacked copies of ``weights`` where a prefill pass of ``n`` rows uses them
        and the products can fuse the operations after them (:func:`products.fuses`).
        Passes of a few rows keep the separate operations: for them the fused products did
        not measure faster (a 9-token pass 38-49 ms either way, alternating)."""
        if n <= PACKED_ROWS[-1] or torch.compiler.is_compiling():
            return None
        if all(isinstance(w, BlockWeight) for w in weights):
            if self._prefill_product() != "prepacked" or not products.fuses():
                return None
            return [products.pack(self._block_values(w)) for w in weights]  # type: ignore[arg-type]
        if not self._packed or not products.fuses():
            return None
        packed = [self._packed_weight(n, w) for w in weights]
        return None if any(p is None for p in packed) else packed  # type: ignore[return-value]


def _stored_as(w: torch.Tensor | BlockWeight) -> str:
    """``w``'s block format's name, or its dtype."""
    return w.fmt.name if isinstance(w, BlockWeight) else str(w.dtype)
