"""The ``eagle`` drafter: the head drafts from the target's own features.

The target returns its last hidden states with every verify pass (``wants_hidden``), so the
head's true entries cost no extra target work: after each step the drafter appends one entry
per committed token to its own small KV cache (:mod:`.entries`) and drafts from the last
one. Through the
step kernel (:mod:`.kernel`, where it runs) each call feeds a draft's entries (fed the head's
own predicted features) again with a tree mask, and they never enter the cache; through
PyTorch they are appended while drafting and cropped away before the draft is returned.
Between requests the cache is kept for the longest common prefix, like the engine's prefix
cache.

Greedy decoding drafts a tree (EAGLE-2): at each depth the ``width`` most probable nodes
are expanded by their ``topk`` most probable children, and the ``budget`` nodes of highest
path probability form the draft; ``width = topk = 1`` is a chain. The tokens are the
head's argmax choices, so the draft is deterministic. Sampled decoding drafts a chain drawn
from q: the target's sampling warp applied to the head's logits over the full vocabulary,
where every token outside the draft vocabulary has probability zero.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from specd import (
    MAX_DRAFT,
    BadInputError,
    Draft,
    DraftContext,
    Drafter,
    DrafterUnavailable,
    Target,
    checks,
    sample,
    warp,
)

from .entries import HeadEntries
from .head import EagleHead
from .headfile import RANDOM, HeadMismatchError, load_head, random_head, shipped_head
from .kernel import head_kernel
from .rest import Rest
from .tree import Node, as_draft, closed

#: The ``min_prob`` that keeps a node where its path probability covers its price.
PRICE = "price"
#: The most children per node and nodes expanded per depth: a depth's expansion is one head
#: call over ``width`` x ``topk`` entries.
MAX_FANOUT = 64
#: The most true entries the head attends to: a prefill keeps the features of that many of a
#: prompt's last tokens for it (the head was trained on 512-token sequences).
MAX_WINDOW = 65536


class EagleDrafter(HeadEntries, Drafter):
    """:param head: path of a head file (default: the head shipped for the target's model;
    ``random``: an untrained head, for tests).
    :param topk: children per expanded node (greedy trees). :param width: nodes expanded
    per depth (greedy trees). :param window: true entries the head attends to (older
    ones are not fed at all).
    :param max_draft: cap on draft nodes per step.
    :param min_prob: greedy trees keep only nodes whose path probability under the head
        is at least this: each node widens the verify pass, which costs time on a CPU.
        ``price``: at least what the node adds to the verify pass here, in one-token steps,
        under an exit policy that weighs drafts against the target's pass prices (no floor
        under ``fixed`` or where passes are not priced); ``hybrid`` gives its head part that.
    :param rest: after a request whose drafts did not pay, rest in the next ones but one in
        several (:mod:`.rest`); ``hybrid`` gives its head part ``rest=False``."""

    name = "eagle"
    wants_hidden = True
    # the target's features, never its cache: the first step may take the last prompt tokens
    reads_cache = False
    # the conformance suite's tiny targets have no trained head
    conformance_options: ClassVar[dict[str, object]] = {"head": RANDOM}

    def __init__(
        self,
        head: str | None = None,
        topk: int = 2,
        width: int = 2,
        window: int = 256,
        max_draft: int = 8,
        min_prob: float | str = 0.0,
        rest: bool = True,
    ) -> None:
        self.head_path = None if head is None else Path(head)
        if self.head_path is not None and head != RANDOM and not self.head_path.is_file():
            raise BadInputError(f"eagle option head={head!r}: no such file")
        HeadEntries.__init__(self, checks.integer("eagle", "window", window, hi=MAX_WINDOW))
        self.topk = checks.integer("eagle", "topk", topk, hi=MAX_FANOUT)
        self.width = checks.integer("eagle", "width", width, hi=MAX_FANOUT)
        self.feature_rows = self.window  # older features are never fed (_feed)
        self.max_draft = checks.integer("eagle", "max_draft", max_draft, hi=MAX_DRAFT)
        self.min_prob: float | None = None  # None: each node's price (_floor)
        if min_prob != PRICE:
            try:
                self.min_prob = float(min_prob)
            except (TypeError, ValueError):
                self.min_prob = math.nan
            if not 0.0 <= self.min_prob <= 1.0:
                raise BadInputError(
                    f"eagle option min_prob={min_prob!r}: expected a probability or {PRICE!r}"
                )
        self.rest = checks.flag("eagle", "rest", rest)
        self._rest = Rest()
        self._for: Target | None = None

    # -- the head -------------------------------------------------------------------------

    def _load(self, target: Target) -> EagleHead:
        if self._head is None or self._for is not target:
            if self.head_path == Path(RANDOM):
                self._head = random_head(target)
            else:
                path = self.head_path or shipped_head(target)
                if path is None:
                    raise DrafterUnavailable(
                        f"no EAGLE head ships for {target.name!r}; train one with "
                        f"'specd train eagle --model {target.name} --data PATH --out HEAD' and "
                        "pass --drafter-option head=HEAD (eagle.head=HEAD for hybrid)"
                    )
                try:
                    self._head = load_head(path, target)
                except HeadMismatchError as e:
                    raise DrafterUnavailable(str(e)) from e
            self._for = target
            model = target.model
            vocab = self._head.draft_vocab
            self._embed = model.get_input_embeddings().weight
            # [Vd, H] as the target stores them: blocks read by the kernel's product as stored
            self._lm_rows: Any = target.lm_head_rows(vocab)
            self._head.product = target.linear  # the target's product for a few rows
            # its own weights for a few rows as the target's product reads them fastest
            # (Q8_0 blocks where the target runs on blocks)
            self._head.use_small_weights(target.small_weight, target.few_rows)
            self._kernel = head_kernel(self._head, target, self._lm_rows)
            self._reset()
        return self._head

    # -- the Drafter interface ------------------------------------------------------------

    def start(self, ctx: DraftContext) -> None:
        if ctx.target is None:
            raise RuntimeError("eagle needs the target")
        rested = self._rest.resting
        if self._rest.start(ctx):  # no features were read: it drafts nothing this request
            return
        if rested:  # under a policy that drafts whatever it costs: features from the first pass
            self.wants_hidden = True
        self._load(ctx.target)
        self._step_rows = 0  # the prompt's entries are a catch-up
        # keep the entries of the longest common prefix: entry p describes tokens p, p + 1
        same = 0
        for a, b in zip(self._tokens, ctx.tokens):
            if a != b:
                break
            same += 1
        keep = bisect.bisect_right(self._pos, same - 2)
        # the last common token's feature is still right; only the token after it changed
        self._feat = None
        if keep < len(self._pos) and self._pos[keep] == same - 1:
            self._feat, self._feat_start = self._ins[keep][None], same - 1
        del self._pos[keep:], self._outs[keep:], self._ins[keep:]
        self._crop(keep)
        self._root_scores = None
        self._tokens = ctx.tokens
        self._take_features(ctx)

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        if self._rest.resting:
            return
        self._rest.committed(accepted)
        self._step_rows = 0 if ctx.hidden is None else ctx.hidden.shape[0]
        self._take_features(ctx)

    def finish(self, ctx: DraftContext) -> None:
        if not self._rest.resting:  # the entries describe the tokens they were fed
            self._tokens = list(ctx.tokens)
        if self.rest:  # read as the next request starts
            self.wants_hidden = not self._rest.finished()

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        if self._rest.resting:
            return None
        head = self._head
        assert head is not None
        budget = min(budget, self.max_draft)
        self._tokens = ctx.tokens
        pending = len(ctx.tokens) - 1
        self.catch_up_s = 0.0
        self._feed(ctx.tokens, pending)
        if not self._pos or self._pos[-1] != pending - 1 or budget <= 0:
            return None  # no feature for the token before the pending one yet
        true = len(self._pos)
        try:
            if ctx.params.greedy:
                draft = as_draft(self._tree(ctx, budget, pending), None)
            else:
                draft = self._chain(ctx, budget, pending)
        finally:
            self._crop(true)
        if draft is not None:
            self._rest.drafted(ctx, len(draft))
        return draft

    # -- drafting -------------------------------------------------------------------------

    def _tree(self, ctx: DraftContext, budget: int, pending: int) -> list[Node]:
        nodes: list[Node] = []
        floor = self._floor(ctx, 0)
        root = self._root()
        frontier = self._children(-1, root, self._root_logp(), 0.0, 1, nodes)
        # the kernel feeds each expansion its frontier's paths again: at most width x depth
        kernel = self._kernel is not None and self.width * budget <= self._kernel.max_entries
        for depth in range(2, budget + 1):
            # a child is never more probable than its parent: expand only nodes over the floor
            frontier = [i for i in frontier if nodes[i].score >= floor]
            frontier = sorted(frontier, key=lambda i: -nodes[i].score)[: self.width]
            if not frontier or not ctx.keep_drafting(depth - 1, math.exp(nodes[frontier[0]].score)):
                break
            if kernel:
                outs, logps = self._expand_paths(frontier, nodes, pending)
            else:
                outs = self._expand(frontier, nodes, pending)
                logps = self._logp(outs)
            frontier = [
                c
                for i, out, logp in zip(frontier, outs, logps)
                for c in self._children(i, out, logp, nodes[i].score, depth, nodes)
            ]
        # the budget most probable nodes; a parent is never less probable than its child
        chosen = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth))
        kept = [i for k, i in enumerate(chosen[:budget]) if nodes[i].score >= self._floor(ctx, k)]
        return closed(nodes, kept)

    def _floor(self, ctx: DraftContext, rank: int) -> float:
        """The least log path probability at which the ``rank``-th most probable node
        (0-based) is drafted: ``min_prob``'s, or with ``min_prob=price`` the price of the
        pass's ``rank + 2``-th token over its ``rank + 1``-th, in one-token steps (a node
        accepted with at least that probability wins what it costs; the shipped head's path
        probabilities track how often its nodes are accepted, docs/eagle.md)."""
        p = self.min_prob
        if p is None:
            policy = ctx.exit_policy
            cost = policy.pass_cost if policy is not None and policy.prices_drafts else None
            p = 0.0 if cost is None else cost(rank + 2) - cost(rank + 1)
        return math.log(p) if p > 0 else -math.inf

    def _children(
        self,
        parent: int,
        feat: torch.Tensor,
        logp: torch.Tensor,
        score: float,
        depth: int,
        nodes: list[Node],
    ) -> list[int]:
        """Add the ``topk`` most probable children of ``parent`` (whose predicted feature
        ``feat`` gave ``logp`` ``[Vd]``). :returns: their node indices."""
        top = logp.topk(min(self.topk, logp.numel()))
        vocab = self._head.draft_vocab  # type: ignore[union-attr]
        made = []
        for lp, i in zip(top.values.tolist(), top.indices.tolist()):
            nodes.append(Node(int(vocab[i]), parent, depth, score + lp, feat))
            made.append(len(nodes) - 1)
        return made

    def _expand(self, frontier: list[int], nodes: list[Node], pending: int) -> torch.Tensor:
        """One head call for the frontier nodes' entries. :returns: their outputs ``[F, H]``."""
        base = self._cache.length
        seen = []
        for i in frontier:
            anc, p = [], nodes[i].parent
            while p >= 0:
                anc.append(nodes[p].entry)
                p = nodes[p].parent
            seen.append(anc)
        feat = torch.stack([nodes[i].feat for i in frontier])
        tokens = torch.tensor([nodes[i].token for i in frontier], device=feat.device)
        positions = [pending + nodes[i].depth - 1 for i in frontier]
        outs = self._entries(feat, tokens, positions, seen)
        for row, i in enumerate(frontier):
            nodes[i].entry = base + row
        return outs

    def _expand_paths(
        self, frontier: list[int], nodes: list[Node], pending: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_expand` through the kernel: the frontier nodes' entries with every node on
        their paths (parents first), each seeing its own path, in one call that leaves the
        cache as it was. :returns: the frontier's outputs ``[F, H]`` and log probabilities
        ``[F, Vd]``."""
        rows: list[int] = []
        index: dict[int, int] = {}
        for i in frontier:
            path, p = [], i
            while p >= 0 and p not in index:
                path.append(p)
                p = nodes[p].parent
            for n in reversed(path):
                index[n] = len(rows)
                rows.append(n)
        tree = torch.zeros(len(rows), len(rows), dtype=torch.bool)
        for a, n in enumerate(rows):
            while n >= 0:
                tree[a, index[n]] = True
                n = nodes[n].parent
        feat = torch.stack([nodes[n].feat for n in rows])
        tokens = torch.tensor([nodes[n].token for n in rows], device=feat.device)
        positions = [pending + nodes[n].depth - 1 for n in rows]
        scores, outs = self._kernel_entries(feat, tokens, positions, tree)
        at = [index[i] for i in frontier]
        return outs[at], torch.log_softmax(scores[at].float(), -1)

    def _chain(self, ctx: DraftContext, budget: int, pending: int) -> Draft | None:
        feat = self._root()
        vocab = self._head.draft_vocab  # type: ignore[union-attr]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        # through the kernel: the chain's entries fed again at each position
        kernel = self._kernel is not None and budget <= self._kernel.max_entries
        feats: list[torch.Tensor] = []
        scores = self._root_scores if self._root_scores is not None else self._scores(feat)
        for position in range(budget):
            logits = torch.full((ctx.vocab_size,), float("-inf"), device=feat.device)
            logits[vocab] = scores.float()
            q = warp(logits, ctx.params)  # [V], zero outside the draft vocabulary
            token = sample(q, ctx.generator)
            tokens.append(token)
            rows.append(q)
            if position + 1 == budget or not ctx.keep_drafting(position + 1, float(q[token])):
                break
            if kernel:
                feats.append(feat)
                ids = torch.tensor(tokens, device=feat.device)
                at = list(range(pending, pending + position + 1))
                all_scores, outs = self._kernel_entries(torch.stack(feats), ids, at, None)
                scores, feat = all_scores[-1], outs[-1]
                continue
            # the chain's draft entries so far sit right after the true ones
            earlier = list(range(len(self._pos), len(self._pos) + position))
            tok = torch.tensor([token], device=feat.device)
            feat = self._entries(feat[None], tok, [pending + position], [earlier])[0]
            scores = self._scores(feat)
        return Draft.chain(tokens, q=torch.stack(rows).cpu())
