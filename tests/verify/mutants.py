"""Verifier and drafter mutants that the engine-level checks of ``specd verify`` must reject.

Each is a small plugin, registered through the same hooks a third party uses, that gets one
detail of speculative sampling wrong in a way that a check looking only at the tokens could
miss: the wrong law shows only in some steps (after a rejection among siblings, after a
full accept) or only away from temperature 1.

- ``mutant_residual_unnormalised`` (M1): the residual ``max(r - q, 0)`` is not divided by its
  mass. A draw from it is still right (sampling normalises), but the next sibling is tested
  against too little mass.
- ``mutant_threshold_plus`` (M2): accepts when ``u < r(x) / q(x) + 0.02``.
- ``mutant_bonus_from_q`` (M3): after a full accept, the bonus token is drawn from the last
  node's proposal row (one-hot on its token for a deterministic draft) instead of from p.
- ``mutant_bonus_wrong_row`` (M4): after a full accept, the bonus token is drawn from the row
  the last node was checked against instead of the row after it.
- ``mutant_rewarp`` (V1): warps the already-warped p again with the request's parameters.
- ``mutant_q_twice`` (D1): a sampling drafter whose reported q applies the temperature (and
  top-k/top-p) a second time to the row the token was really drawn from.

The bigram drafters are written the way a third party would write one from docs/plugins.md:
a fixed random table of next-token scores, a chain sampled from ``warp`` of them.
``honest_bigram``
is honest; each mutant reports a q other than the one its tokens came from, the bug class
that breaks speculative sampling most often in the wild:

- ``mutant_bigram_q_twice`` (Q1): the temperature (and top-k/top-p) applied to q twice;
- ``mutant_bigram_q_unfiltered`` (Q2): q reported before top-k/top-p, tokens drawn after;
- ``mutant_bigram_t1`` (Q3): tokens drawn at temperature 1 whatever the request says, q
  reported at the request's settings.
"""

from __future__ import annotations

import torch
from specd.plugins.draft_model import DraftModelDrafter
from specd.plugins.rejection import RejectionVerifier

from specd import Draft, Drafter, SamplingParams, hookimpl, sample, warp


class ResidualUnnormalised(RejectionVerifier):
    name = "mutant_residual_unnormalised"

    def residual(self, r, q):
        d = r - q
        d = d * (d > 0)
        return d if d.sum() > 0 else r


class ThresholdPlus(RejectionVerifier):
    name = "mutant_threshold_plus"

    def __init__(self, delta: float = 0.02) -> None:
        self.delta = delta

    def accept_probability(self, r_x, q_x):
        if q_x <= 0:
            return 1 if r_x > 0 else 0
        return min(1, float(r_x) / float(q_x) + self.delta)


class ExponentBias(RejectionVerifier):
    """Accepts with min(1, (r(x) / q(x)) ** gamma): the power analysis's second bias."""

    name = "mutant_exponent"

    def __init__(self, gamma: float = 1.1) -> None:
        self.gamma = gamma

    def accept_probability(self, r_x, q_x):
        if q_x <= 0:
            return 1 if r_x > 0 else 0
        return min(1, (float(r_x) / float(q_x)) ** self.gamma)


class _BonusMutant(RejectionVerifier):
    """Draws the bonus token (after a path that ends at a leaf) from :meth:`bonus_row`. A
    leaf's row of p is used for nothing but the bonus, so replacing it is the whole change."""

    def walk(self, tokens, parents, p, q, chance):
        p = p * 1  # a copy, for torch and for exact rows alike
        for leaf in set(range(len(tokens))) - set(parents):
            p[leaf + 1] = self.bonus_row(tokens, parents, p, q, leaf)
        return super().walk(tokens, parents, p, q, chance)

    def bonus_row(self, tokens, parents, p, q, leaf: int):
        raise NotImplementedError


class BonusFromQ(_BonusMutant):
    name = "mutant_bonus_from_q"

    def bonus_row(self, tokens, parents, p, q, leaf):
        return self.proposal(q, leaf, tokens[leaf], p[0])


class BonusWrongRow(_BonusMutant):
    name = "mutant_bonus_wrong_row"

    def bonus_row(self, tokens, parents, p, q, leaf):
        return p[parents[leaf] + 1]


class Rewarp(RejectionVerifier):
    name = "mutant_rewarp"

    def verify(self, draft, p, params, generator):
        return super().verify(draft, warp(p.log(), params), params, generator)


class QTwice(DraftModelDrafter):
    name = "mutant_q_twice"

    def propose(self, ctx, budget):
        draft = super().propose(ctx, budget)
        if draft is None or draft.q is None:
            return draft
        return Draft(draft.tokens, draft.parents, warp(draft.q.log(), ctx.params))


class Bigram(Drafter):
    """Drafts a chain from a fixed random table of next-token scores (seed 0, scale 1.5)."""

    name = "honest_bigram"
    reads_cache = False

    def __init__(self, scale: float = 1.5) -> None:
        self.scale = float(scale)
        self._table: torch.Tensor | None = None

    def scores(self, vocab: int, last: int) -> torch.Tensor:
        if self._table is None or self._table.shape[0] != vocab:
            gen = torch.Generator().manual_seed(0)
            self._table = torch.randn(vocab, vocab, generator=gen, dtype=torch.float64) * self.scale
        return self._table[last]

    def draw_row(self, logits, params):
        """The row the token is drawn from."""
        return warp(logits, params)

    def report_row(self, logits, params, drawn):
        """The row reported as q."""
        return drawn

    def propose(self, ctx, budget):
        last, tokens, rows = ctx.tokens[-1], [], []
        for _ in range(budget):
            logits = self.scores(ctx.vocab_size, last)
            drawn = self.draw_row(logits, ctx.params)
            last = int(drawn.argmax()) if ctx.params.greedy else sample(drawn, ctx.generator)
            tokens.append(last)
            rows.append(self.report_row(logits, ctx.params, drawn))
        return Draft.chain(tokens, None if ctx.params.greedy else torch.stack(rows))


class BigramQTwice(Bigram):
    name = "mutant_bigram_q_twice"

    def report_row(self, logits, params, drawn):
        return warp(drawn.log(), params)


class BigramQUnfiltered(Bigram):
    name = "mutant_bigram_q_unfiltered"

    def report_row(self, logits, params, drawn):
        return warp(logits, SamplingParams(temperature=params.temperature))


class BigramT1(Bigram):
    name = "mutant_bigram_t1"

    def draw_row(self, logits, params):
        if params.greedy:
            return warp(logits, params)
        return warp(logits, SamplingParams(temperature=1.0))

    def report_row(self, logits, params, drawn):
        return warp(logits, params)


#: Drafters whose reported q is not what their tokens were drawn from: only
#: ``drafter/q-honesty`` has to catch them.
Q_MUTANTS = (BigramQTwice, BigramQUnfiltered, BigramT1)


#: The four verifier mutants the engine-level law checks must catch behind ``ngram``.
ENGINE_MUTANTS = (ResidualUnnormalised, ThresholdPlus, BonusFromQ, BonusWrongRow)
VERIFIER_MUTANTS = (*ENGINE_MUTANTS, Rewarp)


@hookimpl
def specd_register_verifiers(register):
    for cls in VERIFIER_MUTANTS:
        register(cls)


@hookimpl
def specd_register_drafters(register):
    for cls in (QTwice, Bigram, *Q_MUTANTS):
        register(cls)
