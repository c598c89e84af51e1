"""The ``eagle`` drafter's true entries: the head's own KV cache, fed from the target's
features as steps commit, and the head's output after the newest entry (the root of the
next draft).

Entry ``p`` reads the target's feature of token ``p`` and the embedding of token ``p + 1``.
The features arrive with each verify pass (``ctx.hidden``) and queue until the head is next
asked for a draft; then all that arrived are fed in one call (through the step kernel where
it runs, :mod:`.kernel`), only the last ``window`` of them, so a long prompt costs no more to
catch up on than that. Between requests the entries of the longest common prefix are kept.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from specd import DraftContext, KVCache

from .head import EagleHead
from .kernel import HeadKernel


class HeadEntries:
    """The head's cache of true entries. :param window: true entries the head attends to
    (older ones are not fed at all). The drafter sets :attr:`_head`, :attr:`_kernel`,
    :attr:`_embed` (the target's input embedding) and :attr:`_lm_rows` (its LM head's rows
    of the draft vocabulary) when it loads a head, then :meth:`_reset`."""

    _embed: Any
    _lm_rows: Any

    def __init__(self, window: int) -> None:
        self.window = window
        #: seconds of the last proposal spent catching up on the entries of a prompt or of
        #: steps before the last one (those since it was last asked): not what a call costs
        #: where it is asked at every step (``hybrid`` prices its parts by that)
        self.catch_up_s = 0.0
        self._step_rows = 0  # features the last step's commit brought (0: none yet)
        self._head: EagleHead | None = None
        #: the head as one call of the step kernel, where it runs (None: through PyTorch)
        self._kernel: HeadKernel | None = None
        self._reset()

    def _reset(self) -> None:
        # the keys and values of the head's entries, one layer appended in place (float32
        # where the kernel reads them, whatever the head's dtype)
        self._cache = KVCache(1, capacity=64, dtype=torch.float32 if self._kernel else None)
        self._pos: list[int] = []  # position of each true entry (ascending)
        # [H] the head's output for each true entry (None: not computed, see _root)
        self._outs: list[torch.Tensor | None] = []
        self._ins: list[torch.Tensor] = []  # [H] the target feature each true entry read
        self._tokens: list[int] = []  # the sequence the entries describe
        self._feat: torch.Tensor | None = None  # [P, H] features not yet fed
        self._feat_start = 0  # position of self._feat[0]
        # [Vd] the kernel's draft-vocabulary scores of the newest true entry, where it fed it
        self._root_scores: torch.Tensor | None = None

    def _crop(self, entries: int) -> None:
        """Keep the first ``entries`` cache entries (true ones, or true plus draft ones)."""
        self._cache.crop(entries)

    def _take_features(self, ctx: DraftContext) -> None:
        """Queue ``ctx.hidden``: the features of the tokens just before the first one the
        target's cache does not hold (the pending one, or prompt tokens the prefill left)."""
        hidden, ctx.hidden = ctx.hidden, None
        if hidden is None or hidden.shape[0] == 0:
            return
        feat = hidden  # the target's features: its last hidden states after the final norm
        end = ctx.cache.length if ctx.cache is not None else len(ctx.tokens) - 1
        start = end - feat.shape[0]
        if self._feat is not None and self._feat_start + self._feat.shape[0] == start:
            self._feat = torch.cat([self._feat, feat])
        else:
            self._feat, self._feat_start = feat, start

    def _feed(self, tokens: list[int], pending: int) -> None:
        """Append true entries for every queued feature whose next token is known."""
        if self._feat is None:
            return
        start, end = self._feat_start, self._feat_start + self._feat.shape[0]
        last = min(end, pending)  # exclusive: the pending token's feature comes later
        # entries older than the window would never be attended to: a long prompt costs
        # no more to catch up on than ``window`` tokens
        first = max(start, self._pos[-1] + 1 if self._pos else 0, last - self.window)
        if first < last:
            t = time.perf_counter()
            feat = self._feat[first - start : last - start]
            nxt = torch.tensor(tokens[first + 1 : last + 1], device=feat.device)
            positions = list(range(first, last))
            if self._kernel is not None and last - first <= self._kernel.max_entries:
                scores, out = self._kernel_entries(feat, nxt, positions, None, keep=True)
                self._root_scores = scores[-1]
            else:
                # only the newest entry's output is read (the root of the next draft): the
                # others need their keys and values, not the layer's attention and MLP
                out = self._entries(feat, nxt, positions, None, last_only=True)
                self._root_scores = None
            self._pos.extend(range(first, last))
            self._outs.extend([None] * (last - first - 1) + [out[-1]])
            self._ins.extend(feat)
            # the entries of steps before the last one (or of the prompt): a catch-up
            n = last - first
            self.catch_up_s = (time.perf_counter() - t) * max(0, n - self._step_rows) / n
        if last >= end:
            self._feat = None
        elif last > start:
            self._feat, self._feat_start = self._feat[last - start :], last

    def _entries(
        self,
        feat: torch.Tensor,
        tokens: torch.Tensor,
        positions: list[int],
        ancestors: list[list[int]] | None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """Run the head over new entries and append them to its cache.

        :param ancestors: per entry, the cache indices of the draft entries it may see
            besides the true ones (None: true entries in causal order).
        :param last_only: compute the output of the last entry only.
        :returns: the predicted next features ``[T, H]`` (``[1, H]`` with ``last_only``)."""
        head = self._head
        assert head is not None
        x = head.entries(feat[None], self._embed[tokens][None])  # [1, T, H]
        pos = torch.tensor(positions, device=x.device)
        q, k, v = head.keys_values(x, pos)
        true, old, lo = len(self._pos), self._cache.length, self._window_start()
        keys, values = self._cache.layer(0).update(k, v)
        t, s = k.shape[2], self._cache.length
        mask: torch.Tensor | None = None  # causal: the head builds it where rows need it
        if ancestors is not None:
            mask = torch.zeros(t, s - lo, dtype=torch.bool, device=x.device)
            mask[:, : true - lo] = True
            for row, seen in enumerate(ancestors):
                mask[row, [i - lo for i in seen]] = True  # draft entries: past the true ones
                mask[row, old + row - lo] = True
        if last_only:  # (the last of a causal batch sees every entry attended to)
            x, q = x[:, -1:], q[:, :, -1:]
            mask = None if mask is None else mask[-1:]
        return head.finish(x, q, keys[:, :, lo:], values[:, :, lo:], mask)[0]

    def _kernel_entries(
        self,
        feat: torch.Tensor,
        tokens: torch.Tensor,
        positions: list[int],
        tree: torch.Tensor | None,
        keep: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_entries` in one call of the step kernel (:mod:`.kernel`): the new entries
        see the window's true entries and each other as ``tree`` says (None: causal).
        :param keep: append them to the cache (true entries; drafts are fed again instead).
        :returns: their draft-vocabulary scores ``[T, Vd]`` and outputs ``[T, H]``."""
        head, kernel = self._head, self._kernel
        assert head is not None and kernel is not None
        feat = feat.to(head.ln1.dtype)  # the kernel's outputs are float32 whatever the head's
        x = head.entries(feat[None], self._embed[tokens][None])[0]
        return kernel.run(x, positions, self._cache, self._window_start(), tree, keep)

    def _window_start(self) -> int:
        """The oldest cache entry new entries attend to, the window's first true one: the
        ones before it are left out of the attention (a mask's columns count from it)."""
        return min(max(0, len(self._pos) - self.window), self._cache.length)

    def _root_logp(self) -> torch.Tensor:
        """Log probabilities over the draft vocabulary ``[Vd]`` after the newest true entry."""
        if self._root_scores is not None:
            return torch.log_softmax(self._root_scores.float(), -1)
        return self._logp(self._root()[None])[0]

    def _root(self) -> torch.Tensor:
        """The newest true entry's output ``[H]``, computed now if its batch skipped it (a
        request that kept entries up to one fed in the middle of a batch)."""
        out = self._outs[-1]
        if out is None:
            head = self._head
            layer = self._cache.layer(0)
            assert head is not None and layer.keys is not None and layer.values is not None
            n, p = len(self._pos), self._pos[-1]
            tok = torch.tensor([self._tokens[p + 1]], device=self._ins[-1].device)
            x = head.entries(self._ins[-1][None, None], self._embed[tok][None])
            q, _, _ = head.keys_values(x, torch.tensor([p], device=x.device))
            lo = max(0, n - 1 - self.window)  # the entries it attends to: the window's
            out = head.finish(x, q, layer.keys[:, :, lo:n], layer.values[:, :, lo:n], None)[0, 0]
            self._outs[-1] = out
        return out

    def _scores(self, feat: torch.Tensor) -> torch.Tensor:
        """The head's logits over the draft vocabulary ``[..., Vd]`` for features ``feat``."""
        product = self._head.product  # type: ignore[union-attr]
        return feat @ self._lm_rows.T if product is None else product(feat, self._lm_rows)

    def _logp(self, feats: torch.Tensor) -> torch.Tensor:
        """Log probabilities over the draft vocabulary ``[F, Vd]``, one product for all."""
        return torch.log_softmax(self._scores(feats).float(), -1)
