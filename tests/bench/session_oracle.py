"""A language server that knows the answer: it keeps its copy of each document from the
incremental changes it is sent, and answers an inline completion with what the file on
disk has after the cursor, but only while its copy up to the cursor equals the file's
start. An edit sent to the wrong place makes the copies differ, and the answers empty.

Run as ``python session_oracle.py``; the session benchmark's tests drive it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

from specd.jsonrpc import frame, read_frame

docs: dict[str, list[str]] = {}
SILENT = "--silent" in sys.argv  # answers nothing, ever: a model with nothing to suggest


def offset(lines: list[str], line: int, char: int) -> int:
    return sum(len(ln) for ln in lines[:line]) + char


def answer(msg_id, result) -> None:
    sys.stdout.buffer.write(frame({"jsonrpc": "2.0", "id": msg_id, "result": result}))
    sys.stdout.buffer.flush()


def main() -> None:
    while (msg := read_frame(sys.stdin.buffer)) is not None:
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            answer(msg["id"], {"capabilities": {"inlineCompletionProvider": True}})
        elif method == "textDocument/didOpen":
            doc = params["textDocument"]
            docs[doc["uri"]] = doc["text"].splitlines(keepends=True)
        elif method == "textDocument/didChange":
            uri = params["textDocument"]["uri"]
            text = "".join(docs[uri])
            for change in params["contentChanges"]:
                lines = text.splitlines(keepends=True)
                start = offset(
                    lines, change["range"]["start"]["line"], change["range"]["start"]["character"]
                )
                end = offset(
                    lines, change["range"]["end"]["line"], change["range"]["end"]["character"]
                )
                text = text[:start] + change["text"] + text[end:]
            docs[uri] = text.splitlines(keepends=True)
        elif method == "textDocument/inlineCompletion":
            uri = params["textDocument"]["uri"]
            pos = params["position"]
            here = offset(docs[uri], pos["line"], pos["character"])
            real = Path(unquote(urlparse(uri).path)).read_text(encoding="utf-8")
            typed = "".join(docs[uri])[:here]
            text = real[here:] if real.startswith(typed) and not SILENT else ""
            answer(msg["id"], {"items": [{"insertText": text}] if text else []})
        elif method == "specd/stats":
            answer(msg["id"], None)
        elif method == "shutdown":
            answer(msg["id"], None)
        elif method == "exit":
            return


if __name__ == "__main__":
    main()
