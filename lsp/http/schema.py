"""The request bodies ``specd serve --http`` accepts, as msgspec Structs.

Unknown fields are ignored, not refused: OpenAI clients and llama.vim send fields specd
has no use for (``user``, ``id_slot``, ``samplers``...). A known field with a bad value is
refused with a 400 that names it, and so is a value specd cannot honour (``n: 2``,
``echo: true``) rather than being silently ignored.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar

import msgspec

#: Stop strings per request, and characters per stop string: each one is looked for in
#: the text after every step, and text that might start one is held back.
MAX_STOPS, MAX_STOP_CHARS = 16, 1024
#: ``input_extra`` chunks per request (llama.vim and llama.vscode send up to 16 by default).
MAX_EXTRA_CHUNKS = 256
#: ``response_fields`` entries per request.
MAX_FIELDS = 64
#: Characters of a file name (Linux's PATH_MAX).
MAX_PATH_CHARS = 4096

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=65536)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
#: what a random generator can be seeded with (64 bits)
Seed = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Stop = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Stops = Annotated[list[Stop], msgspec.Meta(max_length=MAX_STOPS)]


class BadRequest(Exception):
    """A request that cannot be served; ``param`` names the field at fault, ``status`` is
    the HTTP status it is answered with."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class CompletionBody(msgspec.Struct, kw_only=True):
    """OpenAI's ``POST /v1/completions``. ``None`` means the server's default (its
    ``--max-tokens``, ``--temperature``...)."""

    prompt: str | list[str | int]  # text, [text], or token ids
    model: str | None = None
    suffix: str | None = None
    max_tokens: Tokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: NonNegative | None = None
    stop: Stop | Stops | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1)] = 1
    best_of: Annotated[int, msgspec.Meta(ge=1)] | None = None
    echo: bool = False
    logprobs: int | None = None
    # change what the model writes; only their neutral values are served
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.n != 1 or (self.best_of or 1) != 1:
            raise BadRequest("n and best_of: specd returns one choice per request", "n")
        if self.echo:
            raise BadRequest("echo: not supported", "echo")
        if self.logprobs is not None:
            raise BadRequest("logprobs: not supported", "logprobs")
        _neutral(self, PENALTIES)
        if self.prompt == []:
            raise BadRequest("prompt: an empty list; send a text or a list of token ids", "prompt")
        if isinstance(self.prompt, list):
            texts = sum(isinstance(p, str) for p in self.prompt)
            if texts and (texts > 1 or len(self.prompt) > 1):
                raise BadRequest(
                    "prompt: one text, or a list of token ids (one prompt per request)", "prompt"
                )


class ExtraChunk(msgspec.Struct):
    """One ``input_extra`` item: text from another file. llama.vim also sends ``time`` (a
    list), which specd does not use."""

    text: str
    filename: Annotated[str, msgspec.Meta(max_length=MAX_PATH_CHARS)] = ""
    time: Any = None


class InfillBody(msgspec.Struct, kw_only=True):
    """llama.cpp's ``POST /infill``, as llama.vim and llama.vscode send it."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: Annotated[list[ExtraChunk], msgspec.Meta(max_length=MAX_EXTRA_CHUNKS)] = []
    prompt: str = ""
    n_predict: Annotated[int, msgspec.Meta(ge=-1, le=65536)] = -1
    n_indent: NonNegative = 0
    t_max_predict_ms: NonNegative = 0
    t_max_prompt_ms: int = -1
    temperature: Temperature | None = None
    top_k: NonNegative | None = None
    top_p: TopP | None = None
    seed: Seed | None = None  # -1: a random seed, as llama.cpp reads it
    stop: Stops = []
    stream: bool = False
    cache_prompt: bool = True
    response_fields: Annotated[list[str], msgspec.Meta(max_length=MAX_FIELDS)] | None = None
    model: str | None = None
    # llama.cpp's samplers that change what the model writes; only their neutral values
    # (llama.cpp's defaults where those are neutral) are served
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: Any = None
    grammar: str | None = None
    json_schema: Any = None

    def __post_init__(self) -> None:
        _neutral(self, INFILL_SAMPLERS)


#: Fields that would change the output, each with the values that leave it as it is: a
#: request that sets another is refused naming the field, not served as if it were unset.
PENALTIES: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0.0),
    "frequency_penalty": (None, 0.0),
    "logit_bias": (None, {}),
}
INFILL_SAMPLERS: dict[str, tuple[Any, ...]] = {
    **PENALTIES,
    "repeat_penalty": (None, 1.0),
    "logit_bias": (None, {}, []),
    "grammar": (None, ""),
    "json_schema": (None, {}),
}


def _neutral(body: Any, fields: dict[str, tuple[Any, ...]]) -> None:
    for name, neutral in fields.items():
        if getattr(body, name) not in neutral:
            allowed = " or ".join("null" if v is None else json.dumps(v) for v in neutral)
            raise BadRequest(f"{name}: not supported; send {allowed}, or leave it out", name)


T = TypeVar("T")

_PATH = re.compile(r" - at `\$\.?([^`]*)`$")


def decode(body: bytes, kind: type[T]) -> T:
    """One request body, or :class:`BadRequest` naming the field at fault."""
    if not body.strip():
        raise BadRequest("the request body is empty; expected a JSON object")
    try:
        return msgspec.json.decode(body, type=kind)
    except BadRequest:
        raise
    except msgspec.ValidationError as e:
        text = str(e)
        m = _PATH.search(text)
        field = m.group(1) if m else None
        if missing := re.search(r"missing required field `([^`]*)`", text):
            field = f"{field}.{missing.group(1)}" if field else missing.group(1)
        where = f" (field {field})" if field else ""
        raise BadRequest(f"{_PATH.sub('', text)}{where}", field) from None
    except msgspec.DecodeError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    except RecursionError:  # msgspec's own depth limit, not Python's stack
        raise BadRequest("the request body is nested too deeply to be read") from None
