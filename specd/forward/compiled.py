"""A compiled decode step for the lean forward (:mod:`specd.fastpath`).

A one-token step of a small model spends a good part of its time dispatching some thirty
small elementwise operations per layer from Python. Compiled, the step runs as one call of
specd's own step kernel (x86 CPUs with AVX-512), as a few fused loops (other CPUs:
``torch.compile`` with inductor) or as one replayed CUDA graph (CUDA).

What runs compiled: the decode and verify passes (the pending token and a draft, a chain
or a tree, at most :data:`MAX_TOKENS` tokens) on CUDA and through the step kernel, the
one-token decode step through inductor on a CPU, on top of a cache that already holds
tokens. Prefill, early exit and everything else run
eager, as does every pass until the compiled step is ready.

How a step meets the cache: it writes its keys and values into the cache's whole buffers
(:meth:`specd.kvcache.KVCache.buffers`) at positions given as a tensor, then attends over
the first ``span`` positions with an additive mask.

- ``kernel`` (CPU): a whole pass of 1-16 tokens in one C++ call
  (:class:`specd.decode_step.DecodeStep`, ``specd/csrc/decode_step.cpp``): every product's
  rows shared out between the threads in one parallel region, attention over the cache
  split by position; passes whose mask hides a cached position run eager. Ready as soon as
  the kernels are built (a second, once per machine) and its first one- and five-token
  passes match the eager ones; on a 2-vCPU EPYC it ran a 1k-context step in ~15 ms where
  the inductor step took 20-26 and the eager one 28-45, and an 8-token verify pass in ~22
  ms against ~41 eager (docs/benchmarks.md).
- ``inductor``: shapes are dynamic and ``span`` is the live length plus the step's tokens.
  On a CPU one graph, the one-token step, serves every cache length; its products and its
  attention are written as plain reductions the compiler fuses into loops that stream the
  weights and the cache (:meth:`FastDecoder._linear`, :meth:`FastDecoder.attend`). Passes
  of several tokens run eager on the prepacked weights: compiled, a pass of 2-8 tokens took
  61-64 ms against 24-30 eager at 1k context on a 2-vCPU EPYC. On CUDA two graphs (one
  token; several tokens with a mask) serve every cache length and draft size.
- ``cudagraph`` (CUDA): a graph's shapes and addresses are fixed when it is captured, so
  ``span`` is the buffer's whole capacity (positions past the live ones are masked out),
  the tokens are padded up to a bucket of :data:`BUCKETS`, and a graph is captured per
  (buffers, bucket); it replays until the cache outgrows its buffer.
- ``static``: the ``cudagraph`` arithmetic (whole-capacity span, padded buckets, inputs
  copied into fixed tensors) run eager without capturing, so every part of the CUDA path
  but the capture itself runs, and is tested, on a CPU.

Where compiling is unavailable or fails, or a compiled graph would have to be recompiled
while serving, the pass runs eager and the reason is logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.fx.experimental import _config as fx_config

from ..errors import BadInputError
from ..kvcache import KVCache
from . import decode_step
from .fastpath import FastDecoder
from .static_graph import Buffers, StaticGraph

log = logging.getLogger(__name__)

#: Padded token counts of the CUDA graphs: the pending token plus a draft of up to 15.
BUCKETS = (1, 2, 4, 8, 16)
#: The most tokens a compiled pass takes; longer passes run eager.
MAX_TOKENS = BUCKETS[-1]
#: CUDA graphs kept (per cache buffer and bucket), least recently used dropped first.
MAX_GRAPHS = 32
BACKENDS = ("kernel", "inductor", "cudagraph", "static")
#: Cached tokens of the scratch run a step is compiled on.
SCRATCH_CONTEXT = 512


class CompiledStep:
    """The decode and verify steps of one :class:`FastDecoder`, compiled.

    :param fast: the lean forward whose weights and arithmetic the step uses.
    :param backend: ``kernel``, ``inductor``, ``cudagraph`` or ``static`` (default:
        :func:`default_backend`).
    """

    def __init__(self, fast: FastDecoder, backend: str | None = None) -> None:
        device = fast.embed.device
        backend = backend or default_backend(fast)
        if backend not in BACKENDS:
            raise BadInputError(f"unknown compile backend {backend!r}; choose from {BACKENDS}")
        if backend == "cudagraph" and device.type != "cuda":
            raise BadInputError(f"CUDA graphs need a CUDA device, the model is on {device}")
        if backend == "kernel" and device.type != "cpu":
            raise BadInputError(f"the step kernel runs on a CPU, the model is on {device}")
        self.fast = fast
        self.backend = backend
        self.device = device
        #: ``off`` (not started), ``compiling``, ``ready`` or ``failed`` (see ``reason``)
        self.state = "off"
        self.reason = ""
        #: seconds the compile (or the first captures) took, once ready
        self.compile_s: float | None = None
        self._compiled: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
        self._graphs: OrderedDict[tuple[int, int], StaticGraph] = OrderedDict()
        self._kernel: decode_step.DecodeStep | None = None
        self._thread: threading.Thread | None = None
        #: the most tokens a pass it serves holds (more run eager)
        self.max_tokens = 1 if backend == "inductor" and device.type == "cpu" else MAX_TOKENS
        #: passes it has served
        self.served = 0

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    # -- preparing ----------------------------------------------------------------------

    def prepare(self, new_cache: Callable[[], KVCache], *, background: bool = False) -> None:
        """Compile the step (CPU) or check that graphs capture (CUDA) on a scratch cache,
        then mark it ready; with ``background``, in a thread while passes run eager.

        :param new_cache: makes an empty cache for the scratch run.
        """
        if self.state != "off":
            return
        self.state = "compiling"
        if background:
            self._thread = threading.Thread(
                target=self._prepare, args=(new_cache,), name="specd-compile", daemon=True
            )
            self._thread.start()
        else:
            self._prepare(new_cache)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background compile. :returns: whether the step is ready."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.ready

    def _prepare(self, new_cache: Callable[[], KVCache]) -> None:
        t0 = time.perf_counter()
        if self.backend == "kernel":
            self._prepare_kernel(new_cache, t0)
            return
        try:
            if self.backend == "inductor":
                self._compiled = torch.compile(self._step, dynamic=True, fullgraph=True)
            # Sizes equal by chance in the scratch run must not become one symbol, or the
            # first real call with different sizes would recompile.
            with torch.inference_mode(), fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
                cache = new_cache()
                # A context of a real request's size: the compiler sizes its loops by the
                # lengths it sees here (over a 4-token cache it ran the attention of a 1k
                # context on one thread).
                n = SCRATCH_CONTEXT
                ids = torch.arange(n, device=self.device)[None] % self.fast.embed.shape[0]
                self.fast.forward(cache, ids, torch.arange(n, device=self.device)[None], None)
                # One token, then several (a chain with its mask): every graph compiled
                # here. Then one and three more, refusing recompiles, as serving will: a
                # guard the scratch inputs happened to pass fails here, not mid-request.
                runs = ((1, True), (2, True), (1, False), (3, False))
                for n, recompile in [r for r in runs if r[0] <= self.max_tokens]:
                    base = cache.length
                    tokens = ids[:, :n]  # a view: its strides differ from a request's
                    pos = torch.arange(base, base + n, device=self.device)[None]
                    if self._run(cache, tokens, pos, None, allow_recompile=recompile) is None:
                        raise RuntimeError(self.reason or "the compiled step did not run")
        except Exception as e:  # compile errors come in every type
            if self.state != "failed":  # not logged yet
                self._fail(f"{type(e).__name__}: {e}")
            return
        self.compile_s = time.perf_counter() - t0
        self.state = "ready"
        log.info("compiled decode step ready (%s, %.1f s)", self.backend, self.compile_s)

    def _prepare_kernel(self, new_cache: Callable[[], KVCache], t0: float) -> None:
        """Build the step kernel, then check its first passes against the eager ones."""
        try:
            kernel = decode_step.for_decoder(self.fast)
            decode_step.check(kernel, self.fast, new_cache)
        except Exception as e:  # a build, load or arithmetic failure of any kind
            self._fail(f"{type(e).__name__}: {e}")
            return
        self._kernel = kernel
        self.compile_s = time.perf_counter() - t0
        self.state = "ready"
        log.info("decode step kernel ready (%.1f s)", self.compile_s)

    def _fail(self, reason: str) -> None:
        self.state, self.reason = "failed", reason
        log.warning("compiled decode step off, running eager (%s): %s", self.backend, reason)

    # -- running ------------------------------------------------------------------------

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One pass over ``ids`` ``[1, T]`` (positions ``[1, T]``, and an additive mask
        ``[1, 1, T, past + T]`` for a tree, None for a chain) on top of ``cache``.

        :returns: logits ``[T, V]`` and the last layer's output ``[T, H]``, or None when
            this pass must run eager (not ready, more than :attr:`max_tokens` tokens, an
            empty cache).
        """
        if not self.ready:
            return None
        return self._run(cache, ids, position_ids, mask, allow_recompile=False)

    def _run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        allow_recompile: bool,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        t = ids.shape[1]
        past = cache.length
        if not 1 <= t <= self.max_tokens or past == 0:
            return None
        if self.backend == "kernel":
            out = self._run_kernel(cache, ids, position_ids, mask)
        else:
            # The new tokens' mask among themselves [T, T]; the cached prefix is seen by all.
            block = mask[0, 0, :, past:] if mask is not None else _causal(t, self.fast.embed)
            if self.backend == "inductor":
                out = self._run_dynamic(cache, ids, position_ids, block, allow_recompile)
            else:
                out = self._run_static(cache, ids, position_ids, block)
        if out is not None:
            cache.advance(t)
            self.served += 1
        return out

    def _run_kernel(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._kernel is None:
            return None
        try:
            return decode_step.run(self._kernel, self.fast, cache, ids, position_ids, mask)
        except ValueError as e:  # a cache it cannot take (another dtype)
            self._fail(str(e))
            return None

    def _run_dynamic(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        block: torch.Tensor,
        allow_recompile: bool,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        t, past = ids.shape[1], cache.length
        buffers = cache.buffers(past + t)
        if buffers is None or self._compiled is None:
            return None
        cos, sin = self.fast.rotary_tables(self.fast.embed[None, :1], position_ids)
        write = torch.arange(past, past + t, device=self.device)
        full = None
        if t > 1:
            full = torch.zeros(t, past + t, dtype=block.dtype, device=self.device)
            full[:, past:] = block
            full = self.fast.pack_mask(full[None, None])
        stance = "default" if allow_recompile else "fail_on_recompile"
        try:
            with torch.compiler.set_stance(stance):
                # Fresh strides: a [1, 1] view of a longer row keeps its row stride, and the
                # graph guards on it.
                ids = ids.new_empty((1, t)).copy_(ids)
                return self._compiled(ids, cos, sin, write, buffers, past + t, full)
        except Exception as e:  # a recompile refused while serving, or a failed compile
            self._fail(f"{type(e).__name__}: {e}")
            return None

    def _run_static(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        block: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        t, past = ids.shape[1], cache.length
        bucket = next(b for b in BUCKETS if b >= t)
        buffers = cache.buffers(past + bucket)
        if buffers is None:
            return None
        key = (buffers[0][0].data_ptr(), bucket)
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = StaticGraph(self, buffers, bucket, capture=self.backend == "cudagraph")
            except Exception as e:  # capture failures come in every type
                self._fail(f"capturing a {bucket}-token graph: {type(e).__name__}: {e}")
                return None
            self._graphs[key] = graph
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return graph.replay(ids, position_ids, block, past)

    def _step(
        self,
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: torch.Tensor,
        buffers: Buffers,
        span: int,
        mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step itself, the same arithmetic as :meth:`FastDecoder.forward`.

        :param ids: ``[1, T]``; ``cos``, ``sin``: ``[1, 1, T, D]``.
        :param write: ``[T]`` the cache positions the new keys and values go to.
        :param span: attend over the first ``span`` positions of each buffer.
        :param mask: packed additive ``[1, 1, R*T, span]``, None: all of them.
        :returns: logits ``[T, V]`` and the last hidden states ``[T, H]`` after the final norm.
        """
        fast = self.fast
        h = F.embedding(ids, fast.embed)  # [1, T, H]
        for layer, (kb, vb) in zip(fast.layers, buffers, strict=True):
            q, k, v = fast.qkv(layer, h, cos, sin)
            kb.index_copy_(2, write, k.to(kb.dtype))
            vb.index_copy_(2, write, v.to(vb.dtype))
            o = fast.attend(q, kb[:, :, :span], vb[:, :, :span], mask)
            h = fast.mlp(layer, h, o)
        normed = fast._rms(h, fast.norm)  # [1, T, H]: what the LM head reads
        return fast._lm_head(normed[0]), normed[0]


def default_backend(fast: FastDecoder) -> str:
    """``cudagraph`` on CUDA; on a CPU ``kernel`` where the step kernel takes the model
    (:func:`specd.decode_step.usable`), ``inductor`` elsewhere."""
    device = fast.embed.device
    if device.type == "cuda":
        return "cudagraph"
    if device.type == "cpu" and decode_step.usable(fast):
        return "kernel"
    return "inductor"


def _causal(t: int, like: torch.Tensor) -> torch.Tensor:
    """An additive causal mask ``[T, T]`` in ``like``'s dtype and device."""
    blocked = torch.ones(t, t, dtype=torch.bool, device=like.device).triu_(1)
    return torch.zeros(t, t, dtype=like.dtype, device=like.device).masked_fill_(
        blocked, torch.finfo(like.dtype).min
    )
