"""A remote backend: completions from a serving engine over HTTP instead of a local model.

``--backend URL`` puts a :class:`Backend` where the completion pipeline expects an
:class:`specd.Engine`: the prompt is still built here (with the local model's tokenizer and
fill-in-the-middle template), post-processing and the completion cache are unchanged, and
only generation moves to the server. Two kinds of endpoint:

- OpenAI-compatible ``/v1/completions`` (vLLM, SGLang, llama.cpp's server, another
  ``specd serve --http``): the prompt is sent as text, control tokens included, streamed;
- llama.cpp's ``/infill``: the prompt is taken apart again into ``input_prefix``,
  ``input_suffix`` and ``input_extra``, and the server applies its own template.

Cancellation closes the connection; the server sees the disconnect (vLLM, llama.cpp and
specd stop the generation then). What a remote cannot say is degraded, never invented:
without specd's ``"specd"`` extension there are no token ids and no speculation counts
(``target_steps``, ``drafted`` and ``accepted`` stay 0); token counts come from ``usage``
or ``timings`` when the server sends them, latencies are measured here.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from specd import (
    BadInputError,
    Completion,
    Constraint,
    ContextLimits,
    Delta,
    SamplingParams,
    Stats,
    find_stop,
    held_back,
)

from . import prompting
from .backend_prompt import SplitPrompt, split_prompt

log = logging.getLogger(__name__)

#: how often a generation checks its cancel flag while it waits for the server
POLL_S = 0.01

_FINISH = {"stop": "eos", "length": "length", "eos": "eos", "word": "stop", "limit": "length"}
_STATS_FIELDS = {f.name for f in dataclasses.fields(Stats)}


class BackendError(BadInputError):
    """The backend could not be reached, or refused the request."""


class Backend:
    """Generates with a remote server: the pipeline's :class:`~.engines.CompletionEngine`.
    What only a local model has is neutral: no ``prefix_cache``, no warm-up, every token
    cached, no healing, no ``limits`` unless given (the server keeps its own of each).

    :param url: ``http://HOST:PORT/v1`` (or ``.../v1/completions``) for an OpenAI-compatible
        server, ``http://HOST:PORT/infill`` for llama.cpp's.
    :param tokenizer: the local model's tokenizer, which builds prompts (and ``encode``
        its ``tokenize``).
    :param model: the ``model`` field to send (vLLM and SGLang check it); None sends none.
    :param api_key: sent as ``Authorization: Bearer KEY`` when given.
    :param limits: the served model's context window, when known (the local copy's).
    """

    prefix_cache = None  # the server keeps its own

    def __init__(
        self,
        url: str,
        tokenizer: Any,
        tokenize: Callable[[str], list[int]],
        *,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        limits: ContextLimits | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BadInputError(
                f"--backend {url!r}: expected http://HOST:PORT/v1 or http://HOST:PORT/infill"
            )
        self.url = url
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.https = parts.scheme == "https"
        path = parts.path.rstrip("/")
        if path.endswith("/infill"):
            self.kind, self.path = "infill", path
        elif path.endswith("/completions"):
            self.kind, self.path = "openai", path
        else:
            self.kind = "openai"
            self.path = path + ("/completions" if path.endswith("/v1") else "/v1/completions")
        self.tokenizer = tokenizer
        self._tokenize = tokenize
        self.vocab = prompting.Vocabulary(tokenize, tokenizer)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.limits = limits or ContextLimits(window=1 << 40, token_chars=1)

    def tokenize(self, text: str) -> list[int]:
        return self._tokenize(text)

    def heal(self, prompt: Sequence[int]) -> tuple[list[int], Constraint | None]:
        """No token healing: the prompt as it is, and no constraint."""
        return list(prompt), None

    def cached_tokens(self, prompt: Sequence[int]) -> int:
        """Every token but the last (as an engine counts a prompt it holds)."""
        return max(len(prompt) - 1, 0)

    def generate(
        self, prompt: str | Sequence[int], params: SamplingParams | None = None, **kw: Any
    ) -> Completion:
        gen = self.stream(prompt, params, **kw)
        for _ in gen:
            pass
        assert gen.completion is not None
        return gen.completion

    def warm(self, prompt: str | Sequence[int], cancel: Any = None, **_: Any) -> tuple[int, int]:
        """Nothing to prefill here (the server keeps its own cache): (0, 0)."""
        return 0, 0

    def stream(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams | None = None,
        *,
        cancel: Callable[[], bool] | threading.Event | None = None,
        time_budget_s: float | None = None,
        constraint: Any = None,
        **_: Any,  # drafter, corpus...: the server speculates on its own terms
    ) -> RemoteGeneration:
        """Start a generation on the server; iterate for :class:`specd.Delta` objects.

        :param constraint: token healing's cut text (``specd.healing.Constraint``). A
            server cannot be held to it token by token, so the cut text goes back into the
            prompt at the cursor, and the generation starts with it, as a healed one does
            (the caller strips it the same way).
        """
        params = params or SamplingParams()
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if isinstance(cancel, threading.Event):
            cancel = cancel.is_set
        split = split_prompt(ids, self.vocab, self.tokenizer.decode)
        healed = constraint.text if constraint is not None else ""
        if healed:
            ids = ids[: split.cursor] + self.tokenize(healed) + ids[split.cursor :]
            split.prefix += healed
        body = self._body(ids, split, params)
        deadline = None if time_budget_s is None else time.monotonic() + time_budget_s
        return RemoteGeneration(self, body, len(ids), split.stops, cancel, deadline, healed)

    def _body(self, ids: list[int], split: SplitPrompt, params: SamplingParams) -> dict[str, Any]:
        stop = list(params.stop) + [s for s in split.stops if s not in params.stop]
        sampling: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
        if params.top_k:
            sampling["top_k"] = params.top_k
        if params.seed is not None:
            sampling["seed"] = params.seed
        if self.kind == "infill":
            body = {
                "input_prefix": split.prefix,
                "input_suffix": split.suffix,
                "input_extra": [{"filename": n, "text": t} for n, t in split.extra],
                "prompt": "",
                "n_predict": params.max_tokens,
                "cache_prompt": True,
                "stream": True,
                "stop": stop,
                **sampling,
            }
        else:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            body = {
                "prompt": text,
                "max_tokens": params.max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
                "stop": stop,
                **sampling,
            }
        if self.model is not None:
            body["model"] = self.model
        return body

    def connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout_s)

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h


class RemoteGeneration:
    """One streamed request; iterate it for deltas, then read ``completion``.

    A watcher thread closes the connection as soon as ``cancel`` is true or the time
    budget is spent, so a cancellation reaches the server while the read waits for it.
    """

    def __init__(
        self,
        backend: Backend,
        body: dict[str, Any],
        prompt_tokens: int,
        stops: Sequence[str],
        cancel: Callable[[], bool] | None,
        deadline: float | None,
        healed: str = "",
    ) -> None:
        self.backend = backend
        self.body = body
        self.stops = stops
        self.cancel = cancel
        self.deadline = deadline
        self.healed = healed  # written first: the text token healing cut from the prompt
        self.stats = Stats(prompt_tokens=prompt_tokens, drafter="remote")
        self.completion: Completion | None = None
        self._steps = self._run()

    def __iter__(self) -> RemoteGeneration:
        return self

    def __next__(self) -> Delta:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def _run(self) -> Generator[Delta, None, None]:
        t0 = time.perf_counter()
        stats = self.stats
        conn = self.backend.connect()
        why: list[str] = []
        done = threading.Event()
        cancel, deadline = self.cancel, self.deadline

        # Holds only what it needs and is joined below: a thread that outlived the request
        # with the last reference to the engine would free the model while Python exits.
        def watch() -> None:
            while not done.wait(POLL_S):
                if cancel is not None and cancel():
                    why.append("cancelled")
                elif deadline is not None and time.monotonic() > deadline:
                    why.append("time")
                else:
                    continue
                _hang_up(conn)
                return

        watcher = threading.Thread(target=watch, daemon=True, name="specd-backend-watch")
        watcher.start()
        text, finish = "", ""
        ids: list[int] = []
        try:
            try:
                conn.request(
                    "POST", self.backend.path, json.dumps(self.body), self.backend.headers()
                )
                response = conn.getresponse()
                if response.status != 200:
                    raise BackendError(
                        f"--backend {self.backend.url}: HTTP {response.status}: "
                        f"{_message(response.read())}"
                    )
                if self.healed:
                    yield Delta(self.healed, [])
                # text may end in the start of a stop string: held back until it cannot
                received = ""
                for event in _events(response):
                    piece, event_finish = self._read(event)
                    received += piece
                    finish = event_finish or finish
                    ids = self._specd_extension(event) or ids
                    at = find_stop(received, self.stops)
                    cut = received[:at] if at >= 0 else None
                    end = len(received) - held_back(received, self.stops, len(text))
                    release = (cut if cut is not None else received[:end])[len(text) :]
                    if release:
                        if not text:
                            stats.ttft_s = time.perf_counter() - t0
                        text += release
                        yield Delta(release, [])
                    if cut is not None:
                        finish = "stop"
                        _hang_up(conn)
                        break
                else:
                    if received[len(text) :]:  # the stream ended: nothing more can match
                        if not text:
                            stats.ttft_s = time.perf_counter() - t0
                        yield Delta(received[len(text) :], [])
                        text = received
            except (OSError, http.client.HTTPException) as e:
                if not why:
                    raise BackendError(f"--backend {self.backend.url}: {e}") from None
        finally:
            done.set()
            watcher.join()
            conn.close()
        if why:
            finish = why[0]
        stats.finish_reason = finish or "eos"
        stats.total_s = time.perf_counter() - t0
        if not stats.new_tokens:
            stats.new_tokens = len(ids)
        self.completion = Completion(text=self.healed + text, token_ids=ids, stats=stats)

    def _read(self, event: dict[str, Any]) -> tuple[str, str]:
        """The text and finish reason of one event, counting what it reports."""
        stats = self.stats
        if "choices" in event:  # OpenAI
            usage = event.get("usage") or {}
            stats.prompt_tokens = usage.get("prompt_tokens", stats.prompt_tokens)
            stats.new_tokens = usage.get("completion_tokens", stats.new_tokens)
            choice = (event["choices"] or [{}])[0]
            return choice.get("text") or "", _FINISH.get(choice.get("finish_reason") or "", "")
        # llama.cpp
        if event.get("stop"):
            stats.new_tokens = event.get("tokens_predicted", stats.new_tokens)
            stats.prompt_tokens = event.get("tokens_evaluated", stats.prompt_tokens)
            stats.reused_tokens = max(
                stats.prompt_tokens
                - (event.get("timings") or {}).get("prompt_n", stats.prompt_tokens),
                0,
            )
            return event.get("content") or "", _FINISH.get(event.get("stop_type", ""), "eos")
        return event.get("content") or "", ""

    def _specd_extension(self, event: dict[str, Any]) -> list[int]:
        """A specd server's exact stats and token ids, when the event carries them."""
        ext = event.get("specd")
        if not isinstance(ext, dict):
            return []
        remote = ext.get("stats", ext)
        for name, value in remote.items():
            if name in _STATS_FIELDS and name not in (
                "finish_reason",
                "drafter",
                "total_s",
                "ttft_s",
            ):
                setattr(self.stats, name, value)
        return list(ext.get("token_ids") or [])


def _events(response: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to ``[DONE]`` or its end."""
    while line := response.readline():
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise BackendError(
                f"the backend sent an event that is not JSON: {data[:80]!r}"
            ) from None
        if isinstance(event, dict) and "error" in event:
            raise BackendError(f"the backend failed: {_message(data)}")
        if isinstance(event, dict):
            yield event


def _message(raw: bytes) -> str:
    try:
        err = json.loads(raw).get("error")
        return str(err.get("message", err) if isinstance(err, dict) else err)
    except (ValueError, AttributeError):
        return raw[:200].decode(errors="replace")


def _hang_up(conn: http.client.HTTPConnection) -> None:
    """Close the connection under a blocked read: the server sees the client go away."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
