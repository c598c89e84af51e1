"""Prompt-lookup drafting: copy what followed the last time the current n-gram appeared.

The request's own tokens are indexed incrementally (each committed token adds O(max_n)
entries); when they hold no match, the engine's corpus (open documents, accepted
completions) is searched. The draft is deterministic, so the verifier sees a one-hot q.
With ``branches > 1`` the continuations of several earlier occurrences that disagree are
merged into a token tree, verified in the same single target pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

from specd import (
    MAX_DRAFT,
    BadInputError,
    Draft,
    DraftContext,
    Drafter,
    NgramIndex,
    checks,
    hookimpl,
)

#: The longest n-gram matched: the index keeps an entry per position and length, so its
#: size grows with both.
MAX_N = 32
#: The most disagreeing occurrences a tree is drafted from (each kept per n-gram).
MAX_BRANCHES = 16


class NgramDrafter(Drafter):
    """:param min_n: shortest n-gram to match. :param max_n: longest n-gram to match.
    :param max_draft: cap on proposed tokens (the engine's budget also applies).
    :param use_corpus: also search the engine's corpus when the request has no match.
    :param branches: >1 drafts a tree from up to this many disagreeing occurrences (the
        most recent one is the trunk).
    :param branch_len: nodes given to each branch other than the trunk."""

    name = "ngram"
    reads_cache = False
    #: ``specd verify`` drafts trees, so the residual a rejected sibling leaves is checked too.
    conformance_options: ClassVar[dict[str, object]] = {"branches": 2}

    def __init__(
        self,
        min_n: int = 1,
        max_n: int = 4,
        max_draft: int = 16,
        use_corpus: bool = True,
        branches: int = 1,
        branch_len: int = 2,
    ) -> None:
        self.min_n = checks.integer("ngram", "min_n", min_n, hi=MAX_N)
        self.max_n = checks.integer("ngram", "max_n", max_n, hi=MAX_N)
        if self.min_n > self.max_n:
            raise BadInputError(
                f"ngram options min_n={min_n!r}, max_n={max_n!r}: expected min_n <= max_n"
            )
        self.max_draft = checks.integer("ngram", "max_draft", max_draft, hi=MAX_DRAFT)
        self.use_corpus = checks.flag("ngram", "use_corpus", use_corpus)
        self.branches = checks.integer("ngram", "branches", branches, hi=MAX_BRANCHES)
        self.branch_len = checks.integer("ngram", "branch_len", branch_len, hi=MAX_DRAFT)
        self._index = self._new_index(())

    def _new_index(self, tokens: Iterable[int]) -> NgramIndex:
        # one-token n-grams too, whatever min_n says: propose_weak matches them
        return NgramIndex(tokens, min_n=1, max_n=self.max_n, keep=self.branches)

    def start(self, ctx: DraftContext) -> None:
        self._index = self._new_index(ctx.tokens)

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        return self._draft(ctx, budget, self.min_n, self.use_corpus)

    def propose_weak(self, ctx: DraftContext, budget: int) -> Draft | None:
        """The request's own continuation of its last token alone where :meth:`propose`
        found none (its ``min_n`` above one): what a combining drafter asks when no other
        part drafts this step (``hybrid``, whose n-gram part leaves one-token matches to the
        parts after it while they pay). The corpus is not searched again."""
        return self._draft(ctx, budget, 1, False)

    def _draft(self, ctx: DraftContext, budget: int, least: int, corpus: bool) -> Draft | None:
        """The continuations of the longest match of at least ``least`` tokens, or with
        ``corpus`` and none in the request, the engine's corpus's."""
        budget = min(budget, self.max_draft)
        options = self._index.continuations(self._index.tokens, budget, self.branches, least)
        if not options and corpus and ctx.corpus is not None:
            options = [ctx.corpus.lookup(self._index.tokens, budget)]
        return _trie(options, budget, self.branch_len)

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        self._index.extend(new_tokens)


def _trie(options: list[list[int]], budget: int, branch_len: int) -> Draft | None:
    """Merge continuations into a token tree with distinct siblings, within ``budget``
    nodes. The first continuation (the trunk) gets what the other branches leave."""
    options = [o for o in options if o]
    if not options:
        return None
    if len(options) == 1:
        return Draft.chain(options[0][:budget])
    trunk = max(budget - branch_len * (len(options) - 1), 1)
    tokens: list[int] = []
    parents: list[int] = []
    children: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for seq, length in zip(options, [trunk] + [branch_len] * (len(options) - 1)):
        node = -1
        for t in seq[:length]:
            if (node, t) not in children:
                if len(tokens) >= budget:
                    break
                children[(node, t)] = len(tokens)
                tokens.append(t)
                parents.append(node)
            node = children[(node, t)]
    return Draft(tokens=tokens, parents=parents)


@hookimpl
def specd_register_drafters(register):
    register(NgramDrafter)
