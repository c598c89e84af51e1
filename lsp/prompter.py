"""Fill-in-the-middle prompts for one engine, as both servers build them: the template the
``fim`` setting picks, token healing, the budgets the settings give, other files as
context, the window of a document a prompt reads, and what ``prefix-tokens = "auto"``
stands for on this machine.

:mod:`.prompting` holds the templates and the layout of a prompt; the completion pipeline
(:mod:`.completer`) and the HTTP server (:mod:`.http.prompts`) build theirs through
:class:`Prompter`, so an editor over LSP and one over ``/infill`` get the same prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import astuple

from . import prompting
from .config import AUTO_PREFIX_SIZES, COLD_READ_S, Settings
from .documents import Cursor, Document, Position
from .engines import CompletionEngine

log = logging.getLogger(__name__)

#: A request's prefill of at least this many tokens measures the speed again (see
#: :meth:`PrefixSize.observed`); shorter ones read at a different rate per token.
OBSERVE_MIN_TOKENS = 192


class PrefixSize:
    """What ``prefix-tokens = "auto"`` stands for: the prompt's text before the cursor is
    sized so that a prompt of which nothing is cached (a file just opened) is read in
    about :data:`~.config.COLD_READ_S`, as measured on this machine. The largest of
    :data:`~.config.AUTO_PREFIX_SIZES` that fits (coarse, so that the noise of one
    measurement rarely moves it), the smallest where none does, and the largest while
    nothing was measured (a remote backend, ``specd complete``).

    One lives on each server's service: it is measured at load and read by every prompt.
    """

    def __init__(self) -> None:
        #: the size "auto" stands for now, in tokens
        self.tokens = AUTO_PREFIX_SIZES[-1]
        #: the fastest prefill measured, tokens/s (0: nothing measured)
        self.best_rate = 0.0

    def resolve(self, settings: Settings) -> int:
        """``settings.prefix_tokens``, with "auto" resolved."""
        n = settings.prefix_tokens
        return self.tokens if n == "auto" else n

    def measured(self, tokens_per_s: float) -> int:
        """Size "auto" from a measured prefill speed. :returns: the size."""
        self.best_rate = tokens_per_s
        fits = [n for n in AUTO_PREFIX_SIZES if n <= tokens_per_s * COLD_READ_S]
        self.tokens = fits[-1] if fits else AUTO_PREFIX_SIZES[0]
        return self.tokens

    def observed(self, tokens: int, seconds: float) -> int | None:
        """A request's prefill, timed. Other work on the machine only slows a prefill, so
        the fastest one measured is the best estimate of what a cold read costs: the probe
        at start can catch a busy moment (on a shared 2-core machine it measured 480
        tokens/s where requests then read 700) and would size every prompt of the session
        small. Where this prefill was faster than any measurement before, "auto" is sized
        again.

        :returns: the new size where it changed, else None (also where nothing was
            measured at start: "auto" then stands for the largest size and stays so).
        """
        if tokens < OBSERVE_MIN_TOKENS or seconds <= 0 or not self.best_rate:
            return None
        rate = tokens / seconds
        if rate <= self.best_rate:
            return None
        old = self.tokens
        new = self.measured(rate)
        return new if new != old else None


#: Text after the cursor copied out whatever the suffix budget: post-processing reads it
#: so that a completion does not repeat what follows the cursor.
MIN_AFTER_CHARS = 400
#: The window's start moves in steps of this many lines at most (see :func:`cursor_at`),
#: and a typical line of code has about ``LINE_CHARS`` characters.
ALIGN_LINES, LINE_CHARS = 32, 40


def cursor_at(
    doc: Document,
    pos: Position,
    settings: Settings,
    chars_per_token: float = prompting.CHARS_PER_TOKEN,
    *,
    ahead_chars: int = 0,
    prefix_size: PrefixSize | None = None,
) -> Cursor:
    """The text around ``pos`` that a completion with these settings may use.

    :param chars_per_token: the document's measured ratio. The text before the cursor is
        cut (at an aligned line, see :meth:`Document.cursor`) to what fits the prefix
        budget, so the prompt's token budget never has to cut it again: a cut by tokens
        would move with every keystroke and invalidate the whole cached prompt. The line
        steps by at most half the window's lines (32 at most): steps of 32 lines in a
        window of 25 could leave the prompt nothing but the cursor's own line.
    :param ahead_chars: where fewer than this many more characters typed before the cursor
        would move the window's start down, the window after that step (what a warm-up
        reads ahead of time, so the request after the step finds its prompt cached).
    :param prefix_size: what ``prefix-tokens = "auto"`` stands for (the service's; None:
        nothing measured, the largest size).
    """
    size = (prefix_size or PrefixSize()).resolve(settings)
    before = int(size * min(chars_per_token, prompting.CHARS_PER_TOKEN))
    return doc.cursor(
        pos,
        before_chars=before,
        after_chars=max(settings.suffix_tokens * prompting.CHARS_PER_TOKEN, MIN_AFTER_CHARS),
        align_lines=max(4, min(ALIGN_LINES, before // (2 * LINE_CHARS))),
        ahead_chars=ahead_chars,
    )


def chars_per_token(text: str, encode: Callable[[str], list[int]], sample: int = 20_000) -> float:
    """Characters per token of ``text`` (its first ``sample`` characters), with a tenth
    of margin so a window sized by it stays within its token budget."""
    head = text[:sample]
    n = len(encode(head)) if head.strip() else 0
    return 0.9 * len(head) / n if n else float(prompting.CHARS_PER_TOKEN)


class Prompter:
    """Builds prompts with one engine's tokenizer.

    :param engine: what generates: its tokenizer builds the prompt, its ``heal`` does
        token healing (a remote backend's heals nothing).
    :param prefix_size: what "auto" stands for (default: nothing measured).
    """

    def __init__(self, engine: CompletionEngine, prefix_size: PrefixSize | None = None) -> None:
        self.vocab = prompting.Vocabulary(engine.tokenize, engine.tokenizer)
        self.prefix_size = prefix_size or PrefixSize()
        self._window = engine.limits.window
        self._cut: prompting.Budget | None = None  # the last budget cut to fit (logged)
        self._heal = engine.heal
        self._templates: dict[str, prompting.Template | None] = {}

    def template(self, setting: str) -> prompting.Template | None:
        """The template the ``fim`` setting picks for this model (None: prefix-only)."""
        if setting not in self._templates:
            self._templates[setting] = prompting.choose_template(self.vocab, setting)
        return self._templates[setting]

    def budget(self, settings: Settings) -> prompting.Budget:
        """The settings' token budgets, "auto" resolved, within the model's context window
        (:meth:`.prompting.Budget.fit`; a budget cut to fit is logged when it changes)."""
        asked = prompting.Budget(
            self.prefix_size.resolve(settings), settings.suffix_tokens, settings.context_tokens
        )
        fitted = asked.fit(self._window)
        if fitted != asked and asked != self._cut:
            self._cut = asked
            log.warning(
                "prefix-tokens %d, suffix-tokens %d and context-tokens %d do not fit in the "
                "model's context window of %d tokens: using %d, %d and %d",
                *astuple(asked),
                self._window,
                *astuple(fitted),
            )
        return fitted

    def context(
        self, files: Iterable[tuple[str, str | Sequence[int]]], limit: int, most: int | None = None
    ) -> list[prompting.ContextDocument]:
        """Other files as context documents, each cut to ``limit`` tokens, until ``limit``
        tokens (or ``most`` files) are offered: the rest could not be placed.

        :param files: (path, text or its token ids) of each, most relevant first; read
            only as far as needed (a generator's later files are never tokenized).
        """
        out: list[prompting.ContextDocument] = []
        offered = 0
        for path, head in files:
            if offered >= limit or (most is not None and len(out) >= most):
                break
            if isinstance(head, str):
                ids = self.vocab.encode(head[: limit * prompting.CHARS_PER_TOKEN])[:limit]
            else:
                ids = list(head[:limit])
            if ids:
                out.append(prompting.ContextDocument(path or "context", ids))
                offered += len(ids)
        return out

    def build(
        self,
        settings: Settings,
        cursor: Cursor,
        *,
        path: str = "",
        others: Sequence[prompting.ContextDocument] = (),
        budget: prompting.Budget | None = None,
        heal: bool = True,
    ) -> prompting.Prompt:
        """The prompt for completing at ``cursor``, in the template the settings pick.

        :param budget: default: the settings' budgets.
        :param heal: heal the end of the prefix when the ``token-healing`` setting is on
            (the answer must then go through ``prompt.at_cursor``).
        """
        return prompting.build(
            self.template(settings.fim),
            self.vocab,
            cursor,
            path=path,
            others=others,
            budget=budget or self.budget(settings),
            heal=self._heal if heal and settings.token_healing else None,
        )
