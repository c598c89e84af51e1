"""What one request may ask of the model: the bounds every entry point checks before it
tokenizes or runs anything (``specd generate``, ``POST /v1/completions``, ``POST /infill``).

The model's context window (``max_position_embeddings``) holds the prompt and the tokens
generated after it, so the two must fit in it together. Text is measured before it is
tokenized: a token covers at most as many characters as the longest entry of the
vocabulary, so a text longer than the window times that length cannot fit, and is refused
without the tokenizer reading it (megabytes of text take seconds to tokenize, and a list of
ids in proportion). What passes is tokenized and counted exactly.

The same window bounds the memory a request takes: its KV cache, the activations of its
largest prefill pass and the logits of a verify pass (:func:`request_memory`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import BadInputError
from .sampling import SamplingParams

if TYPE_CHECKING:
    from .forward.target import Target

#: A character takes at most this many bytes in UTF-8: a file this many times larger than
#: the characters a window holds cannot fit, whatever it says.
UTF8_MAX_BYTES = 4
#: The most draft tokens one step may verify (``Engine(max_draft=...)``, ``--max-draft``, a
#: drafter's own ``max_draft``): four times the widest draft trees published (EAGLE-2
#: verifies up to 60 nodes a step, Medusa 64). A verify pass is that many rows wider than a
#: step and the exit policies keep a figure per draft position, so the bound comes first.
MAX_DRAFT = 256


class ContextLengthExceeded(BadInputError):
    """A prompt, with the tokens asked for, does not fit in the model's context window.

    :param param: the input at fault (``prompt``, ``max_tokens``, ``--file``...).
    """

    def __init__(self, message: str, param: str = "prompt") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ContextLimits:
    """The model's context window, and the longest text a token stands for.

    :param window: tokens the model attends over: the prompt and what is generated.
    :param token_chars: characters of the longest token in the vocabulary.
    """

    window: int
    token_chars: int

    @classmethod
    def of(cls, target: Target) -> ContextLimits:
        """The limits of ``target`` (its vocabulary is read once, here)."""
        return cls(target.max_positions, longest_token(target.tokenizer, target.vocab_size))

    @property
    def max_chars(self) -> int:
        """The most characters a prompt that fits can have."""
        return self.window * self.token_chars

    def check_bytes(self, n_bytes: int, what: str) -> None:
        """Refuse a file of ``n_bytes`` that cannot fit, before it is read."""
        if n_bytes > UTF8_MAX_BYTES * self.max_chars:
            raise ContextLengthExceeded(
                f"{what}: {n_bytes:,} bytes cannot fit in the model's context window of "
                f"{self.window:,} tokens (at most {self.max_chars:,} characters); "
                "give a shorter file",
                what,
            )

    def check_chars(
        self, n_chars: int, max_tokens: int = 0, what: str = "prompt", asked: str = "max_tokens"
    ) -> None:
        """Refuse a text of ``n_chars`` characters that cannot fit with ``max_tokens`` more
        tokens, without tokenizing it."""
        self._check_asked(max_tokens, asked)
        if n_chars > (self.window - max_tokens) * self.token_chars:
            raise ContextLengthExceeded(
                f"{what}: {n_chars:,} characters{self._with(max_tokens, asked)} cannot fit in "
                f"the model's context window of {self.window:,} tokens (a token covers at most "
                f"{_plural(self.token_chars, 'character')}); shorten it",
                what,
            )

    def check_tokens(
        self, n_tokens: int, max_tokens: int = 0, what: str = "prompt", asked: str = "max_tokens"
    ) -> None:
        """Refuse a prompt of ``n_tokens`` that does not fit with ``max_tokens`` more."""
        self._check_asked(max_tokens, asked)
        if n_tokens + max_tokens <= self.window:
            return
        if n_tokens + 1 > self.window:  # not even one token could follow it
            raise ContextLengthExceeded(
                f"{what}: {n_tokens:,} tokens leave no room in the model's context window of "
                f"{self.window:,} tokens; shorten it",
                what,
            )
        raise ContextLengthExceeded(
            f"{what}: {n_tokens:,} tokens{self._with(max_tokens, asked)} are more than the "
            f"model's context window of {self.window:,} tokens; shorten it or "
            f"lower {asked}",
            what,
        )

    def _check_asked(self, max_tokens: int, asked: str) -> None:
        if max_tokens >= self.window:
            raise ContextLengthExceeded(
                f"{asked}: {max_tokens:,} leaves no room for a prompt in the model's context "
                f"window of {self.window:,} tokens; ask for fewer",
                asked,
            )

    @staticmethod
    def _with(max_tokens: int, asked: str) -> str:
        # one token is what any request needs room for: not worth naming
        return f" with {asked} {max_tokens:,}" if max_tokens > 1 else ""

    def encode(
        self,
        tokenize: Callable[[str], list[int]],
        text: str,
        max_tokens: int = 0,
        what: str = "prompt",
        asked: str = "max_tokens",
    ) -> list[int]:
        """``text``'s token ids, refused before tokenizing when it is too long to fit with
        ``max_tokens`` more, and after when its ids are."""
        self.check_chars(len(text), max_tokens, what, asked)
        ids = tokenize(text)
        self.check_tokens(len(ids), max_tokens, what, asked)
        return ids

    def prompt_ids(
        self,
        prompt: str | Sequence[int],
        tokenize: Callable[[str], list[int]],
        vocab_size: int,
        bos: int | None,
    ) -> list[int]:
        """A request's prompt as token ids: refused when not one token would fit after it (a
        text before it is tokenized when its length shows it), ``bos`` for an empty one, and
        every id checked against the vocabulary."""
        if isinstance(prompt, str):
            ids = self.encode(tokenize, prompt, 1)
        else:
            self.check_tokens(len(prompt), 1)
            ids = [int(t) for t in prompt]
        if not ids:
            if bos is None:
                raise BadInputError("the prompt is empty and the model has no BOS to start from")
            ids = [int(bos)]
        if bad := [t for t in ids if not 0 <= t < vocab_size]:
            raise BadInputError(f"prompt token ids out of range [0, {vocab_size}): {bad[:5]}")
        return ids

    def fit(self, n_tokens: int, params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens`` cut to the room a prompt of ``n_tokens`` leaves."""
        if n_tokens + params.max_tokens <= self.window:
            return params
        return dataclasses.replace(params, max_tokens=self.cap(n_tokens, params.max_tokens))

    def cap(self, n_tokens: int, max_tokens: int, what: str = "prompt") -> int:
        """``max_tokens`` cut to the room a prompt of ``n_tokens`` leaves: for a number the
        client did not ask for (the server's default; ``/infill``, as llama.cpp does).

        :raises ContextLengthExceeded: when not one token would fit after the prompt.
        """
        self.check_tokens(n_tokens, 1, what)
        return min(max_tokens, self.window - n_tokens)


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def longest_token(tokenizer: Any, vocab_size: int) -> int:
    """Characters of the longest token: of its vocabulary entry, which is at least as long
    as the text it stands for (a byte-level entry has one character per byte, a byte
    fallback ``<0x0A>`` six for one); control tokens such as ``<|endoftext|>`` count too,
    since they are matched in text. A tokenizer without a vocabulary is asked to decode
    each id."""
    try:
        entries: Any = tokenizer.get_vocab()
    except (AttributeError, TypeError, NotImplementedError):
        entries = (tokenizer.decode([i]) for i in range(vocab_size))
    return max((len(entry) for entry in entries), default=1) or 1


@dataclass(frozen=True)
class RequestMemory:
    """Bytes a request over ``tokens`` positions may take, at most."""

    tokens: int
    kv_cache: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.kv_cache + self.activations + self.logits


def request_memory(target: Target, tokens: int, verify_rows: int) -> RequestMemory:
    """The most memory a request over ``tokens`` positions (its prompt and its
    completion) takes beyond the weights, from the model's shape
    (:meth:`specd.Engine.request_memory` gives ``verify_rows`` for its engine).

    - KV cache: keys and values per layer and position, in the cache's dtype
      (``target.kv_dtype``); the buffers grow by doubling from the prompt's length and a
      prefill chunk, so up to twice that.
    - Activations of the largest pass: a prefill's first pass over up to
      :data:`~specd.forward.passes.FIRST_CHUNK` tokens, or a later chunk of
      :data:`~specd.forward.passes.PREFILL_CHUNK` over all the keys: its hidden states and MLP,
      its additive mask (one row per query head of a group) and the attention scores,
      were they computed whole in float32; over a cache narrower than the model's dtype, one
      layer's keys and values converted for the pass too.
    - Logits of a verify pass over ``verify_rows`` tokens (the prompt tokens a first step
      feeds, the pending token, the draft), in the model's dtype and warped to float32.
    """
    from .forward.passes import FIRST_CHUNK, PREFILL_CHUNK

    cfg = target.config.get_text_config(decoder=True)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    hidden = int(cfg.hidden_size)
    head_dim = int(getattr(cfg, "head_dim", None) or hidden // heads)
    inner = int(getattr(cfg, "intermediate_size", None) or 4 * hidden)
    item = target.dtype.itemsize
    kv_item = getattr(target, "kv_dtype", target.dtype).itemsize

    kv = 2 * target.num_layers * kv_heads * head_dim * kv_item * 2 * (tokens + PREFILL_CHUNK)

    def one_pass(rows: int, keys: int) -> int:
        states = rows * (4 * hidden + 3 * inner) * item
        mask = rows * keys * item * (heads // kv_heads)
        scores = heads * rows * keys * 4
        converted = 2 * kv_heads * head_dim * item * keys if kv_item < item else 0
        return states + mask + scores + converted

    first = min(tokens, FIRST_CHUNK)
    activations = max(one_pass(first, first), one_pass(min(tokens, PREFILL_CHUNK), tokens))
    logits = verify_rows * target.vocab_size * (item + 4)
    return RequestMemory(tokens, kv, activations, logits)
