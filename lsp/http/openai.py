"""OpenAI's ``POST /v1/completions`` and ``GET /v1/models``.

The request and response shapes are OpenAI's; specd's per-request stats ride along under
``"specd"`` (with the token ids, which OpenAI's shape has no place for). A prompt without
a ``suffix`` goes to the engine as it is, exactly as ``specd generate`` sends it; with a
``suffix`` it is wrapped in the model's fill-in-the-middle template.

A prompt that does not fit in the model's context window with the ``max_tokens`` asked for
is refused with OpenAI's ``context_length_exceeded`` error, before it is tokenized when its
length alone shows it (:class:`specd.ContextLimits`). Without ``max_tokens`` the server's
default is cut to the room the prompt leaves, as llama.cpp does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from typing import Any

from aiohttp import web

from specd import Completion, SamplingParams

from ..runner import ServedGeneration
from .schema import BadRequest, CompletionBody, decode
from .service import SERVICE, HttpService, request_params

#: the engine's finish reasons -> OpenAI's
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "time": "length", "complete": "stop"}


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one model this server serves."""
    svc: HttpService = request.app[SERVICE]
    body = {
        "object": "list",
        "data": [
            {"id": svc.model_name, "object": "model", "created": svc.started, "owned_by": "specd"}
        ],
    }
    return svc.json(body)


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    svc: HttpService = request.app[SERVICE]
    body = decode(await svc.body(request), CompletionBody)
    gen = _generation(svc, body)
    client = svc.client_of(request)
    cid = f"cmpl-{uuid.uuid4().hex[:24]}"
    head = {"id": cid, "object": "text_completion", "created": int(time.time())}
    head["model"] = svc.model_name
    if not body.stream:
        text, ids = await svc.collect(gen, client)
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": _finish(gen)}
        return svc.json({**head, "choices": [choice], **_tail(gen)})

    stream = svc.stream(gen, client)
    response: web.StreamResponse | None = None
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for delta in stream:
            if response is None:
                response = await svc.start_sse(request)
            if delta.text:
                choice = {"text": delta.text, "index": 0, "logprobs": None, "finish_reason": None}
                await svc.send_event(response, {**head, "choices": [choice]})
    if response is None:  # nothing was streamed (an empty completion)
        response = await svc.start_sse(request)
    choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": _finish(gen)}
    await svc.send_event(response, {**head, "choices": [choice], **_tail(gen)})
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _generation(svc: HttpService, body: CompletionBody) -> ServedGeneration:
    params = request_params(
        svc.params,
        max_tokens=body.max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        stop=_stops(body.stop) if body.stop is not None else None,
    )
    # what the client asked for must fit whole; at least one token must, for the default
    asked = body.max_tokens or 0
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]  # one text in a list (the schema allows no more)
    if body.suffix is None:
        ids = _prompt_ids(svc, prompt, asked)
        # the ids the engine would make of the text (as `specd generate`), to find the
        # stop tokens of a fill-in-the-middle prompt the client built itself
        return ServedGeneration(
            ids, _fit(svc, params, ids, asked), stop_ids=svc.prompter.stop_ids(ids)
        )
    if not svc.prompter.fim:
        raise BadRequest(
            f"suffix: {svc.model_name} has no fill-in-the-middle tokens; send the prompt alone",
            "suffix",
        )
    if not isinstance(prompt, str):
        raise BadRequest("suffix: needs a text prompt, not token ids", "suffix")
    # the prompt is built within the budgets, as for an editor: cut to fit, not refused
    room = svc.limits.window - (asked or min(params.max_tokens, svc.limits.window // 2))
    built, _ = svc.prompter.build(prompt, body.suffix, room=room)
    return ServedGeneration(built.ids, _fit(svc, params, built.ids, asked), stop_ids=built.stop_ids)


def _prompt_ids(svc: HttpService, prompt: str | list[str | int], asked: int) -> list[int]:
    """The prompt's token ids, refused when they cannot fit with ``asked`` more tokens (or
    one): a text before it is tokenized when its length shows it, ids before each is read."""
    limits = svc.limits
    if isinstance(prompt, str):
        return limits.encode(svc.engine.tokenize, prompt, asked or 1)
    limits.check_tokens(len(prompt), asked or 1)
    ids = [int(t) for t in prompt]
    vocab = svc.engine.target.vocab_size
    if any(not 0 <= t < vocab for t in ids):
        raise BadRequest(f"prompt: token ids must be in [0, {vocab})", "prompt")
    return ids


def _fit(svc: HttpService, params: SamplingParams, ids: list[int], asked: int) -> SamplingParams:
    """``params`` with ``max_tokens`` as asked, refused when it does not fit after ``ids``;
    the server's default is cut to the room left."""
    if asked:
        svc.limits.check_tokens(len(ids), asked)
        return params
    return dataclasses.replace(params, max_tokens=svc.limits.cap(len(ids), params.max_tokens))


def _stops(stop: str | list[str]) -> tuple[str, ...]:
    # the schema holds each to MAX_STOPS non-empty strings of MAX_STOP_CHARS
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _finish(gen: ServedGeneration) -> str | None:
    c: Completion | None = gen.completion
    return FINISH.get(c.stats.finish_reason, "stop") if c is not None else None


def _tail(gen: ServedGeneration) -> dict[str, Any]:
    """``usage`` and specd's ``stats`` for the last message of a response."""
    c = gen.completion
    if c is None:
        return {}
    s = c.stats
    usage = {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.new_tokens,
        "total_tokens": s.prompt_tokens + s.new_tokens,
    }
    return {"usage": usage, "specd": {"token_ids": c.token_ids, "stats": s.as_json()}}
