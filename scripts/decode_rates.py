"""Decoding alone, per drafter: editor prompts through one engine, the drafters in the order
given (repeat a name to run it again), each request on an empty prefix cache; for each,
the milliseconds a new token took after the prefill and how many of them the step kernel
itself took (the rest is Python and torch around it), target passes, drafted tokens, and
the seconds spent drafting and verifying. The engine's own clock of each drafter's cost
(``DraftClock``, in one-token steps) is printed too.

    python scripts/decode_rates.py none eagle none eagle hybrid ngram

A name ending in ``/torch`` runs that drafter with its EAGLE head through PyTorch instead of
the step kernel (``eagle/torch eagle eagle/torch eagle``: the head's two paths alternating).
``--one-node`` drafts one node a step under the ``fixed`` policy, the head never resting
(what each of its calls costs, whether it pays or not):

    python scripts/decode_rates.py --one-node none eagle eagle/torch none eagle/torch eagle
"""

from __future__ import annotations

import sys
import time

from specd import Engine, SamplingParams
from specd.bench import workloads
from specd.forward import cpu_kernels
from specd.prefix_cache import PrefixCache

_kernel_s = [0.0]


def _timed_step_function():
    """The step kernel's entry point, timed (each call adds its seconds to ``_kernel_s``)."""
    step = _step_function()

    def call(*args):
        t = time.perf_counter()
        step(*args)
        _kernel_s[0] += time.perf_counter() - t

    return call


_step_function = cpu_kernels.step_function


def _head_path(engine: Engine, label: str) -> str:
    """The drafter ``label`` names, its EAGLE head (or its parts') set to run through PyTorch
    for a label ending in ``/torch``, through the step kernel where it runs otherwise."""
    from specd.plugins.eagle import drafter as eagle
    from specd.plugins.eagle import kernel

    name, _, path = label.partition("/")
    eagle.head_kernel = (lambda *_: None) if path == "torch" else kernel.head_kernel
    if name != "none":
        d = engine.plugins.drafter(name)
        for part in getattr(d, "parts", [d]):
            if isinstance(part, eagle.EagleDrafter):
                part._for = None  # loaded again at its next request, on the path asked for
    return name


def main() -> None:
    args = sys.argv[1:]
    one_node = "--one-node" in args
    drafters = [a for a in args if a != "--one-node"] or ["none", "ngram", "hybrid", "eagle"]
    cpu_kernels.step_function = _timed_step_function  # type: ignore[assignment]
    if one_node:
        chain = {"topk": 1, "width": 1, "rest": False}
        engine = Engine.load(max_draft=1, exit_policy="fixed", drafter_options={"eagle": chain})
    else:
        engine = Engine.load()
    prompts = workloads.build("editor", engine.target, limit=4)
    engine.generate(
        prompts[0].ids, SamplingParams(max_tokens=8), drafter=_head_path(engine, drafters[0])
    )  # warm
    for label in drafters:
        name = _head_path(engine, label)
        tokens = steps = drafted = 0
        draft_s = verify_s = decode_s = kernel_s = 0.0
        for prompt in prompts:
            engine.prefix_cache = PrefixCache(engine.target.new_cache, max_entries=4)
            _kernel_s[0] = 0.0  # the 1k-token prompts' prefill runs no step kernel pass
            stats = engine.generate(prompt.ids, SamplingParams(max_tokens=64), drafter=name).stats
            kernel_s += _kernel_s[0]
            tokens += stats.new_tokens
            steps += stats.target_steps
            drafted += stats.drafted
            draft_s += stats.draft_s
            verify_s += stats.verify_s
            decode_s += stats.total_s - stats.prefill_s
        clock = engine._clocks.get(name)
        cost = f"{clock.cost(4):.2f}" if clock is not None else "-"
        print(
            f"{label:8s} {decode_s / tokens * 1e3:6.2f} ms/token ({kernel_s / tokens * 1e3:.2f} in "
            f"the step kernel), {steps} passes for {tokens} "
            f"tokens, {drafted} drafted; drafting {draft_s:.2f} s, verifying {verify_s:.2f} s; "
            f"a 4-token draft costs {cost} steps"
        )


if __name__ == "__main__":
    main()
