"""The prefill of editor prompts (1k tokens of real source) under one weight storage: the
seconds of each prefill, three per prompt, and the fastest.

    python scripts/prefill_weights.py auto
    python scripts/prefill_weights.py f32 on      # float32 copy, prepacked weights
"""

from __future__ import annotations

import sys
import time

from specd import Engine
from specd.bench import workloads


def main() -> None:
    args = sys.argv[1:]
    if not args:
        raise SystemExit("usage: prefill_weights.py WEIGHTS [PACKED_WEIGHTS]")
    options = {"weights": args[0]} | ({"packed_weights": args[1]} if len(args) > 1 else {})
    engine = Engine.load(None, **options)
    times = []
    for prompt in workloads.build("editor", engine.target, limit=2):
        for _ in range(3):
            cache = engine.target.new_cache()
            t = time.perf_counter()
            engine.target.prefill(cache, prompt.ids)
            times.append(time.perf_counter() - t)
    print(args, f"fastest {min(times) * 1e3:.0f} ms", [round(x * 1e3) for x in times])


if __name__ == "__main__":
    main()
