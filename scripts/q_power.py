"""How small a dishonest q does ``drafter/q-honesty`` catch? Planted deviations, measured.

A bigram drafter (a fixed random table of next-token scores, as in tests/verify/mutants.py)
draws its tokens correctly and reports a q that is off by a planted amount:

- ``tv``: at every node a mass ``d`` moved from the row's likeliest token to its second
  likeliest (total variation ``d``; about the hardest direction to see for that TV);
- ``temperature``: the row warped at ``f`` times the request's temperature (``f`` = the
  request's temperature again is the "temperature applied twice" bug).

For each sampling setting, the size at which the check's depth-1 test alone rejects with
probability >= 0.99 at ALPHA is found from the noncentral chi-square (a bound: the deeper
groups and their sum only add power); then the real check (``specd verify``'s code, through
the engine) runs ``--trials`` times on the planted drafter at that size, each with its own
seed, and the detections are counted.

    python scripts/q_power.py --kind tv --trials 100
    python scripts/q_power.py --kind temperature --trials 100
    python scripts/q_power.py --kind temperature --below --trials 100
    python scripts/q_power.py --kind tv --thorough --size 0.02 --trials 20
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from specd import Draft, Drafter, SamplingParams, hookimpl, sample, warp
from specd.conformance import drafter_checks as dc
from specd.conformance.engine_checks import EngineBench
from specd.conformance.engine_scenarios import conformance_prompt
from specd.conformance.gtest import ALPHA, power
from specd.registry import get_plugin_manager

SCALE = 1.5


def table(vocab: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * SCALE


def moved(row: torch.Tensor, d: float) -> torch.Tensor:
    """``row`` with mass ``d`` moved from its likeliest token to its second likeliest."""
    top = row.topk(2).indices
    out = row.clone()
    d = min(d, float(row[top[0]]))
    out[top[0]] -= d
    out[top[1]] += d
    return out


def reported(logits: torch.Tensor, params: SamplingParams, kind: str, size: float):
    drawn = warp(logits, params).double()
    if kind == "tv":
        return drawn, moved(drawn, size)
    other = SamplingParams(
        temperature=params.temperature * size, top_k=params.top_k, top_p=params.top_p
    )
    return drawn, warp(logits, other).double()


class Planted(Drafter):
    name = "planted_bigram"
    reads_cache = False
    kind = "tv"
    size = 0.0

    def __init__(self) -> None:
        self._rows: dict = {}

    def propose(self, ctx, budget):
        last, tokens, rows = ctx.tokens[-1], [], []
        for _ in range(budget):
            key = (last, ctx.params.temperature, ctx.params.top_k, ctx.params.top_p)
            if key not in self._rows:
                self._rows[key] = reported(
                    table(ctx.vocab_size)[last], ctx.params, self.kind, self.size
                )
            drawn, told = self._rows[key]
            last = sample(drawn, ctx.generator)
            tokens.append(last)
            rows.append(told)
        return Draft.chain(tokens, torch.stack(rows))


@hookimpl
def specd_register_drafters(register):
    register(Planted)


def threshold(row_logits: torch.Tensor, params: SamplingParams, kind: str, calls: int, above: bool):
    """The size at which the depth-1 test alone rejects with probability >= 0.99."""

    def detects(size: float) -> bool:
        drawn, told = reported(row_logits, params, kind, size)
        support = drawn > 0
        if (told[support] <= 0).any():
            return True  # a drawn token the report gives probability 0: one draw shows it
        kl = float((drawn[support] * (drawn[support] / told[support]).log()).sum())
        df = int(support.sum()) - 1
        return power(df, 2.0 * calls * kl, ALPHA) >= 0.99

    if kind == "tv":
        lo, hi = 0.0, 0.5
    else:
        lo, hi = (1.0, 3.0) if above else (0.2, 1.0)
    for _ in range(40):
        mid = (lo + hi) / 2
        if detects(mid) == (kind == "tv" or above):
            hi = mid
        else:
            lo = mid
    return hi if (kind == "tv" or above) else lo


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["tv", "temperature"], default="tv")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--thorough", action="store_true")
    ap.add_argument("--below", action="store_true", help="temperature: factors below 1")
    ap.add_argument(
        "--size", type=float, default=None, help="plant this size instead of the bound's"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    get_plugin_manager().register(sys.modules[__name__], name="q-power-planted")
    calls = dc.Q_CALLS * (dc.THOROUGH_FACTOR if args.thorough else 1)
    bench = EngineBench("planted_bigram", {}, None)
    contexts = [
        ("its cycle", conformance_prompt(bench.target)),
        ("no repeats", list(dc.FRESH_PROMPT)),
    ]
    vocab = bench.target.vocab_size
    print(f"kind={args.kind} calls={calls} trials={args.trials} below={args.below}")
    print("| setting | size | detected | seconds |")
    print("| --- | --- | --- | --- |")
    for setting in dc.Q_SETTINGS:
        if setting.temperature == 0:
            continue
        params = setting.sampling(0)
        # the depth-1 row of the "no repeats" context: its last token's row
        size = args.size or threshold(
            table(vocab)[contexts[1][1][-1]], params, args.kind, calls, not args.below
        )
        Planted.kind, Planted.size = args.kind, size
        bench = EngineBench("planted_bigram", {}, None)  # a fresh instance for the new size
        t0 = time.perf_counter()
        caught = 0
        for trial in range(args.trials):
            result = dc.check_setting(bench, setting, contexts, calls, seed=1 + trial)
            caught += not result.passed
        print(
            f"| {setting.describe()} | {size:.3f} | {caught}/{args.trials} | "
            f"{time.perf_counter() - t0:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
