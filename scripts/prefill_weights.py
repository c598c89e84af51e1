"""The prefill of editor prompts (1k tokens of real source) under one weight storage: the
seconds of each prefill, three per prompt, and the fastest.

    python scripts/prefill_weights.py auto
    python scripts/prefill_weights.py f32 on      # float32 copy, prepacked weights
    python scripts/prefill_weights.py auto --blocks-both   # on blocks: prepacked values and
                                                           # F.linear, in turn
"""

from __future__ import annotations

import sys
import time

from specd import Engine
from specd.bench import workloads


def main() -> None:
    both = "--blocks-both" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--blocks-both"]
    if not args:
        raise SystemExit("usage: prefill_weights.py WEIGHTS [PACKED_WEIGHTS] [--blocks-both]")
    options = {"weights": args[0]} | ({"packed_weights": args[1]} if len(args) > 1 else {})
    engine = Engine.load(None, **options)
    prompts = workloads.build("editor", engine.target, limit=2)
    fast = engine.target.fast
    if both and (fast is None or not fast.quantized):
        raise SystemExit("--blocks-both needs weights stored as blocks (e.g. auto)")
    # --blocks-both: the choice the first prefill would measure (WeightProducts._packs_blocks),
    # made here instead, alternating prefill by prefill so the machine's drift hits both
    choices = [True, False] if both else [None]
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
        label = {None: "", True: " prepacked", False: " F.linear"}[choice]
        print(args, label, f"fastest {min(ts) * 1e3:.0f} ms", [round(x * 1e3) for x in ts])
    if both:
        ratios = sorted(a / b for a, b in zip(times[True], times[False]))
        print(f"prepacked / F.linear, prefill by prefill: median {ratios[len(ratios) // 2]:.2f}")


if __name__ == "__main__":
    main()
