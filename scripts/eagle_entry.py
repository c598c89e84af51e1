"""What the EAGLE head costs per step on this host: one true entry fed to its cache (its
queries, keys and values, attention and MLP) and the draft vocabulary's scores of its
output, as the drafter runs them after each step, in a loop over an editor prompt's head
cache; the median of 9 rounds of 100, in milliseconds.

    python scripts/eagle_entry.py
"""

from __future__ import annotations

import statistics
import time

import torch

from specd import Engine, SamplingParams
from specd.bench import workloads


def main() -> None:
    engine = Engine.load(max_draft=1)
    prompt = workloads.build("editor", engine.target, limit=1)[0]
    params = SamplingParams(max_tokens=32)
    engine.generate(prompt.ids, params, drafter="eagle", exit_policy="fixed")
    d = engine.plugins.drafter("eagle")
    entries, pos = d._cache.length, d._pos[-1] + 1
    feat, token = d._ins[-1][None], torch.tensor([d._tokens[pos]])

    def one() -> None:
        with torch.inference_mode():
            d._logp(d._entries(feat, token, [pos], None, last_only=True))
        d._crop(entries)

    for _ in range(50):
        one()
    rounds = []
    for _ in range(9):
        t = time.perf_counter()
        for _ in range(100):
            one()
        rounds.append((time.perf_counter() - t) / 100 * 1e3)
    print(f"an entry and its draft scores: {statistics.median(rounds):.3f} ms")


if __name__ == "__main__":
    main()
