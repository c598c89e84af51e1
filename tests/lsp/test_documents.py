"""Document state: incremental edits, position encodings, clamping, windows."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from specd.lsp.documents import (
    UTF8,
    UTF16,
    UTF32,
    Document,
    DocumentStore,
    from_index,
    split_lines,
    to_index,
)


def _ref_offset(text: str, line: int, col_units: int, enc: str) -> int:
    """Reference: code-point offset of an LSP position, clamped, computed on the string."""
    starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    if line >= len(starts):
        return len(text)
    start = starts[line]
    m = re.compile(r"\r\n|\r|\n").search(text, start)
    body = text[start : m.start()] if m else text[start:]
    units = 0
    for i, ch in enumerate(body):
        if enc == UTF16:
            w = 2 if ord(ch) > 0xFFFF else 1
        elif enc == UTF8:
            w = len(ch.encode("utf-8", "surrogatepass"))
        else:
            w = 1
        if units + w > col_units:
            return start + i
        units += w
    return start + len(body)


def test_split_lines_uses_lsp_line_ends_only():
    assert split_lines("a\nb\r\nc\rd\x0be\u2028f") == ["a\n", "b\r\n", "c\r", "d\x0be\u2028f"]
    assert split_lines("") == [""]
    assert split_lines("x\n") == ["x\n", ""]


def test_utf16_positions_count_surrogate_pairs():
    line = "a😀b"  # 😀 is two UTF-16 code units, four UTF-8 bytes
    assert to_index(line, 1, UTF16) == 1
    assert to_index(line, 2, UTF16) == 1  # inside the pair: rounds down
    assert to_index(line, 3, UTF16) == 2
    assert from_index(line, 2, UTF16) == 3
    assert from_index(line, 2, UTF8) == 5
    assert from_index(line, 2, UTF32) == 2
    assert to_index(line, 99, UTF16) == 3


def test_lone_surrogate_is_one_unit():
    doc = Document("u", "x\ud800y\n")
    pos = doc.resolve(0, 2)
    assert pos.column == 2 and not pos.clamped
    doc.apply_change("Z", pos, pos)
    assert doc.text == "x\ud800Zy\n"


def test_positions_past_the_end_are_clamped_and_reported():
    doc = Document("u", "ab\ncd")
    p = doc.resolve(0, 10)
    assert (p.line, p.column, p.clamped) == (0, 2, True)
    p = doc.resolve(7, 3)
    assert (p.line, p.column, p.clamped) == (1, 2, True)
    assert not doc.resolve(1, 2).clamped


def test_incremental_edits_join_and_split_crlf():
    doc = Document("u", "a\r\nx\nb")
    # delete "x" so that "\r" ... stays paired; then delete the "\n" of line 1
    doc.apply_change("", doc.resolve(1, 0), doc.resolve(1, 1))
    assert doc.text == "a\r\n\nb" and doc.lines == ["a\r\n", "\n", "b"]
    doc = Document("u", "a\rx\nb")
    doc.apply_change("", doc.resolve(1, 0), doc.resolve(1, 1))
    assert doc.lines == ["a\r\n", "b"]  # "\r" + "\n" now form one line end


_chars = st.sampled_from(list("ab \t\n\r") + ["😀", "é", "\ud800"])


@settings(max_examples=150, deadline=None)
@given(
    st.text(_chars, max_size=30),
    st.lists(
        st.tuples(
            st.integers(0, 6),
            st.integers(0, 8),
            st.integers(0, 6),
            st.integers(0, 8),
            st.text(_chars, max_size=6),
        ),
        max_size=8,
    ),
    st.sampled_from([UTF16, UTF8, UTF32]),
)
def test_incremental_edits_match_a_plain_string(text, edits, enc):
    doc = Document("u", text)
    ref = text
    for l1, c1, l2, c2, new in edits:
        a, b = _ref_offset(ref, l1, c1, enc), _ref_offset(ref, l2, c2, enc)
        a, b = min(a, b), max(a, b)
        ref = ref[:a] + new + ref[b:]
        doc.apply_change(new, doc.resolve(l1, c1, enc), doc.resolve(l2, c2, enc))
        assert doc.text == ref
        assert doc.lines == split_lines(ref)


def test_full_replacement_and_versions():
    doc = Document("u", "old", version=1)
    doc.apply_change("new\ntext", version=2)
    assert doc.text == "new\ntext" and doc.version == 2


def test_cursor_window_is_cut_at_an_aligned_line():
    text = "".join(f"line {i:03d}\n" for i in range(200))
    doc = Document("u", text)
    pos = doc.resolve(150, 4)
    cur = doc.cursor(pos, before_chars=500, after_chars=30, align_lines=16)
    assert cur.before_truncated
    first = int(cur.before[5:8])
    assert first % 16 == 0 and len(cur.before) <= 500
    assert cur.before.endswith("line") and cur.line_before == "line" and cur.line_after == " 150"
    assert cur.after.startswith(" 150\nline 151") and len(cur.after) <= 30
    # typing on the same line keeps the window's start where it was
    doc.apply_change("x", pos, pos)
    again = doc.cursor(doc.resolve(150, 5), before_chars=500, after_chars=30, align_lines=16)
    assert again.before[:9] == cur.before[:9]


def test_cursor_on_a_huge_single_line():
    doc = Document("u", "x" * 100_000)
    cur = doc.cursor(doc.resolve(0, 60_000), before_chars=1000, after_chars=10)
    assert len(cur.before) == 1000 and cur.before_truncated and cur.after == "x" * 10


def test_store_caps_open_documents():
    store = DocumentStore(max_documents=3)
    for i in range(5):
        store.open(f"u{i}", "t")
    assert len(store) == 3 and "u0" not in store
    assert [d.uri for d in store.others("u4")] == ["u3", "u2"]
    assert store.close("u3") is not None and store.close("u3") is None
