"""The ``hybrid`` drafter: several drafters, one draft, one target pass.

The parts are registered drafters named in order (default ``ngram,eagle``), built through
:func:`specd.make_drafter`, so any installed drafter can take part. Each step asks them in
order, each with what is left of the budget: the first draft that reaches ``min_len`` nodes
ends the asking (when the context repeats, the n-gram continuation is long and the head is
not run). Deterministic drafts asked so far are merged into one token tree, earlier parts'
nodes first, equal paths shared; a draft that carries q (sampled decoding) cannot share a
tree with others, so it is used alone. Every part hears of every request
start, commit and finish, so each keeps its own state in step.

Parts named in :data:`PART_DEFAULTS` get those options unless given others, when parts come
after them: the n-gram part matches at least two tokens, so a one-token match (a weak
guess) leaves the step to the parts after it.

A part that cannot draft for the target (its ``start`` raises :class:`DrafterUnavailable`,
e.g. ``eagle`` for a model with no head) is dropped for good, the reason logged once, and
the rest draft as if named alone: ``hybrid`` on a model without a head drafts as ``ngram``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

from specd import BadInputError, Draft, DraftContext, Drafter, DrafterUnavailable, make_drafter

log = logging.getLogger("specd.plugins")

#: Options of parts that differ from the part's own defaults inside ``hybrid``.
PART_DEFAULTS: dict[str, dict[str, Any]] = {"ngram": {"min_n": 2}}


class HybridDrafter(Drafter):
    """:param drafters: comma-separated drafter names, asked in this order.
    :param min_len: a draft at least this long ends the asking.
    :param part_options: ``PART.KEY=VALUE`` constructor options of the parts, e.g.
        ``eagle.head=HEAD`` (``--drafter-option eagle.head=HEAD``)."""

    name = "hybrid"
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
        given: dict[str, dict[str, Any]] = {n: {} for n in names}
        for key, value in part_options.items():
            part, _, option = key.partition(".")
            if part not in given or not option:
                raise BadInputError(
                    f"hybrid option {key!r}: expected PART.KEY with PART one of {', '.join(names)}"
                )
            given[part][option] = value
        self._given = given
        self.min_len = max(1, int(min_len))
        self._build(names)

    def _build(self, names: list[str]) -> None:
        """(Re)build the parts ``names``, in this order, with their options."""
        self.names = names
        last = len(names) - 1
        self.parts = [
            make_drafter(n, self._options(n, i == last) or None) for i, n in enumerate(names)
        ]
        # what its parts do, as they come and go
        self.wants_hidden = any(p.wants_hidden for p in self.parts)
        self.reads_cache = any(p.reads_cache for p in self.parts)
        # the prompt's last features its parts read: the most any reads (None: all)
        rows = [getattr(p, "feature_rows", None) for p in self.parts if p.wants_hidden]
        self.feature_rows = None if None in rows or not rows else max(rows)  # type: ignore[type-var]

    def _options(self, name: str, last: bool) -> dict[str, Any]:
        given = self._given[name]
        opts = {} if last else dict(PART_DEFAULTS.get(name, {}))
        if name == "ngram" and "max_n" in given and "min_n" in opts:
            # the default never contradicts what was given: ngram.max_n=1 matches one token
            opts["min_n"] = min(opts["min_n"], int(given["max_n"]))
        return opts | given

    def start(self, ctx: DraftContext) -> None:
        hidden = ctx.hidden
        i = 0
        while i < len(self.parts):
            ctx.hidden = hidden  # each part may take it
            try:
                self.parts[i].start(ctx)
            except DrafterUnavailable as e:
                rest = self.names[:i] + self.names[i + 1 :]
                if not rest:
                    raise
                log.warning("hybrid drafts without %s: %s", self.names[i], e)
                self._build(rest)  # the others as if named alone, started afresh
                i = 0
                continue
            i += 1
        ctx.hidden = None

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        if len(self.parts) == 1:
            return self.parts[0].propose(ctx, budget)
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
