"""The completion cache: typing along what the model wrote is answered from it."""

from __future__ import annotations

from specd.lsp.cache import ANCHOR_CHARS, CompletionCache
from specd.lsp.documents import Document
from specd.lsp.postprocess import shape_for

URI = "file:///w/a.py"
HEAD = "import os\n\n\ndef walk(top):\n    "
TAIL = "\n\nprint(walk('.'))\n"
RAW = "for name in os.listdir(top):\n        yield name\n    return None\n"


def _cursor(typed: str, head: str = HEAD, tail: str = TAIL):
    doc = Document(URI, head + typed + tail)
    before = head + typed
    line = before.count("\n")
    column = len(before) - (before.rfind("\n") + 1)
    return doc.cursor(doc.resolve(line, column), before_chars=100_000, after_chars=400)


def _entry(cache: CompletionCache, raw: str = RAW, finish: str = "eos"):
    entry = cache.start(URI, _cursor(""))
    entry.raw, entry.finish_reason = raw, finish
    return entry


def test_typing_along_a_suggestion_is_answered_with_its_rest():
    """Guards against a cache keyed on the exact cursor (every keystroke would miss) or
    that answers with the whole suggestion again instead of what is left of it."""
    cache = CompletionCache()
    _entry(cache)
    typed = "for name in os.listdir(top):\n        "
    cursor = _cursor(typed)
    hit = cache.lookup(URI, cursor)
    assert hit is not None and hit.typed == typed
    assert hit.shown(shape_for(cursor)) == "yield name"


def test_text_that_leaves_the_suggestion_or_another_place_misses():
    """Guards against serving a suggestion the user has already typed away from, one from
    another document, or one whose text after the cursor has changed since."""
    cache = CompletionCache()
    _entry(cache)
    assert cache.lookup(URI, _cursor("for name in sorted(")) is None
    assert cache.lookup("file:///w/b.py", _cursor("for ")) is None
    assert cache.lookup(URI, _cursor("for ", tail="\n\nwalk('/')\n")) is None
    assert cache.lookup(URI, _cursor("for ", head="import sys\n" + HEAD)) is not None  # above: fine


def test_while_the_generation_runs_only_finished_lines_are_shown():
    """Guards against showing a line the model is still writing (it may change, and a
    request that waits for the generation would get half a line)."""
    cache = CompletionCache()
    entry = _entry(cache, raw="for name in os.listdir(top):\n        yie", finish="")
    hit = cache.lookup(URI, _cursor("for name in os.listdir(top):\n        "))
    assert hit is not None and hit.shown(shape_for(_cursor(hit.typed))) == ""
    entry.raw += "ld name\n"
    assert hit.shown(shape_for(_cursor(hit.typed))) == "yield name"


def test_an_interrupted_generation_keeps_only_its_finished_lines():
    """Guards against showing the line a preempted generation was cut in."""
    cache = CompletionCache()
    _entry(cache, raw="for name in os.listdir(top):\n        yie", finish="cancelled")
    cursor = _cursor("for name ")
    hit = cache.lookup(URI, cursor)
    assert hit is not None and hit.shown(shape_for(cursor)) == "in os.listdir(top):"


def test_a_suggestion_typed_through_is_exhausted():
    """Guards against never noticing that the user took all of a suggestion (the next
    completion would not be prefetched)."""
    cache = CompletionCache()
    _entry(cache, raw="for name in os.listdir(top):\n")
    assert not cache.lookup(URI, _cursor("for name")).exhausted
    assert cache.lookup(URI, _cursor("for name in os.listdir(top):\n")).exhausted


def test_the_newest_entry_wins_and_the_cache_is_bounded():
    """Guards against answering from a stale generation when a newer one at the same
    place exists, and against a cache that grows with every request."""
    cache = CompletionCache(capacity=3)
    _entry(cache, raw="for old in x:\n")
    _entry(cache, raw="for name in os.listdir(top):\n")
    hit = cache.lookup(URI, _cursor("for "))
    assert hit is not None and hit.entry.raw.startswith("for name")
    for _ in range(5):
        _entry(cache)
    assert len(cache) == 3
    cache.forget(URI)
    assert len(cache) == 0


def test_the_anchor_is_bounded_so_long_files_match_cheaply():
    """Guards against keying entries on the whole text before the cursor (a copy and a
    comparison of the whole file per request and entry)."""
    cache = CompletionCache()
    long_head = "x = 1\n" * 5000 + HEAD
    entry = cache.start(URI, _cursor("", head=long_head))
    assert len(entry.anchor) == ANCHOR_CHARS
    entry.raw, entry.finish_reason = RAW, "eos"
    assert cache.lookup(URI, _cursor("for na", head=long_head)) is not None
