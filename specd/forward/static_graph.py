"""CUDA graphs: the ``cudagraph`` backend (:class:`GraphStep`) replays fixed-shape passes
(:class:`StaticGraph`) captured over a cache's fixed buffers; the ``static`` backend calls
the same passes uncaptured, so every part of the CUDA path but the capture itself runs,
and is tested, on a CPU.

A graph's shapes and addresses are fixed when it is captured, so a pass attends over the
buffer's whole capacity (positions past the live ones are masked out), its tokens are padded
up to a bucket of :data:`~specd.forward.step.BUCKETS`, and a graph is captured per
(buffers, bucket); it replays until the cache outgrows its buffer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch

from ..errors import BadInputError
from ..kvcache import KVCache
from .fastpath import FastDecoder
from .step import BUCKETS, MAX_TOKENS, Buffers, PassOut, check, new_block

#: CUDA graphs kept (per cache buffer and bucket), least recently used dropped first.
MAX_GRAPHS = 32

#: ``(ids, cos, sin, write, buffers, span, mask) -> (logits, hidden)``: the pass a graph
#: captures (:func:`specd.forward.step.fixed_pass` over a lean forward).
FixedPass = Callable[..., PassOut]


class StaticGraph:
    """One fixed-shape pass over fixed buffers: every input is copied into a tensor made
    here, and ``step`` is replayed from a captured CUDA graph (or called, uncaptured).

    :param step: the pass to capture (:data:`FixedPass`).
    """

    def __init__(
        self, step: FixedPass, fast: FastDecoder, buffers: Buffers, bucket: int, *, capture: bool
    ) -> None:
        dev = fast.embed.device
        cap = buffers[0][0].shape[2]
        self.bucket, self.capacity = bucket, cap
        self.ids = torch.zeros((1, bucket), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1, bucket), dtype=torch.long, device=dev)
        # Before the first replay, writes go to the buffer's last slots, never live ones.
        self.write = torch.arange(cap - bucket, cap, device=dev)
        self.mask = torch.zeros((1, 1, bucket, cap), dtype=fast.embed.dtype, device=dev)
        self.cos, self.sin = fast.rotary_at(self.pos)
        self._fast = fast

        def run() -> PassOut:
            mask = fast.pack_mask(self.mask)
            return step(self.ids, self.cos, self.sin, self.write, buffers, cap, mask)

        self._step = run
        self._graph: Any = None
        if capture:
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up allocations outside the graph
                    run()
            torch.cuda.current_stream(dev).wait_stream(stream)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._out = run()

    def replay(
        self, ids: torch.Tensor, position_ids: torch.Tensor, block: torch.Tensor, past: int
    ) -> PassOut:
        t, b = ids.shape[1], self.bucket
        self.ids.zero_()
        self.ids[:, :t] = ids
        self.pos.copy_(position_ids[:, -1:].expand(1, b))
        self.pos[:, :t] = position_ids
        cos, sin = self._fast.rotary_at(self.pos)
        self.cos.copy_(cos)
        self.sin.copy_(sin)
        self.write.copy_(torch.arange(past, past + b, device=self.write.device))
        # Real rows see the cached prefix and the tree among the new tokens; padding rows
        # see the prefix and themselves (a row that sees nothing would be NaN).
        m = self.mask[0, 0]
        m.fill_(torch.finfo(m.dtype).min)
        m[:, :past] = 0
        m[:t, past : past + t] = block
        pad = torch.arange(t, b, device=m.device)
        m[pad, past + pad] = 0
        if self._graph is not None:
            self._graph.replay()
            logits, hidden = self._out
        else:
            logits, hidden = self._step()
        # The graph's outputs are overwritten by its next replay.
        return logits[:t].clone(), hidden[:t].clone()


class GraphStep:
    """The ``cudagraph`` backend (``capture``, CUDA only) or the ``static`` one (its passes
    called uncaptured, on any device): passes of 1-16 tokens, a chain or a tree.

    :param step: the pass its graphs run (:data:`FixedPass`).
    :raises BadInputError: capturing asked for on a device other than CUDA.
    """

    max_tokens = MAX_TOKENS
    off = ""

    def __init__(self, fast: FastDecoder, step: FixedPass, *, capture: bool) -> None:
        device = fast.embed.device
        if capture and device.type != "cuda":
            raise BadInputError(f"CUDA graphs need a CUDA device, the model is on {device}")
        self.name = "cudagraph" if capture else "static"
        self.fast, self.capture, self._step = fast, capture, step
        self._graphs: OrderedDict[tuple[int, int], StaticGraph] = OrderedDict()

    def prepare(self, new_cache: Callable[[], KVCache]) -> None:
        """Capture the graphs of a one- and an eight-token bucket on a scratch cache and
        check what they compute (:func:`specd.forward.step.check`)."""
        check(self, self.fast, new_cache)

    def run(
        self,
        cache: KVCache,
        ids: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> PassOut | None:
        t, past = ids.shape[1], cache.length
        if not 1 <= t <= self.max_tokens or past == 0:
            return None
        bucket = next(b for b in BUCKETS if b >= t)
        buffers = cache.buffers(past + bucket)
        if buffers is None:
            return None
        key = (buffers[0][0].data_ptr(), bucket)
        graph = self._graphs.get(key)
        if graph is None:
            try:
                graph = StaticGraph(self._step, self.fast, buffers, bucket, capture=self.capture)
            except Exception as e:  # capture failures come in every type
                msg = f"capturing a {bucket}-token graph: {type(e).__name__}: {e}"
                raise RuntimeError(msg) from e
            self._graphs[key] = graph
            while len(self._graphs) > MAX_GRAPHS:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        out = graph.replay(ids, position_ids, new_block(t, past, mask, self.fast.embed), past)
        cache.advance(t)
        return out
