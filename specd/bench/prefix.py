"""Time to first token after a one-character edit, with and without the prefix cache.

For each prompt the edited text is generated twice with specd plain: *cold* (empty prefix
cache) and *warm* (right after the unedited prompt, as in an editor where the previous
keystroke's request left its KV cache behind). Two edits are measured:

- ``cursor``: a character typed at the cursor (the end of the prompt) — the keystroke case;
- ``middle``: one character changed half-way through the prompt — everything after it must
  be recomputed, so the warm TTFT can be at best about half the cold one.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from ..engine import Engine
from ..forward.target import Target
from ..sampling import SamplingParams
from .workloads import Prompt

EDITS = ("cursor", "middle")


def edited(text: str, where: str) -> str:
    """``text`` with one character typed at the end (``cursor``) or changed in the middle."""
    if where == "cursor":
        return text + "x"
    mid = len(text) // 2
    while mid < len(text) and not text[mid].isalpha():
        mid += 1
    if mid >= len(text):
        return text[: len(text) // 2] + "x" + text[len(text) // 2 :]
    return text[:mid] + ("y" if text[mid] != "y" else "z") + text[mid + 1 :]


def ttft(engine: Engine, ids: list[int]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens reused from the prefix cache)."""
    t = time.perf_counter()
    gen = engine.stream(ids, SamplingParams(max_tokens=1))
    first = None
    for delta in gen:
        if delta.token_ids and first is None:
            first = time.perf_counter() - t
    assert gen.completion is not None
    return (
        first if first is not None else time.perf_counter() - t
    ), gen.completion.stats.reused_tokens


def measure(target: Target, prompts: list[Prompt], *, progress=None) -> dict[str, Any] | None:
    """The ``prefix_cache`` section of the report, or None when no prompt has text.

    :returns: per edit: median cold and warm TTFT, their ratio, median prompt tokens and
        median reused tokens, and the per-prompt samples.
    """
    texts = [p.text for p in prompts if p.text]
    if not texts:
        return None
    engine = Engine(target, drafter="none", prefix_cache_entries=2)
    tok = engine.tokenize
    out: dict[str, Any] = {"method": "specd plain, max_tokens=1; warm = after the unedited prompt"}
    for where in EDITS:
        cold, warm, reused, sizes = [], [], [], []
        for text in texts:
            before, after = tok(text), tok(edited(text, where))
            engine.prefix_cache.clear()
            c, _ = ttft(engine, after)
            engine.prefix_cache.clear()
            ttft(engine, before)
            w, r = ttft(engine, after)
            engine.prefix_cache.clear()
            cold.append(c)
            warm.append(w)
            reused.append(r)
            sizes.append(len(after))
            if progress is not None:
                progress.update(1)
        c50, w50 = statistics.median(cold), statistics.median(warm)
        out[where] = {
            "cold_ttft_s": c50,
            "warm_ttft_s": w50,
            "ratio": w50 / c50 if c50 > 0 else None,
            "prompt_tokens": int(statistics.median(sizes)),
            "reused_tokens": int(statistics.median(reused)),
            "samples": [{"cold_s": c, "warm_s": w} for c, w in zip(cold, warm)],
        }
    return out
