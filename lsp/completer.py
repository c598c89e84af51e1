"""The completion pipeline: prompt -> engine.stream -> post-process.

The language server and ``specd complete`` both run exactly this. It runs on one thread
at a time (the server's generation worker, or the CLI's main thread) and reads only the
immutable :class:`CompletionRequest` it is given, never live documents.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specd import Engine, SamplingParams, Stats

from . import postprocess, prompting
from .config import Settings
from .documents import Cursor, Document, Position
from .metrics import Metrics
from .workspace import WorkspaceIndex

log = logging.getLogger(__name__)

#: Text after the cursor copied out whatever the suffix budget: post-processing reads it
#: so that a completion does not repeat what follows the cursor.
MIN_AFTER_CHARS = 400


def cursor_at(doc: Document, pos: Position, settings: Settings) -> Cursor:
    """The text around ``pos`` that a completion with these settings may use."""
    return doc.cursor(
        pos,
        before_chars=settings.prefix_tokens * prompting.CHARS_PER_TOKEN,
        after_chars=max(settings.suffix_tokens * prompting.CHARS_PER_TOKEN, MIN_AFTER_CHARS),
    )


@dataclass
class CompletionRequest:
    """Everything one completion needs, copied out of the session on the event loop.

    :param others: other open documents, most relevant first (read-only snapshots are
        taken by the worker; their lines are never changed in place).
    :param on_lines: called on the worker thread with the post-processed text each time
        it gains a finished line (for partial results).
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
        self, engine: Engine, params: SamplingParams | None = None, metrics: Metrics | None = None
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
        """Run one completion to its end, its cancellation, or its time budget."""
        s = req.settings
        if req.cancel.is_set():
            return CompletionResult("", finish_reason="cancelled")
        corpus = None
        if req.workspace is not None and s.workspace_drafting:
            req.workspace.refresh()
            corpus = req.workspace.corpus
        prompt = self.build_prompt(req)
        shape = postprocess.shape_for(req.cursor, mode=s.mode, max_lines=s.max_lines, path=req.path)
        params = self.params
        if s.max_tokens is not None:
            params = dataclasses.replace(params, max_tokens=s.max_tokens)

        # Stopping early goes through the engine's cancel check (not gen.close()), so the
        # generation still ends normally and reports its stats.
        halt = threading.Event()
        gen = self.engine.stream(
            prompt.ids,
            params,
            cancel=lambda: halt.is_set() or req.cancel.is_set(),
            time_budget_s=s.time_budget_ms / 1000,
            corpus=corpus,
            constraint=prompt.constraint,
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
            if stopped or postprocess.should_stop(shown, shape):
                finish = "stop" if stopped else "complete"
                halt.set()
            elif req.on_lines is not None and shown.count("\n") > lines_seen:
                lines_seen = shown.count("\n")
                req.on_lines(postprocess.finish(shown, shape))
        completion = gen.completion
        stats = completion.stats if completion is not None else None
        finish = finish or (stats.finish_reason if stats is not None else "")
        if req.cancel.is_set() and finish in ("", "cancelled"):
            finish = "cancelled"
        shown = prompt.at_cursor(raw)
        text = (
            "" if finish == "cancelled" else postprocess.finish(shown, shape, finish_reason=finish)
        )
        ids = completion.token_ids if completion is not None else []
        if stats is not None and finish != "cancelled":
            self.metrics.record(stats, text=text)
        return CompletionResult(text, raw, list(ids), finish, prompt.template, stats)

    def build_prompt(self, req: CompletionRequest) -> prompting.Prompt:
        s = req.settings
        budget = prompting.Budget(s.prefix_tokens, s.suffix_tokens, s.context_tokens)
        others: list[prompting.ContextDocument] = []
        if s.context_tokens:
            for doc in req.others:
                if len(others) >= 8:
                    break
                if req.workspace is not None:
                    ids = req.workspace.head_tokens(doc, s.context_tokens)
                else:
                    head = doc.head(s.context_tokens * prompting.CHARS_PER_TOKEN)
                    ids = self.vocab.encode(head)[: s.context_tokens]
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
