from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specd.forward.tiny import CharTokenizer
from specd.textstream import TextStream, find_stop, held_back


class ByteTokenizer:
    """Token = one UTF-8 byte, so characters span tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


@given(text=st.text(max_size=40), cuts=st.lists(st.integers(1, 4), max_size=20))
def test_multibyte_characters_are_never_split(text, cuts):
    data = list(text.encode("utf-8"))
    ts = TextStream(ByteTokenizer())
    out, pos = [], 0
    for size in cuts + [len(data)]:
        piece, _ = ts.push(data[pos : pos + size])
        assert "\ufffd" not in piece
        out.append(piece)
        pos += size
    out.append(ts.flush())
    assert "".join(out) == text


@given(
    text=st.text(alphabet="abc d", max_size=40),
    stop=st.text(alphabet="abcd ", min_size=1, max_size=3),
)
def test_stop_strings_cut_and_never_leak(text, stop):
    tok = CharTokenizer(96)
    ts = TextStream(tok, stop=(stop,))
    released = []
    for ch in text:
        piece, kept = ts.push(tok.encode(ch))
        released.append(piece)
        if ts.stopped:
            break
    released.append(ts.flush())
    expected = text[: text.index(stop)] if stop in text else text
    assert "".join(released) == expected
    assert ts.text == expected


@given(
    text=st.text(alphabet="ab<|", max_size=12),
    stops=st.lists(st.text(alphabet="ab<|", min_size=1, max_size=4), min_size=1, max_size=3),
    released=st.integers(0, 12),
)
def test_held_back_is_the_longest_end_that_could_grow_into_a_stop(text, stops, released):
    """The one hold-back rule, shared by the engine's stream and a remote server's text
    (lsp/backend.py): checked against every end of the text."""
    released = min(released, len(text))
    ends = [
        k
        for k in range(1, len(text) - released + 1)
        if any(len(s) > k and s.startswith(text[len(text) - k :]) for s in stops)
    ]
    assert held_back(text, stops, released) == max(ends, default=0)
    at = [i for i in range(len(text)) if any(text.startswith(s, i) for s in stops)]
    assert find_stop(text, stops) == min(at, default=-1)
