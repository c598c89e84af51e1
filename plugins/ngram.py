"""Prompt-lookup drafting: copy what followed the last time the current n-gram appeared.

The request's own tokens are indexed incrementally (each committed token adds O(max_n)
entries); when they hold no match, the engine's corpus (open documents, accepted
completions) is searched. The draft is deterministic, so the verifier sees a one-hot q.
"""

from __future__ import annotations

from collections.abc import Sequence

from specd import Draft, DraftContext, Drafter, NgramIndex, hookimpl


class NgramDrafter(Drafter):
    """:param min_n: shortest n-gram to match. :param max_n: longest n-gram to match.
    :param max_draft: cap on proposed tokens (the engine's budget also applies).
    :param use_corpus: also search the engine's corpus when the request has no match."""

    name = "ngram"

    def __init__(
        self, min_n: int = 1, max_n: int = 4, max_draft: int = 16, use_corpus: bool = True
    ) -> None:
        self.min_n = int(min_n)
        self.max_n = int(max_n)
        self.max_draft = int(max_draft)
        self.use_corpus = bool(use_corpus)
        self._index = NgramIndex(min_n=self.min_n, max_n=self.max_n)

    def start(self, ctx: DraftContext) -> None:
        self._index = NgramIndex(ctx.tokens, min_n=self.min_n, max_n=self.max_n)

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        budget = min(budget, self.max_draft)
        tokens = self._index.lookup_self(budget)
        if not tokens and self.use_corpus and ctx.corpus is not None:
            tokens = ctx.corpus.lookup(self._index.tokens, budget)
        return Draft.chain(tokens) if tokens else None

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        self._index.extend(new_tokens)


@hookimpl
def specd_register_drafters(register):
    register(NgramDrafter)
