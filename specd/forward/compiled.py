"""The compiled decode step: the lean forward's decode and verify passes run by one
:class:`~specd.forward.step.StepBackend`, chosen once per load (:func:`choose`).

A one-token step of a small model spends a good part of its time dispatching some thirty
small elementwise operations per layer from Python. Compiled, a pass of 1-16 tokens (the
pending token and a draft, a chain or a tree) on top of a cache that already holds tokens
runs as one call of specd's step kernel, as a few fused loops, or as one replayed CUDA
graph; prefill, early exit and every pass until the backend is ready run eager.

- ``kernel`` (:class:`KernelStep`, CPU): a whole pass in one C++ call
  (:mod:`specd.forward.decode_step`); passes whose mask hides a cached position run eager.
  On a 2-vCPU EPYC it ran a 1k-context step in ~15 ms where the inductor step took 20-26
  and the eager one 28-45, and an 8-token verify pass in ~22 ms against ~41 eager
  (docs/benchmarks.md).
- ``inductor`` (:class:`InductorStep`): ``torch.compile`` with dynamic shapes, one graph
  for every cache length. On a CPU only the one-token step compiles: its products and
  attention written as plain reductions the compiler fuses into loops that stream the
  weights and the cache; compiled, a pass of 2-8 tokens took 61-64 ms against 24-30 eager
  at 1k context on a 2-vCPU EPYC. On CUDA a second graph serves passes of several tokens.
- ``cudagraph`` and ``static`` (:class:`specd.forward.static_graph.GraphStep`): CUDA graphs,
  and their arithmetic run uncaptured on any device, for tests.
- ``eager`` (:class:`specd.forward.step.EagerStep`): the lean forward itself.

Where preparing a backend fails, or one raises while serving (a recompile it would need, a
cache it cannot take), it turns off, the reason is logged once, and the passes run eager.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch
from torch.fx.experimental import _config as fx_config

from ..errors import BadInputError
from ..kvcache import KVCache
from . import decode_step, pricing, step
from .fastpath import FastDecoder
from .static_graph import GraphStep
from .step import MAX_TOKENS, Buffers, EagerStep, PassOut, StepBackend, check, fixed_pass, new_block

log = logging.getLogger(__name__)

#: Cached tokens of the scratch run ``torch.compile`` compiles on.
SCRATCH_CONTEXT = 512


#: A chain longer than a backend's passes runs as several of them where it takes this many
#: tokens or more (fewer: as one eager pass).
PIECE_TOKENS = 8


class KernelStep:
    """The ``kernel`` backend: specd's step kernel over the lean forward's weights, built
    when it is made (:attr:`off` says why not, where the host or the model rules it out)
    and checked against the eager pass once, in :meth:`prepare`.

    :raises BadInputError: a model on another device than the CPU.
    """

    name = "kernel"
    max_tokens = MAX_TOKENS

    def __init__(self, fast: FastDecoder) -> None:
        if fast.embed.device.type != "cpu":
            raise BadInputError(
                f"the step kernel runs on a CPU, the model is on {fast.embed.device}"
            )
        self.fast = fast
        self.off = ""
        self._kernel: decode_step.DecodeStep | None = None
        try:
            self._kernel = decode_step.for_decoder(fast)
        except (ValueError, RuntimeError) as e:  # sizes, weights or a host it does not take
            self.off = str(e)

    @property
    def int8_products(self) -> bool:
        """Whether its products over quantized weights round activations to int8."""
        return self._kernel is not None and self._kernel.woven > 0

    @property
    def tolerance(self) -> float:
        """How far its passes may be from the eager pass's (:func:`specd.forward.step.check`):
        further where Q4 products round activations to int8."""
        return step.INT8_TOLERANCE if self.int8_products else step.TOLERANCE

    #: what a passed check is remembered under (:func:`.pricing.check_passed`); None: check
    #: at every load
    verdict: dict | None = None

    def prepare(self, new_cache: Callable[[], KVCache]) -> None:
        if self._kernel is None:
            raise RuntimeError(self.off)
        if self.verdict is not None and pricing.check_passed(self.verdict):
            return  # this build passed on this model and machine: a start need not re-run it
        check(self, self.fast, new_cache)
        if self.verdict is not None:
            pricing.record_check(self.verdict)

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        t = ids.shape[1]
        if self._kernel is None or not 1 <= t <= self.max_tokens:
            return None
        out = decode_step.run(self._kernel, self.fast, cache, ids, position_ids, mask)
        if out is not None:
            cache.advance(t)
        return out


class InductorStep:
    """The ``inductor`` backend: :func:`specd.forward.step.fixed_pass` compiled by
    ``torch.compile`` with dynamic shapes; ``span`` is the live length plus the pass's
    tokens. On a CPU only one-token steps (:attr:`max_tokens`)."""

    name = "inductor"

    def __init__(self, fast: FastDecoder) -> None:
        self.fast = fast
        #: weights as blocks: the compiler would trace their de-quantization, a float32
        #: copy of every weight each step
        self.off = "the weights are stored as blocks" if fast.quantized else ""
        self.device = fast.embed.device
        self.max_tokens = 1 if self.device.type == "cpu" else MAX_TOKENS
        self._compiled: Callable[..., PassOut] | None = None

    def prepare(self, new_cache: Callable[[], KVCache]) -> None:
        """Compile on a scratch cache of a real request's size (the compiler sizes its loops
        by the lengths it sees: over a 4-token cache it ran the attention of a 1k context on
        one thread), then check it (:func:`specd.forward.step.check`)."""
        fast = self.fast
        self._compiled = torch.compile(fixed_over(fast), dynamic=True, fullgraph=True)
        # Sizes equal by chance in the scratch run must not become one symbol, or the first
        # real call with different sizes would recompile.
        with torch.inference_mode(), fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
            cache = new_cache()
            n = SCRATCH_CONTEXT
            ids = torch.arange(n, device=self.device)[None] % fast.embed.shape[0]
            fast.forward(cache, ids, torch.arange(n, device=self.device)[None], None)
            # One token, then several (a chain): every graph compiled here. Then one and
            # three more, refusing recompiles, as serving will: a guard the scratch inputs
            # happened to pass fails here, not mid-request.
            runs = ((1, True), (2, True), (1, False), (3, False))
            for t, recompile in [r for r in runs if r[0] <= self.max_tokens]:
                tokens = ids[:, :t]  # a view: its strides differ from a request's
                pos = torch.arange(cache.length, cache.length + t, device=self.device)[None]
                if self._run(cache, tokens, pos, None, allow_recompile=recompile) is None:
                    raise RuntimeError("the compiled step did not run")
        check(self, fast, new_cache)

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        return self._run(cache, ids, position_ids, mask, allow_recompile=False)

    def _run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        *,
        allow_recompile: bool,
    ) -> PassOut | None:
        t, past = ids.shape[1], cache.length
        if not 1 <= t <= self.max_tokens or past == 0:
            return None
        buffers: Buffers | None = cache.buffers(past + t)
        if buffers is None or self._compiled is None:
            return None
        block = new_block(t, past, mask, self.fast.embed)
        cos, sin = self.fast.rotary_at(position_ids)
        write = torch.arange(past, past + t, device=self.device)
        full = None
        if t > 1:
            full = torch.zeros(t, past + t, dtype=block.dtype, device=self.device)
            full[:, past:] = block
            full = self.fast.pack_mask(full[None, None])
        # A recompile while serving is refused (it raises; the step turns off).
        with torch.compiler.set_stance("default" if allow_recompile else "fail_on_recompile"):
            # Fresh strides: a [1, 1] view of a longer row keeps its row stride, and the
            # graph guards on it.
            ids = ids.new_empty((1, t)).copy_(ids)
            out = self._compiled(ids, cos, sin, write, buffers, past + t, full)
        cache.advance(t)
        return out


def fixed_over(fast: FastDecoder) -> Callable[..., PassOut]:
    """:func:`specd.forward.step.fixed_pass` over ``fast``: what ``torch.compile`` compiles
    and a graph captures."""

    def step(
        ids: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write: torch.Tensor,
        buffers: Buffers,
        span: int,
        mask: torch.Tensor | None,
    ) -> PassOut:
        return fixed_pass(fast, ids, cos, sin, write, buffers, span, mask)

    return step


#: What makes each backend, by the name ``Target.compile`` takes.
MAKERS: dict[str, Callable[[FastDecoder], StepBackend]] = {
    "kernel": KernelStep,
    "inductor": InductorStep,
    "cudagraph": lambda fast: GraphStep(fast, fixed_over(fast), capture=True),
    "static": lambda fast: GraphStep(fast, fixed_over(fast), capture=False),
    "eager": EagerStep,
}
BACKENDS = tuple(MAKERS)


def choose(fast: FastDecoder, name: str | None = None, *, slow: bool = True) -> StepBackend:
    """The backend that serves ``fast``'s passes, chosen once per load: ``name`` where the
    user named one; else the best one this device, dtype and host take: CUDA graphs on
    CUDA; on a CPU the step kernel where it takes the model (float32 weights, sizes in
    multiples of 16, a host with the kernels), then, with ``slow``, ``torch.compile``
    (minutes to compile on a CPU); the lean forward where none does. Logs one line naming
    the choice and why each better one is off.

    :raises BadInputError: an unknown name, or a backend the model's device cannot run.
    """
    backend, skipped = _pick(fast, name, slow)
    log.info("decode step: %s%s", backend.name, f" ({'; '.join(skipped)})" if skipped else "")
    return backend


def default_backend(fast: FastDecoder) -> str:
    """The name of the backend :func:`choose` picks for ``fast`` with compiling on."""
    return _pick(fast, None, True)[0].name


def _pick(fast: FastDecoder, name: str | None, slow: bool) -> tuple[StepBackend, list[str]]:
    if name is not None:
        if name not in MAKERS:
            raise BadInputError(f"unknown compile backend {name!r}; choose from {BACKENDS}")
        return MAKERS[name](fast), ["asked for"]
    device = fast.embed.device.type
    order = {"cuda": ("cudagraph",), "cpu": ("kernel", "inductor")}.get(device, ("inductor",))
    skipped = []
    for candidate in order:
        if candidate == "inductor" and not slow:
            skipped.append("inductor not tried: compiling takes minutes (--compile on)")
            break
        backend = MAKERS[candidate](fast)
        if not backend.off:
            return backend, skipped
        skipped.append(f"{candidate} off: {backend.off}")
    return EagerStep(fast), skipped


class CompiledStep:
    """The passes one :class:`~specd.forward.step.StepBackend` serves, and its life: made
    once, prepared once (now or in a thread, while passes run eager), serving once its
    check passes, and turned off (passes run eager, the reason logged once) when preparing
    fails or a pass raises.

    :param fast: the lean forward whose passes it serves.
    :param backend: the backend, or its name (default: :func:`choose`, compiling on).
    """

    def __init__(self, fast: FastDecoder, backend: StepBackend | str | None = None) -> None:
        if backend is None or isinstance(backend, str):
            backend = choose(fast, backend)
        self.fast = fast
        self.chosen: StepBackend = backend
        #: ``off`` (not started), ``compiling``, ``ready`` or ``failed`` (see ``reason``)
        self.state = "off"
        self.reason = ""
        #: seconds preparing it (compiling, capturing, building and checking) took
        self.compile_s: float | None = None
        #: passes the chosen backend has served
        self.served = 0
        self._eager = EagerStep(fast)
        self._serving: StepBackend = self._eager
        self._thread: threading.Thread | None = None

    @property
    def backend(self) -> str:
        """The chosen backend's name."""
        return self.chosen.name

    @property
    def max_tokens(self) -> int:
        """The most tokens a pass the chosen backend serves holds (more run eager)."""
        return self.chosen.max_tokens

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def int8_products(self) -> bool:
        """Whether the passes it serves multiply quantized weights with int8 activations
        (:mod:`.interleave`)."""
        return self.ready and bool(getattr(self.chosen, "int8_products", False))

    def prepare(self, new_cache: Callable[[], KVCache], *, background: bool = False) -> None:
        """Prepare the backend on a scratch cache (:meth:`StepBackend.prepare`), then serve
        through it; with ``background``, in a thread while passes run eager. Once only.

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
        try:
            self.chosen.prepare(new_cache)
        except Exception as e:  # build, compile, capture and check failures of every type
            self._fail(f"{type(e).__name__}: {e}")
            return
        self.compile_s = time.perf_counter() - t0
        self._serving = self.chosen
        self.state = "ready"
        log.info("decode step ready (%s, %.1f s)", self.backend, self.compile_s)

    def _fail(self, reason: str) -> None:
        self._serving = self._eager
        self.state, self.reason = "failed", reason
        log.warning("compiled decode step off, running eager (%s): %s", self.backend, reason)

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        """One pass (:meth:`StepBackend.run`) through the chosen backend once it is ready,
        through the eager one before and after it turns off.

        :returns: logits ``[T, V]`` and the last layer's output ``[T, H]``, or None for a
            pass the backend does not take (the caller runs it eager).
        """
        serving = self._serving
        t, past = ids.shape[1], cache.length
        # a chain longer than the backend's passes (a draft past its width): as passes it
        # takes, so each token is computed as plain decoding's steps compute it
        width = serving.max_tokens if mask is None and t > serving.max_tokens >= PIECE_TOKENS else t
        outs: list[PassOut] = []
        try:
            for s in range(0, t, width):
                out = serving.run(
                    cache, ids[:, s : s + width], position_ids[:, s : s + width], mask
                )
                if out is None:
                    cache.crop(past)
                    return None
                outs.append(out)
        except Exception as e:  # a recompile refused, a cache it cannot take, ...
            cache.crop(past)
            self._fail(f"{type(e).__name__}: {e}")
            return None
        if serving is self.chosen:
            self.served += 1
        if len(outs) == 1:
            return outs[0]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])
