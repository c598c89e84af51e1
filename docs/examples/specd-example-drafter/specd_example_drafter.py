"""A bigram drafter: after token ``a``, propose the token that most often followed ``a``.

The table is learned from the request itself: the prompt when the request starts, then every
committed token, O(1) work per token. Code repeats itself (names, call shapes, indentation
runs), so following the most frequent successor guesses right more often than it looks.

The draft is deterministic (``q`` is None): the verifier treats each token as a one-hot
proposal, so the output is exactly the target's.
"""

from __future__ import annotations

from collections.abc import Sequence

from specd import MAX_DRAFT, Draft, DraftContext, Drafter, checks, hookimpl


class BigramDrafter(Drafter):
    """:param max_draft: most tokens to propose per step (the engine's budget also applies).
    :param min_count: follow a successor only once it has been seen this many times."""

    name = "bigram"

    def __init__(self, max_draft: int = 8, min_count: int = 1) -> None:
        self.max_draft = checks.integer("bigram", "max_draft", max_draft, hi=MAX_DRAFT)
        self.min_count = checks.integer("bigram", "min_count", min_count)
        self._reset()

    def _reset(self) -> None:
        self._counts: dict[tuple[int, int], int] = {}  # (a, b) -> times b followed a
        self._seen: dict[int, int] = {}  # a -> times a was followed by anything
        self._best: dict[int, tuple[int, int]] = {}  # a -> (its most frequent successor, count)
        self._last: int | None = None

    def _learn(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            prev, self._last = self._last, int(token)
            if prev is None:
                continue
            n = self._counts[prev, self._last] = self._counts.get((prev, self._last), 0) + 1
            self._seen[prev] = self._seen.get(prev, 0) + 1
            if n >= self._best.get(prev, (0, 0))[1]:  # ties go to the most recent successor
                self._best[prev] = (self._last, n)

    def start(self, ctx: DraftContext) -> None:
        self._reset()
        self._learn(ctx.tokens)

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        tokens: list[int] = []
        prev = ctx.tokens[-1]
        while len(tokens) < min(budget, self.max_draft) and prev in self._best:
            token, count = self._best[prev]
            if count < self.min_count:
                break
            tokens.append(token)
            # How sure we were of that token; the exit policy decides whether to go on.
            if not ctx.keep_drafting(len(tokens), count / self._seen[prev]):
                break
            prev = token
        return Draft.chain(tokens) if tokens else None

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        self._learn(new_tokens)


@hookimpl
def specd_register_drafters(register):
    register(BigramDrafter)
