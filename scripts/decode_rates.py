"""Decoding alone, per drafter: editor prompts through one engine, the drafters in the order
given (repeat a name to run it again), each request on an empty prefix cache; for each,
the milliseconds a new token took after the prefill, target passes, drafted tokens, and the
seconds spent drafting and verifying. The engine's own clock of each drafter's cost
(``DraftClock``, in one-token steps) is printed too.

    python scripts/decode_rates.py none eagle none eagle hybrid ngram
"""

from __future__ import annotations

import sys

from specd import Engine, SamplingParams
from specd.bench import workloads
from specd.prefix_cache import PrefixCache


def main() -> None:
    drafters = sys.argv[1:] or ["none", "ngram", "hybrid", "eagle"]
    engine = Engine.load()
    prompts = workloads.build("editor", engine.target, limit=4)
    engine.generate(prompts[0].ids, SamplingParams(max_tokens=8), drafter=drafters[0])  # warm
    for name in drafters:
        tokens = steps = drafted = 0
        draft_s = verify_s = decode_s = 0.0
        for prompt in prompts:
            engine.prefix_cache = PrefixCache(engine.target.new_cache, max_entries=4)
            stats = engine.generate(prompt.ids, SamplingParams(max_tokens=64), drafter=name).stats
            tokens += stats.new_tokens
            steps += stats.target_steps
            drafted += stats.drafted
            draft_s += stats.draft_s
            verify_s += stats.verify_s
            decode_s += stats.total_s - stats.prefill_s
        clock = engine._clocks.get(name)
        cost = f"{clock.cost(4):.2f}" if clock is not None else "-"
        print(
            f"{name:8s} {decode_s / tokens * 1e3:6.2f} ms/token, {steps} passes for {tokens} "
            f"tokens, {drafted} drafted; drafting {draft_s:.2f} s, verifying {verify_s:.2f} s; "
            f"a 4-token draft costs {cost} steps"
        )


if __name__ == "__main__":
    main()
