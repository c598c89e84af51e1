"""One fixed-shape pass of the compiled step (:mod:`specd.compiled`) over fixed buffers:
the ``cudagraph`` backend replays it from a captured CUDA graph, the ``static`` backend
calls it uncaptured, so the CUDA path's arithmetic runs, and is tested, on a CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .compiled import CompiledStep

Buffers = list[tuple[torch.Tensor, torch.Tensor]]


class StaticGraph:
    """One fixed-shape step over fixed buffers: every input is copied into a tensor made
    here, and the step is replayed from a captured CUDA graph (or called, uncaptured)."""

    def __init__(self, owner: CompiledStep, buffers: Buffers, bucket: int, *, capture: bool):
        fast, dev = owner.fast, owner.device
        cap = buffers[0][0].shape[2]
        self.bucket, self.capacity = bucket, cap
        self.ids = torch.zeros((1, bucket), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1, bucket), dtype=torch.long, device=dev)
        # Before the first replay, writes go to the buffer's last slots, never live ones.
        self.write = torch.arange(cap - bucket, cap, device=dev)
        self.mask = torch.zeros((1, 1, bucket, cap), dtype=fast.embed.dtype, device=dev)
        self.cos, self.sin = fast.rotary_tables(fast.embed[None, :1], self.pos)
        self._fast = fast

        def step() -> tuple[torch.Tensor, torch.Tensor]:
            return owner._step(
                self.ids, self.cos, self.sin, self.write, buffers, cap, fast.pack_mask(self.mask)
            )

        self._step = step
        self._graph: Any = None
        if capture:
            stream = torch.cuda.Stream(device=dev)
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm up allocations outside the graph
                    step()
            torch.cuda.current_stream(dev).wait_stream(stream)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._out = step()

    def replay(
        self, ids: torch.Tensor, position_ids: torch.Tensor, block: torch.Tensor, past: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t, b = ids.shape[1], self.bucket
        self.ids.zero_()
        self.ids[:, :t] = ids
        self.pos.copy_(position_ids[:, -1:].expand(1, b))
        self.pos[:, :t] = position_ids
        cos, sin = self._fast.rotary_tables(self._fast.embed[None, :1], self.pos)
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
