"""The prefill of editor prompts (1k tokens of real source) under one weight storage: the
seconds of each prefill, three per prompt, and the fastest.

    python scripts/prefill_weights.py auto
    python scripts/prefill_weights.py f32 on      # float32 copy, prepacked weights
    python scripts/prefill_weights.py auto --blocks-all    # on blocks: each product a prefill
                                                           # may use (int8, prepacked, linear),
                                                           # in turn
"""

from __future__ import annotations

import sys
import time

from specd import Engine
from specd.bench import workloads


def main() -> None:
    every = "--blocks-all" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--blocks-all"]
    if not args:
        raise SystemExit("usage: prefill_weights.py WEIGHTS [PACKED_WEIGHTS] [--blocks-all]")
    options = {"weights": args[0]} | ({"packed_weights": args[1]} if len(args) > 1 else {})
    engine = Engine.load(None, **options)
    prompts = workloads.build("editor", engine.target, limit=2)
    fast = engine.target.fast
    if every and (fast is None or not fast.quantized):
        raise SystemExit("--blocks-all needs weights stored as blocks (e.g. auto)")
    # --blocks-all: the choice the first prefill would measure (WeightProducts._prefill_product),
    # made here instead, alternating prefill by prefill so the machine's drift hits each
    choices: list = fast._prefill_products() if every else [None]  # type: ignore[union-attr]
    times: dict = {c: [] for c in choices}
    for prompt in prompts:
        for _ in range(3):
            for choice in choices:
                if choice is not None:
                    fast._block_prefill = choice  # type: ignore[union-attr]
                cache = engine.target.new_cache()
                t = time.perf_counter()
                engine.target.prefill(cache, prompt.ids)
                times[choice].append(time.perf_counter() - t)
    for choice, ts in times.items():
        label = f" {choice}" if choice else ""
        print(args, label, f"fastest {min(ts) * 1e3:.0f} ms", [round(x * 1e3) for x in ts])
    for choice in choices[1:]:
        ratios = sorted(a / b for a, b in zip(times[choices[0]], times[choice]))
        print(f"{choices[0]} / {choice}, prefill by prefill: median {ratios[len(ratios) // 2]:.2f}")


if __name__ == "__main__":
    main()
