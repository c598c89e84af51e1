"""The completion pipeline: prompt -> prefill -> engine.stream -> post-process.

The language server and ``specd complete`` both run exactly this. It runs on one thread
at a time (the server's generation worker, or the CLI's main thread) and reads only the
immutable :class:`CompletionRequest` it is given, never live documents.

The prompt's prefill is not charged to the time budget (it only stops on cancellation):
a budget spent on the prefill would leave nothing to show. In the server a request
answers as soon as its first line is complete (``on_answer``) and the generation goes
on in the background, writing into the completion cache (:mod:`.cache`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specd import SamplingParams, Stats

from . import config, postprocess, prompting
from .cache import Entry
from .config import Settings, prefix_tokens
from .documents import Cursor, Document, Position
from .engines import CompletionEngine
from .metrics import Metrics
from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)

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
    """
    before = int(prefix_tokens(settings) * min(chars_per_token, prompting.CHARS_PER_TOKEN))
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


def shape_of(req: CompletionRequest) -> postprocess.Shape:
    """The shape of a completion for ``req``: one place, so an answer from the completion
    cache is shaped exactly as one from the model."""
    s = req.settings
    return postprocess.shape_for(req.cursor, mode=s.mode, max_lines=s.max_lines, path=req.path)


@dataclass
class CompletionRequest:
    """Everything one completion needs, copied out of the session on the event loop.

    :param others: other open documents, most relevant first (read-only snapshots are
        taken by the worker; their lines are never changed in place).
    :param on_lines: called on the worker thread with the post-processed text each time
        it gains a finished line (for partial results).
    :param on_answer: called on the worker thread, once, with the answer as soon as its
        first line is complete (None: the answer is the return value, at the end).
    :param entry: the completion-cache entry that receives what the model writes; with
        one, the generation goes on past the answer until ``max_tokens``, a line cap or a
        cancel, to fill it.
    :param version: the document's version when the request was made.
    """

    cursor: Cursor
    path: str
    settings: Settings
    others: Sequence[Document] = ()
    root_uri: str | None = None
    workspace: WorkspaceIndex | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    uri: str = ""
    on_lines: Callable[[str], None] | None = None
    on_answer: Callable[[CompletionResult], None] | None = None
    entry: Entry | None = None
    version: int = 0


@dataclass
class CompletionResult:
    text: str
    raw_text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    template: str = ""
    stats: Stats | None = None

    @property
    def cancelled(self) -> bool:
        return self.finish_reason == "cancelled"

    def as_json(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "raw_text": self.raw_text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "template": self.template,
            "stats": self.stats.as_json() if self.stats is not None else None,
        }


class Completer:
    """Completes with one engine.

    :param params: base sampling parameters (``max-tokens`` in the settings overrides
        their ``max_tokens``).
    """

    def __init__(
        self,
        engine: CompletionEngine,
        params: SamplingParams | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.engine = engine
        self.params = params or SamplingParams()
        self.metrics = metrics or Metrics()
        self.vocab = prompting.Vocabulary(engine.tokenize, engine.tokenizer)
        self._templates: dict[str, prompting.Template | None] = {}

    def template(self, setting: str) -> prompting.Template | None:
        if setting not in self._templates:
            self._templates[setting] = prompting.choose_template(self.vocab, setting)
        return self._templates[setting]

    def complete(self, req: CompletionRequest) -> CompletionResult:
        """Run one completion to its answer (and, with ``on_answer``, on in the background),
        its cancellation, or its time budget."""
        s = req.settings
        if req.cancel.is_set():
            return self._cancelled(req)
        corpus = self._corpus(req)
        prompt = self._cold_start(req, self.build_prompt(req))
        shape = shape_of(req)
        params = self.params
        if s.max_tokens is not None:
            params = dataclasses.replace(params, max_tokens=s.max_tokens)

        # prefill: unbudgeted, cancellable between chunks; a warm-up may have done it. In a
        # plain prefill's chunks (a third faster than a warm-up's on a long prompt: only a
        # newer request for the document, which needs the same tokens, interrupts it); the
        # few tokens typed since go with the first step's draft (one forward, not two).
        t0 = time.perf_counter()
        reused, computed = self.engine.warm(prompt.ids, req.cancel, request=True)
        prefill_s = time.perf_counter() - t0
        if req.cancel.is_set():
            return self._cancelled(req)
        resized = config.observed_prefill(computed, prefill_s)
        if resized is not None:
            log.info(
                "prefill %.0f tokens/s: prefix-tokens auto = %d", computed / prefill_s, resized
            )

        # Stopping early goes through the engine's cancel check (not gen.close()), so the
        # generation still ends normally and reports its stats.
        halt = threading.Event()
        deadline = time.monotonic() + s.time_budget_ms / 1000
        early = req.on_answer is not None  # answer at the first line
        background = req.entry is not None  # past the answer, go on filling the cache
        answer: CompletionResult | None = None

        def stop() -> bool:
            if halt.is_set() or req.cancel.is_set():
                return True
            return answer is None and time.monotonic() > deadline  # the budget: answers only

        gen = self.engine.stream(
            prompt.ids, params, cancel=stop, corpus=corpus, constraint=prompt.constraint
        )
        raw = ""
        finish = ""
        lines_seen = 0
        for delta in gen:
            if halt.is_set():
                continue  # drain: the engine ends before its next target step
            piece, stopped = self._cut_at_stop(delta, prompt.stop_ids)
            raw += piece
            shown = prompt.at_cursor(raw)  # without the text token healing writes again
            if req.entry is not None:
                req.entry.raw = shown
            if stopped:
                finish = "stop"
            if answer is None:
                done = stopped or postprocess.should_stop(shown, shape)
                if done or (early and s.first_line and _first_line(shown, shape)):
                    answer = self._answer(
                        req, shown, shape, "stop" if stopped else "complete", done
                    )
                elif early and time.monotonic() > deadline:
                    answer = self._answer(req, shown, shape, "time", False)
                elif req.on_lines is not None and shown.count("\n") > lines_seen:
                    lines_seen = shown.count("\n")
                    req.on_lines(postprocess.finish(shown, shape))
                if answer is not None and not background:
                    halt.set()
            elif stopped or shown.count("\n") > s.max_lines:
                halt.set()  # the cache holds enough past the answer
        completion = gen.completion
        stats = completion.stats if completion is not None else None
        if stats is not None:  # count the prefill done above as this request's own
            stats.reused_tokens, stats.prefill_s = reused, prefill_s
            stats.total_s += prefill_s
            if stats.new_tokens:
                stats.ttft_s += prefill_s
        end = finish or (stats.finish_reason if stats is not None else "")
        if end == "cancelled" and answer is None and not req.cancel.is_set():
            end = "time"  # the deadline, checked in ``stop``
        if req.entry is not None:
            req.entry.finish_reason = end or "length"
        if answer is None:
            if req.cancel.is_set() and end in ("", "cancelled"):
                return self._cancelled(req, stats)
            answer = self._answer(req, prompt.at_cursor(raw), shape, end, True)
        answer.raw_text = raw
        answer.token_ids = list(completion.token_ids) if completion is not None else []
        answer.template, answer.stats = prompt.template, stats
        if stats is not None:
            self.metrics.record(stats, text=answer.text)
        return answer

    def warm(self, req: CompletionRequest) -> tuple[int, int]:
        """Prefill the prompt ``req`` would use, in the background (cancellable).

        :returns: (tokens already cached, tokens computed now).
        """
        if req.cancel.is_set():
            return 0, 0
        # No refresh of the drafting index: the prompt does not depend on it, and
        # re-tokenizing the edited document could not be interrupted by a request.
        return self.engine.warm(self.build_prompt(req).ids, req.cancel)

    def _answer(
        self, req: CompletionRequest, raw: str, shape: postprocess.Shape, finish: str, done: bool
    ) -> CompletionResult:
        """The answer for the text so far, handed to ``on_answer`` if there is one."""
        if done:
            text = postprocess.finish(raw, shape, finish_reason=finish)
        else:  # only finished lines: the last one may still change
            text = postprocess.finish(raw[: raw.rfind("\n") + 1] or raw, shape)
        if not text and raw.strip() and finish == "time":
            text = postprocess.finish(raw, shape)  # never empty when the model wrote text
        result = CompletionResult(text, raw, finish_reason=finish)
        if not done:
            self.metrics.count("first_line_answers")
        if req.on_answer is not None:
            req.on_answer(result)
        return result

    def _corpus(self, req: CompletionRequest) -> Any:
        if req.workspace is not None and req.settings.workspace_drafting:
            req.workspace.refresh()
            return req.workspace.corpus
        return None

    def _cancelled(self, req: CompletionRequest, stats: Stats | None = None) -> CompletionResult:
        if req.entry is not None:
            req.entry.finish_reason = "cancelled"
        return CompletionResult("", finish_reason="cancelled", stats=stats)

    def _cold_start(self, req: CompletionRequest, prompt: prompting.Prompt) -> prompting.Prompt:
        """``prompt``, or a shorter one when the prefix cache holds too little of it to
        answer soon (``cold-prompt-tokens``): the last tokens before the cursor only. The
        full prompt is what the warm-ups fill, so later requests get it back."""
        limit = req.settings.cold_prompt_tokens
        if not limit:
            return prompt
        cached = self.engine.cached_tokens
        todo = len(prompt.ids) - cached(prompt.ids)
        if todo <= limit:
            return prompt
        s = req.settings
        short = self.build_prompt(req, prompting.Budget(limit, min(s.suffix_tokens, limit // 4), 0))
        if len(short.ids) - cached(short.ids) >= todo:
            return prompt
        self.metrics.count("cold_prompts")
        return short

    def build_prompt(
        self, req: CompletionRequest, budget: prompting.Budget | None = None
    ) -> prompting.Prompt:
        """The prompt for ``req``, within ``budget`` (default: the request's settings)."""
        s = req.settings
        if budget is None:
            budget = prompting.Budget(prefix_tokens(s), s.suffix_tokens, s.context_tokens)
        others: list[prompting.ContextDocument] = []
        if budget.context_tokens:
            for doc in req.others:
                if len(others) >= 8:
                    break
                if req.workspace is not None:
                    ids = req.workspace.head_tokens(doc, budget.context_tokens)
                else:
                    head = doc.head(budget.context_tokens * prompting.CHARS_PER_TOKEN)
                    ids = self.vocab.encode(head)[: budget.context_tokens]
                if ids:
                    others.append(
                        prompting.ContextDocument(
                            prompting.display_path(doc.uri, req.root_uri), ids
                        )
                    )
        return prompting.build(
            self.template(s.fim),
            self.vocab,
            req.cursor,
            path=req.path,
            others=others,
            budget=budget,
            heal=self.engine.heal if s.token_healing else None,
        )

    def _cut_at_stop(self, delta: Any, stop_ids: frozenset[int]) -> tuple[str, bool]:
        """The delta's text, cut before a template stop token (``<file_sep>``...)."""
        if not stop_ids:
            return delta.text, False
        for i, t in enumerate(delta.token_ids):
            if t in stop_ids:
                return self.engine.tokenizer.decode(
                    delta.token_ids[:i], skip_special_tokens=True
                ), True
        return delta.text, False


def _first_line(raw: str, shape: postprocess.Shape) -> bool:
    """Whether ``raw`` holds a finished line that shows as a non-empty completion."""
    cut = raw.rfind("\n")
    return cut >= 0 and bool(postprocess.finish(raw[: cut + 1], shape).strip())
