"""Token healing: generate from a clean token boundary, then write the cut text again.

A prompt that ends inside a token (the spaces of an indent, half an identifier such as
``JSONDecodeEr``) ends at a boundary the tokenizer would not have put there, so the model's
natural next token fits badly: after an indent of four spaces it writes ``" index"`` and the
line gets a fifth. Healing removes the prompt's last token (:func:`heal`) and *constrains*
the first generated tokens to write the removed text again: each constrained token's bytes
are a prefix of the text still to write, or start with all of it. Once the removed text is
written, generation is free.

The constraint is applied in the one place the target's distributions are built
(``Engine.distributions``): disallowed tokens get a logit of minus infinity before warping.
Greedy decoding then takes the argmax among the allowed tokens; sampling draws from the
target's distribution restricted to them and renormalised (with top-k/top-p, the cut is made
among the allowed tokens). The verifier checks every draft against these constrained rows,
so the output is what plain decoding gives under the same constraint, for every drafter.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .draft import Draft
from .errors import BadInputError


@dataclass(frozen=True)
class Constraint:
    """The generated text must start with ``text`` (what :func:`heal` cut from the prompt)."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str) or not self.text:
            raise BadInputError(
                f"a constraint's text must be a non-empty string, got {self.text!r}"
            )

    def strip(self, generated: str) -> str:
        """``generated`` without the constrained start: the text that goes after the cursor.
        Empty while the constrained start is not written in full."""
        return generated[len(self.text) :] if generated.startswith(self.text) else ""


class TokenBytes:
    """The bytes each token id writes; ``b""`` for control tokens, which a constraint never
    allows.

    :param pieces: bytes per token id (index = id).
    """

    #: allowed-token masks kept for the texts asked most recently (49 kB each for a 49k
    #: vocabulary): an indent or a word's start comes back request after request
    MASKS_KEPT = 128

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = list(pieces)
        self._by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.pieces):
            if b:
                self._by_bytes.setdefault(b, []).append(i)
        self._sorted = sorted(self._by_bytes)
        # the ids of the sorted byte strings, end to end: the tokens starting with some text
        # are one slice of it
        flat: list[int] = []
        self._offsets = [0]
        for key in self._sorted:
            flat += self._by_bytes[key]
            self._offsets.append(len(flat))
        self._flat = torch.tensor(flat, dtype=torch.long)
        self._masks: OrderedDict[tuple[bytes, int], torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, token: int) -> bytes:
        return self.pieces[token] if 0 <= token < len(self.pieces) else b""

    def consistent(self, rest: bytes) -> list[int]:
        """Token ids whose bytes are a prefix of ``rest`` or start with all of ``rest``."""
        return sorted(self._prefixes(rest) + self._extending(rest).tolist())

    def mask(self, rest: bytes, vocab_size: int) -> torch.Tensor:
        """``[vocab_size]`` booleans: :meth:`consistent`'s tokens. Shared: do not modify."""
        key = (rest, vocab_size)
        mask = self._masks.get(key)
        if mask is None:
            mask = torch.zeros(vocab_size, dtype=torch.bool)
            mask[self._extending(rest)] = True
            mask[self._prefixes(rest)] = True
            self._masks[key] = mask
            if len(self._masks) > self.MASKS_KEPT:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return mask

    def _prefixes(self, rest: bytes) -> list[int]:
        """Ids of the tokens whose bytes are a proper prefix of ``rest``."""
        return [i for k in range(1, len(rest)) for i in self._by_bytes.get(rest[:k], ())]

    def _extending(self, rest: bytes) -> torch.Tensor:
        """Ids of the tokens whose bytes start with ``rest`` (``rest`` itself included): in
        sorted order they sit together, from ``rest`` up to the first string past them."""
        lo = bisect.bisect_left(self._sorted, rest)
        past = rest.rstrip(b"\xff")  # the least string after all that start with rest
        hi = (
            bisect.bisect_left(self._sorted, past[:-1] + bytes([past[-1] + 1]))
            if past
            else len(self._sorted)
        )
        return self._flat[self._offsets[lo] : self._offsets[max(hi, lo)]]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, vocab_size: int) -> TokenBytes:
        """Read a tokenizer's vocabulary: byte-level BPE (GPT-2 style), SentencePiece pieces
        (``▁`` for a space, ``<0x0A>`` byte tokens), or else each token decoded alone."""
        special = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or [])}
        eos = getattr(tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            special.add(eos)
        # added tokens (``<file_sep>``, chat markers) are control tokens, not text
        special |= {int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {})}
        n = min(vocab_size, _tokenizer_size(tokenizer, vocab_size))
        convert = getattr(tokenizer, "convert_ids_to_tokens", None)
        names = list(convert(list(range(n)))) if callable(convert) else None
        pieces: list[bytes]
        if names is not None and _is_byte_level(names, special):
            # each character stands for one byte: map it to the code point of that byte
            unbyte = str.maketrans({c: chr(b) for b, c in _byte_chars().items()})
            pieces = [
                b"" if i in special or not s else s.translate(unbyte).encode("latin-1")
                for i, s in enumerate(names)
            ]
        elif names is not None and any(isinstance(s, str) and s.startswith("▁") for s in names):
            pieces = [b"" if i in special else _sentencepiece(s) for i, s in enumerate(names)]
        else:
            pieces = [b"" if i in special else _decoded(tokenizer, i) for i in range(n)]
        return cls(pieces + [b""] * (vocab_size - n))


def heal(ids: Sequence[int], table: TokenBytes) -> tuple[list[int], Constraint | None]:
    """Back a prompt up to a clean token boundary.

    :param ids: the prompt's token ids.
    :returns: the prompt without its last token, and the constraint that makes the
        generation write that token's text again; or the prompt unchanged and None when the
        last token is a control token, is not whole UTF-8 text, or is the only one.
    """
    ids = [int(t) for t in ids]
    if len(ids) < 2:
        return ids, None
    try:
        text = table[ids[-1]].decode("utf-8")
    except UnicodeDecodeError:
        return ids, None
    if not text:
        return ids, None
    return ids[:-1], Constraint(text)


class Guide:
    """One request's constraint as it is written: the bytes still to write (``rest``), and
    the tokens allowed at the root and after each draft node.

    :param table: the target's :class:`TokenBytes`.
    :param vocab_size: the width of the target's logits.
    """

    def __init__(self, constraint: Constraint, table: TokenBytes, vocab_size: int) -> None:
        self.table = table
        self.vocab_size = vocab_size
        self.rest: bytes = constraint.text.encode("utf-8")
        self._free: torch.Tensor | None = None  # the row of a node the constraint is past

    @property
    def active(self) -> bool:
        return bool(self.rest)

    def after(self, rest: bytes | None, token: int) -> bytes | None:
        """What is left to write once ``token`` follows; None when ``token`` breaks it."""
        if not rest:
            return rest
        b = self.table[token]
        if b and rest.startswith(b):
            return rest[len(b) :]
        if b and b.startswith(rest):
            return b""
        return None

    def commit(self, tokens: Sequence[int]) -> None:
        """Advance past tokens the request committed (all allowed by the masks)."""
        for t in tokens:
            rest = self.after(self.rest, t)
            self.rest = rest or b""

    def allowed(self, draft: Draft | None, device: torch.device) -> torch.Tensor | None:
        """``[1 + N, V]`` booleans: the tokens allowed at the root and after each draft
        node, or None when nothing is constrained any more. A node the constraint rules out
        gets an unconstrained row: it has probability 0 under its parent's row, so no
        verifier reaches it."""
        if not self.active:
            return None
        rests: list[bytes | None] = [self.rest]
        if draft is not None:
            for tok, parent in zip(draft.tokens, draft.parents, strict=True):
                rests.append(self.after(rests[parent + 1], tok))
        rows = [self._mask(r) for r in rests]
        return torch.stack(rows).to(device)

    def _mask(self, rest: bytes | None) -> torch.Tensor:
        if rest:
            return self.table.mask(rest, self.vocab_size)
        if self._free is None:
            self._free = torch.ones(self.vocab_size, dtype=torch.bool)
        return self._free


# -- reading a vocabulary ------------------------------------------------------------------


def _tokenizer_size(tokenizer: Any, default: int) -> int:
    try:
        return int(len(tokenizer))
    except TypeError:
        return int(getattr(tokenizer, "vocab_size", default))


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character that stands for it
    in a byte-level BPE vocabulary (printable bytes stand for themselves, the others are
    shifted up past 255 in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + shift)
            shift += 1
    return chars


def _is_byte_level(names: Sequence[Any], special: set[int]) -> bool:
    texts = "".join(s for i, s in enumerate(names) if i not in special and isinstance(s, str))
    return "Ġ" in texts and set(texts) <= set(_byte_chars().values())


def _sentencepiece(name: Any) -> bytes:
    if not isinstance(name, str):
        return b""
    if len(name) == 6 and name.startswith("<0x") and name.endswith(">"):
        try:
            return bytes([int(name[3:5], 16)])
        except ValueError:
            return b""
    return name.replace("▁", " ").encode("utf-8")


def _decoded(tokenizer: Any, token: int) -> bytes:
    text = tokenizer.decode([token], skip_special_tokens=False)
    return b"" if "\ufffd" in text else text.encode("utf-8")
