"""Fill-in-the-middle prompts for HTTP requests, built by the language server's prompting
module, so ``/infill`` and ``/v1/completions`` with a ``suffix`` see the same template,
budgets and context layout as an editor talking LSP."""

from __future__ import annotations

from collections.abc import Sequence

from specd import Engine

from .. import prompting
from ..config import Settings, prefix_tokens
from ..documents import Cursor


class Prompter:
    """Builds prompts with the engine's tokenizer and the template the settings choose."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.settings = settings
        self.vocab = prompting.Vocabulary(engine.tokenize, engine.tokenizer)
        self.template = prompting.choose_template(self.vocab, settings.fim)
        # token healing, as for LSP clients: a prompt ending mid-token (an indent's
        # spaces, half a name) is backed up to a token boundary and the cut text written
        # again first (llama.vim's ``prompt`` is the cursor line, often just its indent)
        heal = getattr(engine, "heal", None)
        self.heal = heal if settings.token_healing else None

    @property
    def fim(self) -> bool:
        """Whether the model has fill-in-the-middle tokens (else prompts are prefix-only)."""
        return self.template is not None

    def build(
        self,
        before: str,
        after: str,
        *,
        path: str = "",
        extra: Sequence[tuple[str, str]] = (),
        heal: bool = False,
    ) -> tuple[prompting.Prompt, bool]:
        """The prompt for completing between ``before`` and ``after``.

        :param extra: (path, text) of other files, most relevant first.
        :param heal: heal the end of ``before`` (the answer must then go through
            ``prompt.at_cursor``).
        :returns: the prompt, and whether ``before`` was cut to fit the budget.
        """
        s = self.settings
        window = prefix_tokens(s) * prompting.CHARS_PER_TOKEN
        line_before = before.rsplit("\n", 1)[-1]
        cursor = Cursor(
            before=before[-window:],
            after=after[: max(s.suffix_tokens, 1) * prompting.CHARS_PER_TOKEN],
            line_before=line_before,
            line_after=after.split("\n", 1)[0],
            line=before.count("\n"),
            column=len(line_before),
            before_truncated=len(before) > window,
        )
        others = []
        for name, text in extra:
            if not s.context_tokens:
                break
            head = text[: s.context_tokens * prompting.CHARS_PER_TOKEN]
            ids = self.vocab.encode(head)[: s.context_tokens]
            if ids:
                others.append(prompting.ContextDocument(name or "context", ids))
        budget = prompting.Budget(prefix_tokens(s), s.suffix_tokens, s.context_tokens)
        prompt = prompting.build(
            self.template,
            self.vocab,
            cursor,
            path=path,
            others=others,
            budget=budget,
            heal=self.heal if heal else None,
        )
        truncated = cursor.before_truncated or prompt.prefix_tokens >= prefix_tokens(s)
        return prompt, truncated

    def stop_ids(self, ids: Sequence[int]) -> frozenset[int]:
        """The template's stop tokens when ``ids`` already is a fill-in-the-middle prompt
        (a client that builds its own, such as ``--backend``), else none."""
        t = self.template
        marker = self.vocab.special(t.prefix) if t is not None else None
        if t is None or marker is None or marker not in ids:
            return frozenset()
        return frozenset(i for i in (self.vocab.special(x) for x in t.stop) if i is not None)
