"""A ``tokenizer.json`` tokenizer without transformers.

Importing transformers' tokenizer module takes most of a second; the ``tokenizers`` library
it wraps reads a ``tokenizer.json`` in a tenth of that. :class:`Tokenizer` is that library's
tokenizer plus ``tokenizer_config.json`` (the special tokens), with the part of transformers'
tokenizer interface specd uses: ``tokenizer(text, add_special_tokens=False)["input_ids"]``,
``encode``, ``decode``, ``get_vocab``, ``convert_ids_to_tokens``, the special tokens' ids.
:func:`load` returns one only where it encodes and decodes exactly as transformers would;
elsewhere the caller loads transformers' own tokenizer.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: ``tokenizer_class`` values under which transformers uses ``tokenizer.json`` as it is; a
#: model-specific class may rebuild parts of the pipeline, and is left to transformers.
PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
#: The named special tokens, in transformers' order.
SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
#: Configuration keys that change encoding in ways this class does not repeat.
UNHANDLED = (
    "add_bos_token",
    "add_eos_token",
    "split_special_tokens",
    "add_prefix_space",
    "auto_map",
)


class Tokenizer:
    """``tokenizers.Tokenizer`` with the special tokens of ``tokenizer_config.json``.

    :param backend: the loaded ``tokenizer.json``.
    :param special: the named special tokens' text (``bos_token`` -> ``"<s>"``), each in the
        vocabulary.
    :param extra: further special tokens (``additional_special_tokens``).
    """

    def __init__(self, backend: Any, special: dict[str, str], extra: Sequence[str] = ()) -> None:
        self.backend = backend
        self.backend.no_truncation()
        self.backend.no_padding()
        self.special_tokens_map = dict(special)
        self._extra = list(extra)
        for name in SPECIAL:
            text = special.get(name)
            setattr(self, name, text)
            setattr(self, name + "_id", None if text is None else backend.token_to_id(text))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        ids = [ids] if isinstance(ids, int) else [int(i) for i in ids]
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def get_vocab(self) -> dict[str, int]:
        return self.backend.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        if isinstance(ids, int):
            return self.backend.id_to_token(ids)
        return [self.backend.id_to_token(int(i)) for i in ids]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self.backend.token_to_id(tokens)
        return [self.backend.token_to_id(t) for t in tokens]

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, without added tokens (as transformers counts it)."""
        return self.backend.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self.backend.get_added_tokens_decoder()

    @property
    def all_special_tokens(self) -> list[str]:
        named = [self.special_tokens_map[n] for n in SPECIAL if n in self.special_tokens_map]
        return list(dict.fromkeys([*named, *self._extra]))

    @property
    def all_special_ids(self) -> list[int]:
        return [self.backend.token_to_id(t) for t in self.all_special_tokens]


def load(where: Path) -> Tokenizer | None:
    """The tokenizer of the model in ``where``, or None (with the reason logged) where it would
    not encode and decode as transformers does."""
    file = where / "tokenizer.json"
    config_file = where / "tokenizer_config.json"
    if not file.is_file() or not config_file.is_file():
        return _leave(where, "no tokenizer.json and tokenizer_config.json")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return _leave(where, f"cannot read {config_file.name}: {e}")
    if not isinstance(config, dict) or config.get("tokenizer_class") not in PLAIN_CLASSES:
        return _leave(where, f"tokenizer class {config.get('tokenizer_class')!r}")
    if config.get("clean_up_tokenization_spaces") or any(k in config for k in UNHANDLED):
        return _leave(where, "tokenizer_config.json changes how text is encoded or decoded")
    from tokenizers import Tokenizer as Backend

    backend = Backend.from_file(str(file))
    if backend.post_processor is None:
        return _leave(where, "no post-processor (transformers would build one)")
    special = {n: _text(config[n]) for n in SPECIAL if config.get(n) is not None}
    extra = [_text(t) for t in config.get("additional_special_tokens") or ()]
    more = config.get("extra_special_tokens") or ()
    extra += [_text(t) for t in (more.values() if isinstance(more, dict) else more)]
    absent = [t for t in [*special.values(), *extra] if backend.token_to_id(t) is None]
    if absent:
        return _leave(where, f"special tokens {absent} are not in the vocabulary")
    return Tokenizer(backend, special, extra)


def _text(token: Any) -> str:
    """A special token as ``tokenizer_config.json`` writes it: text, or an object with it."""
    return str(token["content"]) if isinstance(token, dict) else str(token)


def _leave(where: Path, why: str) -> Tokenizer | None:
    """None, for :func:`load` to return, with the reason logged."""
    log.debug("loading %s's tokenizer with transformers: %s", where, why)
    return None
