"""The ``eagle`` drafter's acceptance by ``window`` (the true entries its head attends to, and
the prompt's features the prefill computes for it): editor prompts, greedy, the ``fixed``
exit policy so that every step drafts, each window in turn on the same prompts.

    python scripts/eagle_window.py 512 256 128
    python scripts/eagle_window.py --source .venv/lib/python3.11/site-packages/hypothesis 512 256
"""

from __future__ import annotations

import argparse

from specd import Engine, SamplingParams
from specd.bench import workloads


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("windows", nargs="+", type=int)
    p.add_argument("--source", default=None, help="source files (default: the standard library)")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    target = Engine.load(drafter="none").target
    prompts = workloads.build("editor", target, limit=args.limit, source=args.source)
    for window in args.windows:
        engine = Engine(target, exit_policy="fixed", drafter_options={"eagle": {"window": window}})
        accepted = drafted = steps = tokens = 0
        for prompt in prompts:
            params = SamplingParams(max_tokens=args.max_tokens)
            stats = engine.generate(prompt.ids, params, drafter="eagle").stats
            accepted += stats.accepted
            drafted += stats.drafted
            steps += stats.target_steps
            tokens += stats.new_tokens
        print(
            f"window {window}: {tokens} tokens in {steps} passes (mean acceptance length "
            f"{tokens / steps:.2f}), {accepted} of {drafted} draft nodes accepted"
        )


if __name__ == "__main__":
    main()
