"""The ``hybrid`` drafter: several drafters, one draft, one target pass.

The parts are registered drafters named in order (default ``ngram,eagle``), built through
:func:`specd.make_drafter`, so any installed drafter can take part. Each step asks them in
order, each with what is left of the budget: the first draft that reaches ``min_len`` nodes
ends the asking (when the context repeats, the n-gram continuation is long and the head is
not run). Deterministic drafts asked so far are merged into one token tree, earlier parts'
nodes first, equal paths shared; a draft that carries q (sampled decoding) cannot share a
tree with others, so it is used alone. Every part hears of every request
start, commit and finish, so each keeps its own state in step.

Parts named in :data:`PART_DEFAULTS` get those options unless given others: the n-gram part
matches at least two tokens, so a one-token match (a weak guess) leaves the step to the
parts after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from specd import BadInputError, Draft, DraftContext, Drafter, make_drafter

#: Options of parts that differ from the part's own defaults inside ``hybrid``.
PART_DEFAULTS: dict[str, dict[str, Any]] = {"ngram": {"min_n": 2}}


class HybridDrafter(Drafter):
    """:param drafters: comma-separated drafter names, asked in this order.
    :param min_len: a draft at least this long ends the asking.
    :param part_options: ``PART.KEY=VALUE`` constructor options of the parts, e.g.
        ``eagle.head=HEAD`` (``--drafter-option eagle.head=HEAD``)."""

    name = "hybrid"
    # Asking for the target's hidden states costs nothing extra; parts that need them get them.
    wants_hidden = True
    conformance_options: ClassVar[dict[str, object]] = {"eagle.head": "random"}

    def __init__(
        self,
        drafters: str = "ngram,eagle",
        min_len: int = 2,
        **part_options: Any,
    ) -> None:
        names = [n.strip() for n in str(drafters).split(",") if n.strip()]
        if not names or self.name in names:
            raise BadInputError(f"hybrid needs other drafters to combine, got {drafters!r}")
        opts: dict[str, dict[str, Any]] = {n: dict(PART_DEFAULTS.get(n, {})) for n in names}
        for key, value in part_options.items():
            part, _, option = key.partition(".")
            if part not in opts or not option:
                raise BadInputError(
                    f"hybrid option {key!r}: expected PART.KEY with PART one of {', '.join(names)}"
                )
            opts[part][option] = value
        ngram = opts.get("ngram")
        if ngram is not None and "max_n" in ngram and "ngram.min_n" not in part_options:
            # the default never contradicts what was given: ngram.max_n=1 matches one token
            ngram["min_n"] = min(ngram["min_n"], int(ngram["max_n"]))
        self.parts = [make_drafter(n, opts[n] or None) for n in names]
        self.min_len = max(1, int(min_len))

    def start(self, ctx: DraftContext) -> None:
        hidden = ctx.hidden
        for part in self.parts:
            ctx.hidden = hidden  # each part may take it
            part.start(ctx)
        ctx.hidden = None

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        drafts: list[Draft] = []
        left = budget
        for part in self.parts:
            if left <= 0:
                break
            draft = part.propose(ctx, left)
            if draft is None or len(draft) == 0:
                continue
            if not draft.deterministic:
                return draft  # the parts asked before it drafted too little
            drafts.append(draft)
            left -= len(draft)
            if len(draft) >= self.min_len:
                break
        return merge(drafts, budget) if drafts else None

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        hidden = ctx.hidden
        for part in self.parts:
            ctx.hidden = hidden
            part.commit(ctx, new_tokens, accepted)
        ctx.hidden = None

    def finish(self, ctx: DraftContext) -> None:
        for part in self.parts:
            part.finish(ctx)


def merge(drafts: Sequence[Draft], budget: int) -> Draft | None:
    """One deterministic token tree of at most ``budget`` nodes holding the drafts' paths;
    nodes with the same parent and token are shared. Earlier drafts keep their nodes first."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    for draft in drafts:
        mapped: list[int | None] = []
        for t, p in zip(draft.tokens, draft.parents):
            parent = -1 if p < 0 else mapped[p]
            if parent is None:  # its parent did not fit
                mapped.append(None)
                continue
            key = (parent, t)
            if key not in node_of and len(tokens) < budget:
                node_of[key] = len(tokens)
                tokens.append(t)
                parents.append(parent)
            mapped.append(node_of.get(key))
    return Draft(tokens=tokens, parents=parents) if tokens else None
