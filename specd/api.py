"""The interfaces plugins implement: Drafter, Verifier, ExitPolicy, and what they are given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from .draft import Draft, Verdict
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .forward.target import Target
    from .kvcache import KVCache
    from .ngram_index import Corpus


@dataclass
class DraftContext:
    """Everything a drafter may read while it proposes. One per request.

    ``tokens`` is the committed sequence (prompt + generated so far) and grows in place.
    ``target`` gives access to the served model for drafters that share it (early exit,
    EAGLE); ``cache`` is the target's KV cache for this request, holding every committed
    token but the last: a drafter may append to it while it drafts and must crop it back
    to the length it found. ``hidden`` (for a drafter with ``wants_hidden``) holds the
    target's last hidden states ``[T, H]`` (after its final norm: what its LM head reads)
    of the T tokens just
    before the first one the cache does not hold (row ``i`` belongs to
    ``tokens[cache.length - T + i]``): at :meth:`Drafter.start` those of the prompt the
    prefill computed (the prefix cache keeps them for reused tokens; when it has none, only
    the tokens the prefill computed; only the last ``Drafter.feature_rows`` where the drafter
    sets it; for a drafter without ``reads_cache`` the prefill may
    leave the last prompt tokens to the first step), at :meth:`Drafter.commit` those of the
    last step's pending token and accepted draft tokens, preceded by the prompt tokens the
    prefill left when it was the first step, from the verify pass. They cost no
    extra target work. ``corpus`` is extra text to draft from (open documents, recently
    accepted completions), or None.
    """

    tokens: list[int]
    params: SamplingParams
    generator: torch.Generator
    vocab_size: int
    target: Target | None = None
    corpus: Corpus | None = None
    exit_policy: ExitPolicy | None = None
    hidden: torch.Tensor | None = None
    cache: KVCache | None = None

    def keep_drafting(self, position: int, confidence: float) -> bool:
        """Ask the exit policy whether to draft position ``position`` (0-based) after a
        proposal of the given confidence (the drafter's probability of its own token)."""
        if self.exit_policy is None:
            return True
        return self.exit_policy.continue_drafting(position, confidence)


class Drafter:
    """Proposes a Draft for the current context.

    A drafter is created once per engine and reused across requests: :meth:`start` marks the
    beginning of a request, :meth:`propose` is called before each target step and
    :meth:`commit` after it with the tokens that were appended to ``ctx.tokens``.
    """

    name: ClassVar[str] = ""
    #: True when the drafter needs ``ctx.hidden`` (the target's last hidden state).
    #: Read as each request starts, before :meth:`start`; an instance may change it.
    wants_hidden: bool = False
    #: False when the drafter never reads ``ctx.target``'s cache (``ctx.cache``): its first
    #: draft may then be verified together with the last few prompt tokens, which the
    #: cache does not hold yet (one target pass instead of two on the next keystroke).
    #: Read like ``wants_hidden``.
    reads_cache: bool = True
    #: With ``wants_hidden``: the most features of the prompt's last tokens the drafter reads
    #: as a request starts (None: all the prefill computes). The prefill then runs its last
    #: layer for those rows alone, and ``ctx.hidden`` at :meth:`start` holds only them.
    #: Read like ``wants_hidden``.
    feature_rows: int | None = None

    def start(self, ctx: DraftContext) -> None:
        """A request starts; ``ctx.tokens`` holds the prompt. Not called for a request of one
        token (no room for a draft beside the target's own): nor is anything else."""

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        """Return at most ``budget`` draft nodes, or None to let the target take a plain step."""
        raise NotImplementedError

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        """``new_tokens`` were appended to ``ctx.tokens``; the first ``accepted`` came from
        the last draft, the final one from the target."""

    def finish(self, ctx: DraftContext) -> None:
        """The request ended (normally, cancelled or by error)."""


class Verifier:
    """Decides which draft nodes to keep, given the target's warped distributions."""

    name: ClassVar[str] = ""
    #: Which decoding modes this verifier keeps exact: "greedy", "sampled" or both.
    exact_for: ClassVar[frozenset[str]] = frozenset()

    def verify(
        self,
        draft: Draft,
        p: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> Verdict:
        """Decide the accepted path and the next token.

        :param draft: the proposal (N nodes).
        :param p: ``[N + 1, V]`` the target's warped distribution at the root (row 0) and
            after each node (row i + 1), built with :func:`specd.sampling.warp`.
        :param params: the request's sampling parameters.
        :param generator: the request's random generator; the only source of randomness.
        :returns: the accepted path and one token from the target.
        """
        raise NotImplementedError


class ExitPolicy:
    """How much to speculate: draft budget, when to stop drafting, when to give up."""

    name: ClassVar[str] = ""
    #: What verifying costs on this host: ``pass_cost(n)`` is the time of a target pass over
    #: ``n`` tokens (the pending token and ``n - 1`` draft tokens) relative to a one-token
    #: step, as measured when the model was loaded (``Target.pass_cost``). The engine sets
    #: it on the instance before :meth:`start`; None where the target was not priced.
    pass_cost: Callable[[int], float] | None = None
    #: What drafting costs on this host: ``draft_cost(k)`` is the expected time of asking
    #: the request's drafter for ``k`` tokens, in one-token steps, from its recent calls
    #: (``specd.speculation.DraftClock``). Set by the engine beside :attr:`pass_cost`; None
    #: where passes are not priced.
    draft_cost: Callable[[int], float] | None = None
    #: Whether the policy weighs drafts against what they cost (:attr:`pass_cost`,
    #: :attr:`draft_cost`) and stops drafting where they do not pay. A drafter may then rest
    #: across requests where its drafts did not (``eagle``); under a policy that drafts
    #: whatever it costs (``fixed``), it drafts in every request.
    prices_drafts: ClassVar[bool] = False

    def start(self, max_budget: int) -> None:
        """A request starts; budgets must stay within ``max_budget``."""

    def draft_budget(self) -> int:
        """How many draft tokens to ask for in the next step; 0 means a plain step."""
        raise NotImplementedError

    def continue_drafting(self, position: int, confidence: float) -> bool:
        """Whether a drafter should draft position ``position`` after a token it gave
        probability ``confidence``."""
        return True

    def observe(self, drafted: int, accepted: int) -> None:
        """The last step drafted ``drafted`` tokens deep and the target accepted ``accepted``
        of them. For a tree, ``drafted`` is its deepest path (the most it could accept), not
        its node count, so a tree is judged like a chain of that length."""

    def exit_layer(self, num_layers: int) -> int | None:
        """For early-exit drafting: the layer to exit at, or None for the drafter's default."""
        return None
