"""How well the EAGLE head's confidence predicts acceptance: ``eagle`` drafting one node a
step under the ``fixed`` policy over editor prompts, each draft's head probability against
whether the target accepted it, by bins of that probability.

    python scripts/eagle_confidence.py --prompts 12
"""

from __future__ import annotations

import argparse
import math

from specd.plugins.eagle import drafter as eagle_drafter

from specd import Engine, SamplingParams
from specd.bench import workloads
from specd.prefix_cache import PrefixCache

BINS = ((0.0, 0.2), (0.2, 0.4), (0.4, 0.6), (0.6, 0.8), (0.8, 0.9), (0.9, 1.01))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    seen: list[list] = []  # [head probability, accepted] per draft
    cls = eagle_drafter.EagleDrafter
    tree, commit = cls._tree, cls.commit

    def recorded_tree(self, ctx, budget, pending):
        nodes = tree(self, ctx, budget, pending)
        if nodes:
            seen.append([math.exp(max(n.score for n in nodes)), None])
        return nodes

    def heard(self, ctx, new_tokens, accepted):
        if seen and seen[-1][1] is None:
            seen[-1][1] = accepted
        return commit(self, ctx, new_tokens, accepted)

    cls._tree, cls.commit = recorded_tree, heard  # type: ignore[method-assign]
    engine = Engine.load(max_draft=1)
    params = SamplingParams(max_tokens=args.max_tokens)
    for prompt in workloads.build("editor", engine.target, limit=args.prompts):
        engine.prefix_cache = PrefixCache(engine.target.new_cache, max_entries=4)
        engine.generate(prompt.ids, params, drafter="eagle", exit_policy="fixed")
    drafts = [(prob, accepted) for prob, accepted in seen if accepted is not None]
    if not drafts:
        raise SystemExit("no draft was verified")
    print(f"{len(drafts)} one-node drafts, {sum(a for _, a in drafts) / len(drafts):.0%} accepted")
    for lo, hi in BINS:
        part = [a for prob, a in drafts if lo <= prob < hi]
        if part:
            print(
                f"head probability {lo:.1f}-{min(hi, 1.0):.1f}: {len(part):4d} drafts "
                f"({len(part) / len(drafts):.0%}), {sum(part) / len(part):.0%} accepted"
            )


if __name__ == "__main__":
    main()
