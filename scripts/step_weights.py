"""The step kernel on the default model's GGUF blocks against the same kernel on the float32
de-quantized copy, alternating in one process: the median and fastest time of a pass of T
tokens on top of a cached context, and whether the two give the same logits.

    python scripts/step_weights.py --context 1024 --widths 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specd.bench import floor
from specd.forward import blocks, decode_step
from specd.forward.decode_step import LAYER_WEIGHTS, DecodeStep
from specd.forward.models import ALIASES, DEFAULT_MODEL, gguf_path, load_target

MATRICES = {"wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
            "wo": "self_attn.o_proj", "wg": "mlp.gate_proj", "wu": "mlp.up_proj",
            "wd": "mlp.down_proj"}  # fmt: skip


def steps(fast, tensors) -> dict[str, DecodeStep]:
    sizes = dict(heads=fast.n_heads, kv_heads=fast.n_kv, head_dim=fast.head_dim, eps=fast.eps,
                 scale=fast.scaling)  # fmt: skip
    out = {}
    for name, quantized in (("f32", False), ("blocks", True)):
        layers = []
        for i, layer in enumerate(fast.layers):
            row = []
            for w in LAYER_WEIGHTS:
                if quantized and w in MATRICES:
                    row.append(tensors[f"model.layers.{i}.{MATRICES[w]}.weight"])
                else:
                    row.append(getattr(layer, w))
            layers.append(tuple(row))
        embed = tensors["model.embed_tokens.weight"] if quantized else fast.embed
        lm = embed if quantized else fast.lm_head
        out[name] = DecodeStep(layers, embed, fast.norm, lm, None, **sizes)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--widths", default="1,2,4,8,16")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    target = load_target(DEFAULT_MODEL, weights="f32")
    fast = target.fast
    tensors, _ = blocks.read_gguf(gguf_path(ALIASES[DEFAULT_MODEL]))
    kernels = steps(fast, tensors)
    cache, token = floor.prepare(target, args.context)
    ctx = cache.length
    print(f"threads {torch.get_num_threads()}, read {floor.read_bandwidth_gb_s():.1f} GB/s")
    for t in (int(w) for w in args.widths.split(",")):
        ids = torch.tensor([[token] * t])
        pos = torch.arange(ctx, ctx + t)[None]
        times: dict[str, list[float]] = {name: [] for name in kernels}
        logits = {}
        for _ in range(args.repeats):
            for name, kernel in kernels.items():  # alternating
                t0 = time.perf_counter()
                logits[name] = decode_step.run(kernel, fast, cache, ids, pos)[0]
                times[name].append(time.perf_counter() - t0)
        same = torch.equal(logits["f32"], logits["blocks"])
        line = ", ".join(
            f"{name} {statistics.median(ts) * 1e3:.2f} ms (min {min(ts) * 1e3:.2f})"
            for name, ts in times.items()
        )
        print(f"{t:2d} tokens: {line}; equal logits: {same}")


if __name__ == "__main__":
    main()
