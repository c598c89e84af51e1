"""How the cost of one target step grows with the tokens it verifies.

Speculation trades one forward over 1 + k tokens for up to 1 + k tokens of output; it pays
while that forward costs about as much as a one-token step (the step is memory-bound: it
reads every weight once whatever the token count). A batched server already fills the
step with other requests' tokens, so what matters there is the same curve read at
batch x (1 + k) tokens. This prints the median seconds of a forward of T tokens on top of
a cached context, T = 1, 2, 4, ..., for the capacity model in docs/scale-out.md.

    OMP_NUM_THREADS=1 python scripts/step_cost.py --model smollm2-135m --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specd import Engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--widths", default="1,2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default=None, help="cpu | cuda[:N] | mps (default: the best)")
    p.add_argument("--dtype", default=None)
    p.add_argument("--packed-weights", choices=("auto", "on", "off"), default="off")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = Engine.load(
        args.model,
        dtype=args.dtype,
        device=args.device,
        drafter="none",
        packed_weights=args.packed_weights,
    ).target
    tokens = [(i * 7919) % 1000 + 100 for i in range(args.context + 128)]
    cache = target.new_cache(capacity=args.context + 128)
    target.prefill(cache, tokens[: args.context])
    rows = []
    for width in (int(w) for w in args.widths.split(",")):
        times = []
        for _ in range(args.repeats + 1):
            t0 = time.perf_counter()
            target.forward(cache, tokens[args.context : args.context + width])
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            cache.crop(args.context)
        median = statistics.median(times[1:])
        rows.append({"tokens": width, "median_s": median})
    one = rows[0]["median_s"]
    for r in rows:
        r["vs_one_token"] = r["median_s"] / one
    print(json.dumps({"model": target.name, "context": args.context, "rows": rows}))


if __name__ == "__main__":
    main()
