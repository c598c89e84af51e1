"""How the ways of storing the default model's weights and KV cache compare, on held-out code.

For each ``--weights`` choice, against the reference (``--reference``, default ``f32@float32``:
the float32 de-quantized copy over a float32 cache):

- ``top1``: how often the choice's most likely next token is float32's, over every position
  of the held-out windows (teacher-forced: both read the same text, in passes of the served
  step, as decoding computes them: the step kernel's int8 products where they are on);
- ``ppl``: perplexity of the held-out text;
- ``greedy_identical``: how often a greedy completion of a HumanEval prompt is token for
  token float32's, and ``first_divergence``: the mean index of the first token that differs
  (the completion's length where none does).

A choice with ``:float`` after it (``native:float``) is loaded with the step's int8 products
off (``SPECD_INT8_PRODUCTS=off``): its blocks decoded to floats. One with ``@float16`` or
``@float32`` after it stores its KV cache so (``--kv-dtype``); else as the reference does.

Held-out text: windows of the Python standard library's own files, which no weight or head
of specd was fitted to. Run it alone on the machine:

    python scripts/weights_quality.py --files 24 --window 512 --prompts 24 --tokens 48 \
        --weights native,native:float,q8,q4 --json OUT.json
    python scripts/weights_quality.py --reference native@float32 \
        --weights native@float16 --json OUT.json  # the cache of halves alone
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

from specd import Engine, SamplingParams
from specd.bench import workloads
from specd.forward import models


def windows(target, files: int, window: int) -> list[list[int]]:
    """One window of ``window`` tokens from each of ``files`` standard-library files, taken
    from every n-th file of the sorted list so the files spread over the library."""
    paths = workloads.source_files(None, min_chars=8 * window)
    step = max(1, len(paths) // files)
    out = []
    for path in paths[::step][:files]:
        ids = target.tokenizer(path.read_text(encoding="utf-8", errors="replace"))["input_ids"]
        if len(ids) > window:
            out.append(list(ids[:window]))
    return out


@torch.inference_mode()
def logits_of(target, ids: list[int]) -> torch.Tensor:
    """Teacher-forced logits of ``ids``, in passes of the served step (16 tokens)."""
    cache = target.new_cache(capacity=len(ids) + 8)
    return torch.cat(
        [target.forward(cache, ids[s : s + 16]).logits for s in range(0, len(ids), 16)]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--weights", default="native,q8,q4")
    ap.add_argument("--reference", default="f32@float32")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    choices = [c for c in args.weights.split(",") if c]
    ref = _load(args.reference)
    texts = windows(ref.target, args.files, args.window)
    prompts = [p.ids for p in workloads.build("humaneval", ref.target, limit=args.prompts)]
    params = SamplingParams(max_tokens=args.tokens)
    t0 = time.perf_counter()
    ref_logits = [logits_of(ref.target, ids) for ids in texts]
    ref_out = [ref.generate(p, params, drafter="none").token_ids for p in prompts]
    rows = {args.reference: _quality(ref_logits, ref_logits, texts, ref_out, ref_out)}
    del ref
    for choice in choices:
        if "@" not in choice:  # the weights compared, the cache held as the reference's
            choice += "@" + (args.reference.partition("@")[2] or "auto")
        engine = _load(choice)
        got = [logits_of(engine.target, ids) for ids in texts]
        out = [engine.generate(p, params, drafter="none").token_ids for p in prompts]
        rows[choice] = _quality(got, ref_logits, texts, out, ref_out)
        rows[choice]["format"] = engine.target.model.weight_format
        rows[choice]["weight_bytes"] = engine.target.weight_bytes()
        rows[choice]["kv_dtype"] = str(engine.target.kv_dtype).removeprefix("torch.")
        print(choice, json.dumps(rows[choice]), flush=True)
        del engine
    report = {
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
        "host": platform.node(),
        "cpu": _cpu(),
        "windows": len(texts),
        "window_tokens": args.window,
        "prompts": len(prompts),
        "tokens": args.tokens,
        "seconds": time.perf_counter() - t0,
        "results": rows,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _load(choice: str) -> Engine:
    """The default model as ``choice`` (``WEIGHTS[:float][@KV_DTYPE]``) stores it."""
    choice, _, kv = choice.partition("@")
    weights, _, products = choice.partition(":")
    os.environ["SPECD_INT8_PRODUCTS"] = "off" if products == "float" else "on"
    return Engine.load(models.DEFAULT_MODEL, weights=weights, kv_dtype=kv or "auto")


def _quality(got, ref, texts, out, ref_out) -> dict:
    agree = total = 0
    nll = 0.0
    for g, r, ids in zip(got, ref, texts, strict=True):
        agree += int((g.argmax(-1) == r.argmax(-1)).sum())
        total += g.shape[0]
        target = torch.tensor(ids[1:])
        nll += float(torch.nn.functional.cross_entropy(g[:-1].float(), target, reduction="sum"))
    firsts = []
    for a, b in zip(out, ref_out, strict=True):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        firsts.append(n if a != b else len(b))
    same = sum(a == b for a, b in zip(out, ref_out))
    return {
        "top1": agree / total,
        "ppl": math.exp(nll / sum(len(t) - 1 for t in texts)),
        "greedy_identical": same / len(out),
        "first_divergence": sum(firsts) / len(firsts),
    }


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
