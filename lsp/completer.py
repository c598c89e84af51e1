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

from . import postprocess, prompting
from .cache import Entry
from .config import Settings
from .documents import Cursor, Document
from .engines import CompletionEngine
from .metrics import Metrics
from .prompter import PrefixSize, Prompter
from .prompter import chars_per_token as chars_per_token  # the server's, with cursor_at
from .prompter import cursor_at as cursor_at
from .runner import ServedGeneration
from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)


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
    :param prefix_size: what ``prefix-tokens = "auto"`` stands for (the service's);
        request prefills that read faster than any before size it again.
    """

    def __init__(
        self,
        engine: CompletionEngine,
        params: SamplingParams | None = None,
        metrics: Metrics | None = None,
        prefix_size: PrefixSize | None = None,
    ) -> None:
        self.engine = engine
        self.params = params or SamplingParams()
        self.metrics = metrics or Metrics()
        self.prompter = Prompter(engine, prefix_size)
        self.vocab = self.prompter.vocab

    def complete(self, req: CompletionRequest) -> CompletionResult:
        """Run one completion to its answer (and, with ``on_answer``, on in the background),
        its cancellation, or its time budget: build the prompt, fill the prefix cache,
        generate, post-process, record."""
        if req.cancel.is_set():
            return self._cancelled(req)
        corpus = self._corpus(req)
        prompt = self._cold_start(req, self.build_prompt(req))
        reused, prefill_s = self._prefill(req, prompt)
        if req.cancel.is_set():
            return self._cancelled(req)
        run = self._generate(req, prompt, corpus)
        stats = run.stats(reused, prefill_s)
        if run.answer is None and req.cancel.is_set() and run.end in ("", "cancelled"):
            return self._cancelled(req, stats)
        return self._record(self._postprocess(run, stats))

    def warm(self, req: CompletionRequest) -> tuple[int, int]:
        """Prefill the prompt ``req`` would use, in the background (cancellable).

        :returns: (tokens already cached, tokens computed now).
        """
        if req.cancel.is_set():
            return 0, 0
        # No refresh of the drafting index: the prompt does not depend on it, and
        # re-tokenizing the edited document could not be interrupted by a request.
        return self.engine.warm(self.build_prompt(req).ids, req.cancel)

    def build_prompt(
        self, req: CompletionRequest, budget: prompting.Budget | None = None
    ) -> prompting.Prompt:
        """The prompt for ``req``, within ``budget`` (default: the request's settings)."""
        s = req.settings
        budget = budget or self.prompter.budget(s)
        files = (
            (prompting.display_path(doc.uri, req.root_uri), self._head(req, doc, budget))
            for doc in req.others
        )
        others = self.prompter.context(files, budget.context_tokens, most=8)
        return self.prompter.build(s, req.cursor, path=req.path, others=others, budget=budget)

    # -- the steps ------------------------------------------------------------------------

    def _prefill(self, req: CompletionRequest, prompt: prompting.Prompt) -> tuple[int, float]:
        """Look the prompt up in the prefix cache and compute what it lacks (a warm-up may
        have done it all): not charged to the time budget, cancellable between chunks, in
        a plain prefill's chunks (a third faster than a warm-up's on a long prompt; only a
        newer request for the document, which needs the same tokens, interrupts it). The
        few tokens typed since go with the first step's draft (one forward, not two). The
        time it took sizes ``prefix-tokens = "auto"`` again where it was the fastest yet.

        :returns: (tokens the cache held, seconds it took).
        """
        t0 = time.perf_counter()
        reused, computed = self.engine.warm(prompt.ids, req.cancel, request=True)
        seconds = time.perf_counter() - t0
        if not req.cancel.is_set():
            resized = self.prompter.prefix_size.observed(computed, seconds)
            if resized is not None:
                log.info(
                    "prefill %.0f tokens/s: prefix-tokens auto = %d", computed / seconds, resized
                )
        return reused, seconds

    def _generate(self, req: CompletionRequest, prompt: prompting.Prompt, corpus: Any) -> _Run:
        """Generate, post-processing the text as it grows (:meth:`_take`). The generation
        ends at the answer, or past it once the completion cache holds enough; at the
        time budget while nothing has answered; at a template stop token; at a cancel."""
        s = req.settings
        params = self.params
        if s.max_tokens is not None:
            params = dataclasses.replace(params, max_tokens=s.max_tokens)
        run = _Run(req, prompt, shape_of(req), time.monotonic() + s.time_budget_ms / 1000)
        run.generation = ServedGeneration(
            prompt.ids,
            params,
            stop_ids=prompt.stop_ids,
            should_stop=run.over_budget,
            corpus=corpus,
            constraint=prompt.constraint,
        )
        for delta in run.generation.run(self.engine, req.cancel):
            self._take(run, delta.text)
        return run

    def _take(self, run: _Run, piece: str) -> None:
        """One more piece of text: answer once the first line is complete (or the shape
        is), send finished lines as partial results, and halt the generation once nothing
        more is wanted (the answer is out and no cache entry waits, or the entry holds
        more lines than any answer shows)."""
        req, s, gen = run.req, run.req.settings, run.generation
        stopped = gen.reason == "stop"  # cut before a template stop token
        run.raw += piece
        shown = run.prompt.at_cursor(run.raw)  # without the text token healing writes again
        if req.entry is not None:
            req.entry.raw = shown
        if run.answer is not None:
            if stopped or shown.count("\n") > s.max_lines:
                gen.halt()  # the cache holds enough past the answer
            return
        early = req.on_answer is not None  # answer at the first line
        done = stopped or postprocess.should_stop(shown, run.shape)
        if done or (early and s.first_line and _first_line(shown, run.shape)):
            finish = "stop" if stopped else "complete"
            run.answer = self._answer(req, shown, run.shape, finish, done)
        elif early and time.monotonic() > run.deadline:
            run.answer = self._answer(req, shown, run.shape, "time", False)
        elif req.on_lines is not None and shown.count("\n") > run.lines_seen:
            run.lines_seen = shown.count("\n")
            req.on_lines(postprocess.finish(shown, run.shape))
        if run.answer is not None and req.entry is None:
            gen.halt()  # nothing goes on past the answer

    def _postprocess(self, run: _Run, stats: Stats | None) -> CompletionResult:
        """The answer once the generation has ended (the one given at the first line, or
        the whole text post-processed), with what the model wrote; the cache entry learns
        how the generation ended."""
        req, completion = run.req, run.generation.completion
        end = run.end
        if req.entry is not None:
            req.entry.finish_reason = end or "length"
        answer = run.answer
        if answer is None:
            answer = self._answer(req, run.prompt.at_cursor(run.raw), run.shape, end, True)
        answer.raw_text = run.raw
        answer.token_ids = list(completion.token_ids) if completion is not None else []
        answer.template, answer.stats = run.prompt.template, stats
        return answer

    def _record(self, answer: CompletionResult) -> CompletionResult:
        """Count the answer's stats in the metrics. :returns: the answer."""
        if answer.stats is not None:
            self.metrics.record(answer.stats, text=answer.text)
        return answer

    # -- parts of the steps ---------------------------------------------------------------

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
        """The drafting index's corpus, refreshed (before the prompt, which reads its
        tokens), when workspace drafting is on."""
        if req.workspace is not None and req.settings.workspace_drafting:
            req.workspace.refresh()
            return req.workspace.corpus
        return None

    def _head(self, req: CompletionRequest, doc: Document, budget: prompting.Budget) -> Any:
        """The start of another document as context: the drafting index's tokens of it,
        else its text."""
        if req.workspace is not None:
            return req.workspace.head_tokens(doc, budget.context_tokens)
        return doc.head(budget.context_tokens * prompting.CHARS_PER_TOKEN)

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


@dataclass
class _Run:
    """One completion while it generates: what the model wrote, and the answer once given."""

    req: CompletionRequest
    prompt: prompting.Prompt
    shape: postprocess.Shape
    #: the time budget's end (``time.monotonic()``); it bounds the answer, not the cache
    deadline: float
    generation: ServedGeneration = field(init=False)
    raw: str = ""
    answer: CompletionResult | None = None
    lines_seen: int = 0

    def over_budget(self, text: str) -> str:
        """Checked before every target step: ``"time"`` once the budget is spent while
        nothing has answered (a completion that has answered goes on for the cache)."""
        return "time" if self.answer is None and time.monotonic() > self.deadline else ""

    @property
    def end(self) -> str:
        """How the generation ended: this side's reason (stop, time), else the engine's."""
        c = self.generation.completion
        return self.generation.reason or (c.stats.finish_reason if c is not None else "")

    def stats(self, reused: int, prefill_s: float) -> Stats | None:
        """The generation's stats, the prefill done before it counted as its own."""
        c = self.generation.completion
        if c is None:
            return None
        stats = c.stats
        stats.reused_tokens, stats.prefill_s = reused, prefill_s
        stats.total_s += prefill_s
        if stats.new_tokens:
            stats.ttft_s += prefill_s
        return stats


def _first_line(raw: str, shape: postprocess.Shape) -> bool:
    """Whether ``raw`` holds a finished line that shows as a non-empty completion."""
    cut = raw.rfind("\n")
    return cut >= 0 and bool(postprocess.finish(raw[: cut + 1], shape).strip())
