"""llama.cpp's ``POST /infill``, in the shape llama.vim and llama.vscode send and read.

What those clients rely on, and what specd does about it:

- ``input_prefix`` + ``prompt`` is the text before the cursor (llama.vim sends the lines
  above and the start of the cursor's line apart), ``input_suffix`` the text after it, and
  ``input_extra`` (``{text, filename, time}``) other files; the prompt is built by the same
  module as the language server's, so the template, the context layout and token healing
  (the ``token-healing`` setting: a prompt ending mid-token, such as an indent, is backed
  up to a token boundary and the cut text is generated again, then not returned) are the
  same.
- ``n_predict: 0`` only warms the cache: the prompt is computed into the prefix cache
  (one target step) and the answer has empty ``content``.
- ``t_max_predict_ms`` ends generation only once a newline has been produced, as in
  llama.cpp, so a slow first line is still returned whole rather than cut to nothing.
- ``n_indent``: a new line indented less than that ends the completion, without the line.
- The body is compact JSON (``"content":"``, no space: llama.vim looks for exactly that),
  and ``response_fields`` picks fields, nested ones flattened (``"timings/prompt_n"``).
- The prompt fits in the model's context window, as in llama.cpp: its budgets (the text
  before and after the cursor, other files) are cut to leave room for ``n_predict`` (for
  at most half the window), the start of the prefix going first as the editor's own
  budgets cut it and ``input_extra`` chunks past the budget dropped unread; ``n_predict``
  is then capped at the room the prompt leaves. ``truncated`` tells when the prefix was
  cut. Every text is cut to what the window could hold before it is tokenized.
- ``seed: -1`` means a random seed, as in llama.cpp.
- ``samplers``, ``id_slot``, ``cache_prompt`` and ``t_max_prompt_ms`` are accepted and
  ignored: sampling is temperature, top-k, top-p (greedy unless a temperature is sent or
  the server was started with one), the prefix cache is always on, and prompts are never
  cut short by time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..prompting import Prompt
from ..runner import ServedGeneration
from .schema import InfillBody, decode
from .service import SERVICE, HttpService, request_params

#: the engine's finish reasons -> llama.cpp's ``stop_type``
STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit", "time": "limit", "indent": "limit"}


async def infill(request: web.Request) -> web.StreamResponse:
    """``POST /infill``."""
    svc: HttpService = request.app[SERVICE]
    body = decode(await svc.body(request), InfillBody)
    gen, prompt, truncated = _generation(svc, body)
    client = svc.client_of(request)
    warm = body.n_predict == 0
    if not body.stream:
        text, _ = await svc.collect(gen, client)
        text = "" if warm else cut_indent(prompt.at_cursor(text), body.n_indent)
        return _reply(svc, _result(svc, gen, text, truncated, warm), body.response_fields)

    # The response starts with the first event, so a full queue can still answer 503.
    response: web.StreamResponse | None = None
    held = sent = ""
    stream = svc.stream(gen, client)
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        async for delta in stream:
            held += delta.text
            shown = prompt.at_cursor(held)  # without the text token healing writes again
            if warm or "\n" not in shown:
                continue
            # a line is final once it has ended: only then can n_indent no longer cut it
            ready = cut_indent(shown[: shown.rindex("\n")], body.n_indent)[len(sent) :]
            if ready:
                sent += ready
                response = response or await svc.start_sse(request)
                await svc.send_event(response, {"content": ready, "stop": False, "id_slot": 0})
    final = "" if warm else cut_indent(prompt.at_cursor(held), body.n_indent)
    last = _result(svc, gen, final, truncated, warm)
    last["content"] = final[len(sent) :]
    response = response or await svc.start_sse(request)
    await svc.send_event(response, _fields(last, body.response_fields))
    await response.write_eof()
    return response


def _generation(svc: HttpService, body: InfillBody) -> tuple[ServedGeneration, Prompt, bool]:
    base, limits = svc.params, svc.limits
    if body.n_predict == 0:
        max_tokens = 1
    elif body.n_predict > 0:
        max_tokens = body.n_predict
    else:
        max_tokens = base.max_tokens
    # no text is tokenized longer than the window could hold (the prompter cuts it further)
    n = limits.max_chars
    before = (body.input_prefix[-n:] + body.prompt[-n:])[-n:]
    extra = [(c.filename, c.text[:n]) for c in body.input_extra]
    room = limits.window - min(max_tokens, limits.window // 2)
    prompt, truncated = svc.prompter.build(
        before, body.input_suffix[:n], extra=extra, heal=True, room=room
    )
    truncated = truncated or len(body.input_prefix) + len(body.prompt) > n
    params = request_params(
        base,
        max_tokens=limits.cap(len(prompt.ids), max_tokens),
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        seed=None if body.seed == -1 else body.seed,
        stop=body.stop or None,  # an empty list keeps the server's
    )
    if body.seed == -1:  # llama.cpp's "a random seed"
        params = dataclasses.replace(params, seed=None)
    rule = None if body.n_predict == 0 else _stop_rule(body.t_max_predict_ms, body.n_indent)
    stop = None
    if rule is not None:

        def stop(text: str) -> str:  # judged on what the client gets: not the healed text
            return rule(prompt.at_cursor(text))

    gen = ServedGeneration(
        prompt.ids, params, stop_ids=prompt.stop_ids, should_stop=stop, constraint=prompt.constraint
    )
    return gen, prompt, truncated


def _stop_rule(t_max_predict_ms: int, n_indent: int) -> Callable[[str], str] | None:
    """llama.cpp's two early stops, checked before each target step."""
    if not t_max_predict_ms and not n_indent:
        return None
    started: list[float] = []

    def should_stop(text: str) -> str:
        now = time.monotonic()
        if not started:
            started.append(now)  # the first check comes right after the prompt is computed
        if n_indent and cut_indent(text, n_indent) != text:
            return "indent"
        if t_max_predict_ms and "\n" in text and now - started[0] > t_max_predict_ms / 1000:
            return "time"
        return ""

    return should_stop


def cut_indent(text: str, n_indent: int) -> str:
    """``text`` up to the first line after the first that starts (has a non-blank
    character) with less than ``n_indent`` columns of indentation: such a line leaves the
    block being completed."""
    if n_indent <= 0:
        return text
    lines = text.split("\n")
    for i in range(1, len(lines)):
        body = lines[i].lstrip(" \t")
        if body and len(lines[i]) - len(body) < n_indent:
            return "\n".join(lines[:i])
    return text


def _result(
    svc: HttpService, gen: ServedGeneration, content: str, truncated: bool, warm: bool
) -> dict[str, Any]:
    """llama.cpp's final /infill object (``warm``: a context-only request)."""
    c = gen.completion
    if c is None:  # the generation raised before it began; the handler has answered
        return {"content": content, "stop": True}
    s = c.stats
    prompt_n = s.prompt_tokens - s.reused_tokens
    prompt_ms = 1000 * s.prefill_s
    predicted_ms = 1000 * max(s.total_s - s.prefill_s, 0.0)
    predicted_n = 0 if warm else s.new_tokens
    return {
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": svc.model_name,
        "tokens_predicted": predicted_n,
        "tokens_evaluated": s.prompt_tokens,
        "has_new_line": "\n" in content,
        "truncated": truncated,
        "stop_type": STOP_TYPE.get(s.finish_reason, "none"),
        "stopping_word": "",
        "tokens_cached": s.prompt_tokens + s.new_tokens,
        "timings": {
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000 * predicted_n / predicted_ms if predicted_ms else 0.0,
        },
        "specd": s.as_json(),
    }


def _fields(result: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    """``response_fields``: only the fields asked for, a nested one under its path."""
    if fields is None:
        return result
    out: dict[str, Any] = {}
    for path in fields:
        value: Any = result
        for part in path.split("/"):
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            out[path] = value
    return out


def _reply(svc: HttpService, result: dict[str, Any], fields: list[str] | None) -> web.Response:
    return svc.json(_fields(result, fields))
