from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specd.forward.tiny import CharTokenizer
from specd.textstream import TextStream


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
