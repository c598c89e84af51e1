"""Fill-in-the-middle prompts for HTTP requests, built by the language server's
:class:`~specd.lsp.prompter.Prompter`, so ``/infill`` and ``/v1/completions`` with a
``suffix`` see the same template, budgets and context layout as an editor talking LSP.
What is HTTP's own: the prompt is cut to the room the context window leaves, and its text
arrives as two strings, not a document and a cursor."""

from __future__ import annotations

from collections.abc import Sequence

from specd import ContextLengthExceeded

from .. import prompting
from ..config import Settings
from ..documents import Cursor
from ..engines import CompletionEngine
from ..prompter import PrefixSize, Prompter

#: Tokens a prompt takes besides its budgets: the template's markers, BOS, the current
#: file's header.
TEMPLATE_TOKENS = 16
#: The fewest tokens of text a prompt cut to the room left is built with.
MIN_PROMPT_TOKENS = prompting.CUT_STEP


class HttpPrompter:
    """Builds prompts for the server's settings, within the room a request leaves.

    :param prefix_size: what ``prefix-tokens = "auto"`` stands for (the service's).
    """

    def __init__(
        self, engine: CompletionEngine, settings: Settings, prefix_size: PrefixSize | None = None
    ) -> None:
        self.settings = settings
        self.prompter = Prompter(engine, prefix_size)
        self.vocab = self.prompter.vocab
        self.template = self.prompter.template(settings.fim)

    @property
    def fim(self) -> bool:
        """Whether the model has fill-in-the-middle tokens (else prompts are prefix-only)."""
        return self.template is not None

    def budget(self, room: int | None = None) -> prompting.Budget:
        """The settings' budgets, cut to ``room`` tokens the way llama.cpp's server cuts an
        ``/infill`` prompt: the text after the cursor to a quarter of the room, the text
        before it to the rest, and other files to what is left.

        :raises ContextLengthExceeded: when the room is too small for a prompt.
        """
        full = self.prompter.budget(self.settings)
        if room is None:
            return full
        text = room - TEMPLATE_TOKENS
        if text < MIN_PROMPT_TOKENS:
            raise ContextLengthExceeded(
                f"max_tokens: leaves {max(room, 0):,} tokens of the model's context window "
                f"for the prompt, and it needs {MIN_PROMPT_TOKENS + TEMPLATE_TOKENS}; ask for "
                "fewer tokens",
                "max_tokens",
            )
        suffix = min(full.suffix_tokens, text // 4)
        prefix = min(full.prefix_tokens, text - suffix)
        return prompting.Budget(prefix, suffix, min(full.context_tokens, text - suffix - prefix))

    def build(
        self,
        before: str,
        after: str,
        *,
        path: str = "",
        extra: Sequence[tuple[str, str]] = (),
        heal: bool = False,
        room: int | None = None,
    ) -> tuple[prompting.Prompt, bool]:
        """The prompt for completing between ``before`` and ``after``. Text is cut to the
        budgets before it is tokenized, so no input is tokenized whole.

        :param extra: (path, text) of other files, most relevant first; those past the
            budget for other files are dropped unread.
        :param heal: heal the end of ``before`` as the ``token-healing`` setting says (the
            answer must then go through ``prompt.at_cursor``). A prompt ending mid-token
            (an indent's spaces, half a name) is backed up to a token boundary and the cut
            text written again first (llama.vim's ``prompt`` is the cursor line, often
            just its indent).
        :param room: tokens the prompt may take (the context window less the tokens to
            generate); None: the settings' budgets as they are.
        :returns: the prompt, and whether ``before`` was cut to fit the budget.
        """
        budget = self.budget(room)
        window = budget.prefix_tokens * prompting.CHARS_PER_TOKEN
        near = before[-window:]
        far = after[: max(budget.suffix_tokens, 1) * prompting.CHARS_PER_TOKEN]
        line_before = near.rsplit("\n", 1)[-1]
        cursor = Cursor(
            before=near,
            after=far,
            line_before=line_before,
            line_after=far.split("\n", 1)[0],
            line=before.count("\n"),
            column=len(line_before),
            before_truncated=len(before) > window,
        )
        prompt = self.prompter.build(
            self.settings,
            cursor,
            path=path,
            others=self.prompter.context(extra, budget.context_tokens),
            budget=budget,
            heal=heal,
        )
        truncated = cursor.before_truncated or prompt.prefix_tokens >= budget.prefix_tokens
        return prompt, truncated

    def stop_ids(self, ids: Sequence[int]) -> frozenset[int]:
        """The template's stop tokens when ``ids`` already is a fill-in-the-middle prompt
        (a client that builds its own, such as ``--backend``), else none."""
        t = self.template
        marker = self.vocab.special(t.prefix) if t is not None else None
        if t is None or marker is None or marker not in ids:
            return frozenset()
        return frozenset(i for i in (self.vocab.special(x) for x in t.stop) if i is not None)
