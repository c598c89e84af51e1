"""Draft-model drafting: a small causal LM proposes the next tokens.

Tokens are drawn from ``warp(draft logits, params)``, the same warping the target's p goes
through, and that row is handed to the verifier as q: the distribution the token really
came from. At temperature 0 the draft is the draft model's argmax, which is deterministic,
so q is None. The ``topk`` tree is deterministic at every temperature (the k most likely
distinct tokens are not a sample), so its q is None too.

Shapes (``tree``):

- ``chain``: one token per level.
- ``iid``: ``branch`` tokens per level drawn i.i.d. from the same q row (repeats are kept:
  the verifier's residuals depend on every draw); the most probable of them is extended.
- ``topk``: the ``branch`` most likely distinct tokens per level; the first is extended.

Whether to draft another level is decided from the tokens drafted so far
(``ctx.keep_drafting``); a drawn token is never dropped because of its own probability, which
would make the draft a biased sample of q.

The drafter keeps its own KV cache (a :class:`specd.Target` cache over the draft model)
holding the committed tokens and the extended path of the last draft; on commit it rolls
back to the longest prefix that is still committed, so the next step feeds only new tokens.
The cache survives between requests, so a prompt that extends the previous one is not
recomputed.

``model`` names the draft model: an alias or local Hugging Face directory sharing the
target's tokenizer (as for ``--model``), ``target`` to draft with the served model itself
(acceptance close to 1; a reference point), or ``tiny:SEED`` for a tiny random model over the
target's vocabulary built by :func:`specd.tiny_model` (for tests and
``specd verify``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from specd import (
    MAX_DRAFT,
    BadInputError,
    Draft,
    DraftContext,
    Drafter,
    KVCache,
    Target,
    checks,
    hookimpl,
    sample,
    warp,
)

TREES = ("chain", "iid", "topk")
#: The most children per level of a tree (each a row of the draft model's pass).
MAX_BRANCH = 64


class DraftModelDrafter(Drafter):
    """:param model: the draft model (see the module docstring); required.
    :param tree: ``chain``, ``iid`` or ``topk``. :param branch: children per level in a tree.
    :param max_draft: cap on proposed tokens (the engine's budget also applies).
    :param dtype: dtype for a loaded draft model. :param device: its device (default: as for
    ``--device``). Drafting draws on the CPU, where the request's generator lives."""

    name = "draft_model"
    reads_cache = False  # its own model's cache, not the target's
    #: Options ``specd verify`` uses to run this drafter on a tiny target.
    conformance_options: ClassVar[dict[str, object]] = {"model": "tiny:0"}

    def __init__(
        self,
        model: str | None = None,
        tree: str = "chain",
        branch: int = 2,
        max_draft: int = 8,
        dtype: str | None = None,
        device: str | None = None,
    ) -> None:
        if not model:
            raise BadInputError(
                "draft_model needs a draft model: pass --drafter-option model=NAME, where NAME is "
                "an alias or Hugging Face directory sharing the target's tokenizer, 'target' "
                "(the served model itself) or 'tiny:SEED' (a tiny random model, for testing)"
            )
        if tree not in TREES:
            raise BadInputError(f"draft_model tree must be one of {', '.join(TREES)}, got {tree!r}")
        branch = checks.integer("draft_model", "branch", branch, hi=MAX_BRANCH)
        max_draft = checks.integer("draft_model", "max_draft", max_draft, hi=MAX_DRAFT)
        self.model_spec = str(model)
        self.tree = tree
        self.branch = branch if tree != "chain" else 1
        self.max_draft = max_draft
        self.dtype = dtype
        self.device = device
        self._model: Target | None = None
        self._loaded_for: int | None = None  # vocabulary a tiny model was built for
        self._cache: KVCache | None = None
        self._cached: list[int] = []  # the tokens whose keys and values the cache holds
        if not (self.model_spec == "target" or self.model_spec.startswith("tiny:")):
            self._model = self._load_named()
        elif dtype is not None or device is not None:
            given = "dtype" if dtype is not None else "device"
            raise BadInputError(
                f"draft_model option {given}: applies to a named draft model, not to "
                f"model={self.model_spec!r} (the target's, or a tiny model on the CPU)"
            )

    # -- the model and its cache ----------------------------------------------------------

    def _load_named(self) -> Target:
        from specd import load_target

        return load_target(self.model_spec, dtype=self.dtype, device=self.device)

    def _load_for(self, ctx: DraftContext) -> None:
        spec = self.model_spec
        if spec == "target":
            if ctx.target is None:
                raise BadInputError("draft_model model=target needs the engine's target")
            if self._model is None or self._model.model is not ctx.target.model:
                self._model = Target(ctx.target.model, ctx.target.tokenizer, name="target")
                self._cache = None
        elif spec.startswith("tiny:"):
            if self._loaded_for != ctx.vocab_size:
                try:
                    seed = int(spec.removeprefix("tiny:"))
                except ValueError:
                    raise BadInputError(
                        f"draft_model model {spec!r}: expected tiny:SEED with an integer seed"
                    ) from None
                lm = tiny_draft_model(ctx.vocab_size, seed)
                self._model = Target(lm, None, name=spec)
                self._loaded_for = ctx.vocab_size
                self._cache = None
        if self._cache is None:
            assert self._model is not None
            self._cache = self._model.new_cache()
            self._cached = []

    def _feed(self, new: Sequence[int]) -> torch.Tensor:
        """Append ``new`` (at least one token) to the cache.

        :returns: ``[V]`` logits after the last of them, on the CPU, where the request's
            generator draws.
        """
        assert self._model is not None and self._cache is not None
        if len(new) > 1:
            self._model.prefill(self._cache, new[:-1])
        out = self._model.forward(self._cache, new[-1:])
        self._cached.extend(new)
        return out.logits[-1].cpu()

    def _roll_back(self, tokens: Sequence[int]) -> None:
        """Keep the longest cached prefix of ``tokens[:-1]``: the last token is fed next."""
        n = len(self._cached)
        if n < len(tokens) and list(tokens[:n]) == self._cached:
            return
        keep = 0
        limit = min(n, len(tokens) - 1)
        while keep < limit and self._cached[keep] == tokens[keep]:
            keep += 1
        assert self._cache is not None
        self._cache.crop(keep)
        del self._cached[keep:]

    # -- the Drafter interface ------------------------------------------------------------

    def start(self, ctx: DraftContext) -> None:
        self._load_for(ctx)
        self._roll_back(ctx.tokens)

    def propose(self, ctx: DraftContext, budget: int) -> Draft | None:
        budget = min(budget, self.max_draft)
        if budget <= 0:
            return None
        vocab = ctx.vocab_size
        self._roll_back(ctx.tokens)
        logits = self._fit(self._feed(ctx.tokens[len(self._cached) :]), vocab)
        tokens: list[int] = []
        parents: list[int] = []
        rows: list[torch.Tensor] = []
        parent, depth = -1, 0
        greedy = ctx.params.greedy
        deterministic = greedy or self.tree == "topk"
        while True:
            q = warp(logits, ctx.params)  # [V]: what sampling draws from
            kids = self._children(logits, q, greedy, ctx.generator)[: budget - len(tokens)]
            first = len(tokens)
            tokens.extend(kids)
            parents.extend([parent] * len(kids))
            rows.extend([q] * len(kids))
            depth += 1
            # Extend the most probable child: for i.i.d. draws the highest q, else the first.
            best = (
                max(range(len(kids)), key=lambda i: float(q[kids[i]])) if self.tree == "iid" else 0
            )
            confidence = float((logits.float().softmax(-1) if greedy else q)[kids[best]])
            if len(tokens) >= budget or not ctx.keep_drafting(depth, confidence):
                break
            parent = first + best
            logits = self._fit(self._feed([tokens[parent]]), vocab)
        q_rows = None if deterministic else torch.stack(rows)  # [N, V]
        return Draft(tokens=tokens, parents=parents, q=q_rows)

    def commit(self, ctx: DraftContext, new_tokens: Sequence[int], accepted: int) -> None:
        self._roll_back(ctx.tokens)

    # -- helpers --------------------------------------------------------------------------

    def _children(
        self, logits: torch.Tensor, q: torch.Tensor, greedy: bool, generator: torch.Generator
    ) -> list[int]:
        if self.tree == "topk":
            k = min(self.branch, logits.shape[-1])
            return [int(t) for t in torch.topk(logits, k).indices]
        if greedy:  # argmax: i.i.d. copies of it would all be the same token
            return [int(q.argmax())]
        if self.branch == 1:
            return [sample(q, generator)]
        return [
            int(t) for t in torch.multinomial(q, self.branch, replacement=True, generator=generator)
        ]

    @staticmethod
    def _fit(logits: torch.Tensor, vocab: int) -> torch.Tensor:
        """Draft logits over the target's vocabulary: extra ids cut, missing ids impossible."""
        n = logits.shape[-1]
        if n == vocab:
            return logits
        if n > vocab:
            return logits[:vocab]
        pad = logits.new_full((vocab - n,), float("-inf"))
        return torch.cat([logits, pad])


#: The output scale of ``model=tiny:SEED``: 3/4 of the tiny target's, so with the same seed
#: it is a flatter draft model of that target (about 9 in 10 drafted tokens accepted in
#: ``specd verify``, the rest rejected), yet peaked enough that its distributions depend on
#: the temperature: a drafter that reports ``q`` warped twice fails the engine checks.
DRAFT_LOGIT_SCALE = 6.0


def tiny_draft_model(vocab_size: int, seed: int) -> torch.nn.Module:
    """What ``model=tiny:SEED`` loads: :func:`specd.tiny_model` (two layers) in
    float32, its output scaled by :data:`DRAFT_LOGIT_SCALE`. With the same seed it has the
    weights of ``specd verify``'s tiny target."""
    from specd import tiny_model

    return tiny_model(vocab_size, seed=seed, dtype=torch.float32, logit_scale=DRAFT_LOGIT_SCALE)


@hookimpl
def specd_register_drafters(register):
    register(DraftModelDrafter)
