"""Prompts for code completion: fill-in-the-middle templates per model family, a
prefix-only fallback, and context from other open documents within a token budget.

A prompt is built as token ids, not text: control tokens (``<fim_prefix>``...) are added
by id, so the model sees exactly the template it was trained on, and text in the user's
files is always tokenized as text. The pieces are ordered so the ones that change least
come first: other documents, then the current file up to the cursor. Consecutive
keystrokes then share a long prompt prefix, which the engine's prefix cache reuses.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from specd import Constraint

from .documents import Cursor

PREFIX_ONLY = "prefix-only"
#: Characters per token assumed when text is cut before it is tokenized: code tokenizers
#: average well under this, so the cut text holds the tokens a budget asks for.
CHARS_PER_TOKEN = 8
# Cut the start of an over-long prefix in steps of at least this many tokens and of a
# quarter of the budget, so the cut does not move (and send the whole prompt through the
# model again) every few keystrokes: it moves once per step of text typed.
CUT_STEP = 64


@dataclass(frozen=True)
class Template:
    """A fill-in-the-middle format.

    :param order: ``psm`` (prefix, suffix, middle) or ``sp`` (suffix then prefix, no
        middle token: Mistral's format).
    :param file_sep: the token that starts a file in a repository-level prompt, if any.
    :param stop: tokens that end the middle (besides the model's EOS).
    :param bos: whether the prompt starts with the tokenizer's BOS token.
    """

    name: str
    prefix: str
    suffix: str
    middle: str | None
    order: str = "psm"
    file_sep: str | None = None
    stop: tuple[str, ...] = ()
    bos: bool = False

    @property
    def markers(self) -> tuple[str, ...]:
        return tuple(t for t in (self.prefix, self.suffix, self.middle) if t)


TEMPLATES: dict[str, Template] = {
    "starcoder": Template(
        "starcoder",
        "<fim_prefix>",
        "<fim_suffix>",
        "<fim_middle>",
        file_sep="<file_sep>",
        stop=("<|endoftext|>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
    ),
    "qwen": Template(
        "qwen",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        file_sep="<|file_sep|>",
        stop=(
            "<|endoftext|>",
            "<|fim_pad|>",
            "<|file_sep|>",
            "<|repo_name|>",
            "<|im_end|>",
            "<|fim_prefix|>",
        ),
    ),
    "codellama": Template("codellama", "▁<PRE>", "▁<SUF>", "▁<MID>", stop=("▁<EOT>",), bos=True),
    "deepseek": Template(
        "deepseek",
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
        stop=("<|EOT|>", "<｜end▁of▁sentence｜>"),
        bos=True,
    ),
    "codestral": Template(
        "codestral",
        "[PREFIX]",
        "[SUFFIX]",
        None,
        order="sp",
        stop=("[PREFIX]", "[SUFFIX]"),
        bos=True,
    ),
}

# Line comments by file extension, for the file headers of a prefix-only prompt.
_COMMENT = {
    **dict.fromkeys(
        "py pyi sh bash zsh rb pl r toml yaml yml cfg ini mk cmake nim ex exs jl tf dockerfile".split(),
        "#",
    ),
    **dict.fromkeys(
        "c h cc cpp cxx hpp hh cs java js jsx ts tsx mjs go rs swift kt kts scala dart php zig proto groovy v sv".split(),
        "//",
    ),
    **dict.fromkeys("lua sql hs elm ada".split(), "--"),
    **dict.fromkeys("el lisp clj cljs scm rkt".split(), ";;"),
    **dict.fromkeys("tex erl hrl m".split(), "%"),
}


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(text: str) -> str:
    """``text`` with lone UTF-16 surrogates (valid in LSP's JSON, not in UTF-8) replaced
    by U+FFFD, so tokenizers that encode to UTF-8 accept it."""
    return _SURROGATE.sub("\ufffd", text)


class Vocabulary:
    """What prompting needs from a tokenizer: text -> ids, and control-token ids.

    :param encode: text -> token ids, no special tokens added (``Engine.tokenize``).
    :param tokenizer: the tokenizer, for its vocabulary and BOS id (any object works;
        one without ``get_vocab`` has no control tokens).
    """

    def __init__(self, encode: Callable[[str], list[int]], tokenizer: Any) -> None:
        self._encode = encode
        try:
            self._vocab: dict[str, int] = dict(tokenizer.get_vocab())
        except (AttributeError, TypeError, NotImplementedError):
            self._vocab = {}
        bos = getattr(tokenizer, "bos_token_id", None)
        self.bos_id: int | None = int(bos) if isinstance(bos, int) else None

    def encode(self, text: str) -> list[int]:
        return self._encode(scrub(text))

    def special(self, token: str | None) -> int | None:
        return None if token is None else self._vocab.get(token)

    def has(self, *tokens: str) -> bool:
        return all(t in self._vocab for t in tokens)


def choose_template(vocab: Vocabulary, setting: str = "auto") -> Template | None:
    """The FIM template for a model: by name when ``setting`` names one, else the first
    family whose control tokens the tokenizer has. None means prefix-only (the default
    model, SmolLM2, has no FIM tokens)."""
    if setting == "none":
        return None
    if setting != "auto":
        template = TEMPLATES[setting]
        return template if vocab.has(*template.markers) else None
    for template in TEMPLATES.values():
        if vocab.has(*template.markers):
            return template
    return None


@dataclass(frozen=True)
class ContextDocument:
    """Another open document offered as context: its path and its first tokens."""

    path: str
    tokens: Sequence[int]


#: Token healing: prompt ids -> the ids backed up to a token boundary and the constraint
#: that writes the removed text again (``Engine.heal``).
Healer = Callable[[list[int]], tuple[list[int], Constraint | None]]


@dataclass
class Prompt:
    """A prompt as token ids. With token healing, ``constraint`` holds the text cut from
    the end of the prefix: the model writes it again first, and it is not shown."""

    ids: list[int]
    template: str
    stop_ids: frozenset[int] = frozenset()
    context_documents: int = 0
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    constraint: Constraint | None = None

    def at_cursor(self, generated: str) -> str:
        """The generated text that goes after the cursor: without the healed text."""
        return generated if self.constraint is None else self.constraint.strip(generated)


@dataclass(frozen=True)
class Budget:
    prefix_tokens: int = 1536
    suffix_tokens: int = 256
    context_tokens: int = 512

    def fit(self, window: int) -> Budget:
        """This budget within a model's context ``window``, leaving :data:`FIT_ROOM` tokens
        (a quarter of a smaller window) for the template's tokens and the completion: the
        text before the cursor first (leaving the suffix up to a quarter of the rest), then
        the suffix, then other documents. A prompt over the window is refused by the engine,
        so budgets from settings larger than the model (``prefix-tokens = 100000`` on a 4k
        model) would otherwise leave every request unanswered."""
        left = window - min(FIT_ROOM, window // 4)
        if self.prefix_tokens + self.suffix_tokens + self.context_tokens <= left:
            return self
        prefix = min(self.prefix_tokens, left - min(self.suffix_tokens, left // 4))
        suffix = min(self.suffix_tokens, left - prefix)
        return Budget(prefix, suffix, min(self.context_tokens, left - prefix - suffix))


#: Tokens of a model's window a fitted :class:`Budget` leaves for the template's own tokens
#: and the completion (the engine cuts ``max_tokens`` to what is left).
FIT_ROOM = 128


def build(
    template: Template | None,
    vocab: Vocabulary,
    cursor: Cursor,
    *,
    path: str = "",
    others: Sequence[ContextDocument] = (),
    budget: Budget = Budget(),
    heal: Healer | None = None,
) -> Prompt:
    """The prompt for completing at ``cursor``.

    :param template: the FIM template, or None for prefix-only.
    :param path: the current file's path (for file headers), relative to the workspace.
    :param others: other open documents, best first; they fill ``budget.context_tokens``.
    :param heal: token healing (``Engine.heal``): the prefix ends at a clean token boundary
        and the prompt's ``constraint`` writes the rest up to the cursor.
    """
    prefix = _tail(vocab.encode(cursor.before), budget.prefix_tokens)
    constraint = None
    if heal is not None:
        prefix, constraint = heal(prefix)
    prompt = _build(template, vocab, prefix, cursor, path, others, budget)
    prompt.constraint = constraint
    return prompt


def _build(
    template: Template | None,
    vocab: Vocabulary,
    prefix: list[int],
    cursor: Cursor,
    path: str,
    others: Sequence[ContextDocument],
    budget: Budget,
) -> Prompt:
    if template is None:
        return _prefix_only(vocab, prefix, path, others, budget)

    sep = vocab.special(template.file_sep)
    header: list[int] = [vocab.bos_id] if template.bos and vocab.bos_id is not None else []
    context, n_docs = _context(vocab, others, budget.context_tokens, sep=sep)
    if context:
        header += context
    suffix = vocab.encode(cursor.after)[: budget.suffix_tokens] if budget.suffix_tokens else []
    p, s = vocab.special(template.prefix), vocab.special(template.suffix)
    assert p is not None and s is not None  # choose_template checked the markers
    file_head: list[int] = []
    if n_docs and sep is not None:
        file_head = [sep] + vocab.encode(f"{path}\n")
    if template.order == "sp":
        ids = header + file_head + [s] + suffix + [p] + prefix
    else:
        m = vocab.special(template.middle)
        ids = header + file_head + [p] + prefix + [s] + suffix + ([m] if m is not None else [])
    stop = frozenset(i for i in (vocab.special(t) for t in template.stop) if i is not None)
    return Prompt(ids, template.name, stop, n_docs, len(prefix), len(suffix))


def _prefix_only(
    vocab: Vocabulary,
    prefix: list[int],
    path: str,
    others: Sequence[ContextDocument],
    budget: Budget,
) -> Prompt:
    comment = _COMMENT.get(_extension(path))
    if comment is None or not others:
        return Prompt(prefix, PREFIX_ONLY, prefix_tokens=len(prefix))
    context, n_docs = _context(vocab, others, budget.context_tokens, comment=comment)
    if not n_docs:
        return Prompt(prefix, PREFIX_ONLY, prefix_tokens=len(prefix))
    ids = context + vocab.encode(f"{comment} {path}\n") + prefix
    return Prompt(ids, PREFIX_ONLY, context_documents=n_docs, prefix_tokens=len(prefix))


def _context(
    vocab: Vocabulary,
    others: Sequence[ContextDocument],
    limit: int,
    *,
    sep: int | None = None,
    comment: str | None = None,
) -> tuple[list[int], int]:
    """Other documents, each behind a file header, until ``limit`` tokens are used. A
    document that does not fit whole is cut, unless less than a quarter of it would fit."""
    out: list[int] = []
    n = 0
    for doc in others:
        if sep is not None:
            head = [sep] + vocab.encode(f"{doc.path}\n")
        elif comment is not None:
            head = vocab.encode(f"{comment} {doc.path}\n")
        else:
            head = vocab.encode("\n\n")
        room = limit - len(out) - len(head)
        if room <= 0:
            break
        body = list(doc.tokens[:room])
        if len(body) < len(doc.tokens) and len(body) < len(doc.tokens) // 4:
            continue
        out += head + body + vocab.encode("\n" if sep is not None else "\n\n")
        n += 1
        if len(out) >= limit:
            break
    return out[: max(limit, 0)], n


def _tail(ids: list[int], limit: int) -> list[int]:
    """The last ``limit`` ids, cutting the front in steps of :func:`cut_step` tokens."""
    over = len(ids) - limit
    if over <= 0:
        return ids
    step = cut_step(limit)
    return ids[-(-over // step) * step :]


def cut_step(limit: int) -> int:
    """How far the start of a prefix over ``limit`` tokens moves at a time.

    The window of text before the cursor is sized from the file's characters per token so
    that the budget rarely cuts it, but a denser stretch of code (a table, a codec) still
    overflows it; there a cut every 64 tokens typed recomputed a 1,536-token prompt (3 s on
    a 2-core CPU) every two lines. A quarter of the budget: every ~380 tokens typed."""
    return max(CUT_STEP, limit // 4)


def display_path(uri: str, root_uri: str | None = None) -> str:
    """A file URI as a path relative to the workspace root (else its last component)."""
    parsed = urlparse(uri)
    path = unquote(parsed.path) if parsed.scheme else uri
    if root_uri:
        root = unquote(urlparse(root_uri).path).rstrip("/")
        if root and path.startswith(root + "/"):
            return path[len(root) + 1 :]
    return posixpath.basename(path) or path


def _extension(path: str) -> str:
    base = posixpath.basename(path).lower()
    if base == "dockerfile":
        return "dockerfile"
    return base.rsplit(".", 1)[-1] if "." in base else ""
