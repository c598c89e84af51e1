"""What the EAGLE head pays to read a prompt before its first draft.

The drafter appends one head entry per committed token the next time it is asked for a
draft, all in one call. Only the newest entry's output is read, so the others need their
keys and values only (``last_only``). This prints the median milliseconds of that call over
N entries with every row through the layer and with the newest only, in turn.

    python scripts/eagle_catchup.py --entries 511 1023
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from specd.plugins.eagle.drafter import EagleDrafter

from specd import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--entries", type=int, nargs="+", default=[511, 1023])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="each mode this many times, in turn")
    args = ap.parse_args()
    target = Engine.load(args.model, drafter="none").target
    drafter = EagleDrafter()
    drafter._load(target)
    hidden = target.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    for n in args.entries:
        feat = torch.randn(n, hidden, generator=gen, dtype=target.dtype) * 0.5
        tokens = torch.randint(0, target.vocab_size, (n,), generator=gen)
        for _ in range(args.rounds):
            for last_only in (False, True):
                times = []
                for _ in range(args.repeat):
                    drafter._reset()
                    with torch.inference_mode():
                        t0 = time.perf_counter()
                        drafter._entries(feat, tokens, list(range(n)), None, last_only=last_only)
                        times.append(time.perf_counter() - t0)
                mode = "newest only" if last_only else "every row"
                print(f"{n} entries, {mode}: {statistics.median(times) * 1000:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
