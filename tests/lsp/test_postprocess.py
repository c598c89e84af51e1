"""Post-processing: shape by context, block ends by indentation, no repetition, trimming."""

from __future__ import annotations

from pathlib import Path

import pytest
from specd.lsp.documents import Document
from specd.lsp.postprocess import finish, shape_for, should_stop


def _shape(text: str, mode: str = "auto", max_lines: int = 8):
    """``text`` with a ``|`` marking the cursor."""
    i = text.index("|")
    doc = Document("u", text[:i] + text[i + 1 :])
    line = text[:i].count("\n")
    col = len(text[:i].rsplit("\n", 1)[-1])
    return shape_for(
        doc.cursor(doc.resolve(line, col), before_chars=10_000, after_chars=10_000),
        mode=mode,
        max_lines=max_lines,
    )


def test_mid_line_is_a_single_line_without_the_text_after_the_cursor():
    shape = _shape("print(|)\n")
    assert shape.mode == "line"
    assert finish("x, y)\nmore()", shape) == "x, y"
    assert finish("a, b)", _shape("f(|, b)")) == "a"
    assert should_stop("x)\n", shape) and not should_stop("x)", shape)


def test_after_an_opener_the_block_ends_at_the_dedent():
    shape = _shape("def f(x):|\n")
    assert shape.mode == "block" and shape.opens_block
    text = "\n    y = x + 1\n    return y\n\ndef g():\n    pass"
    assert finish(text, shape) == "\n    y = x + 1\n    return y"
    assert should_stop(text, shape)
    assert not should_stop("\n    y = x + 1\n    ret", shape)
    assert not should_stop("", shape) and not should_stop("abc", shape)


def test_a_closing_brace_at_the_block_level_is_kept_then_it_stops():
    shape = _shape("int f() {|\n")
    assert finish("\n  return 1;\n}\nint g() {", shape) == "\n  return 1;\n}"


def test_the_line_after_the_cursor_is_not_repeated():
    shape = _shape("def f(x):\n    |\n    return y\n")
    assert finish("y = x * 2\n    return y\n", shape) == "y = x * 2"
    shape = _shape("if x {\n    |\n}\n")
    assert finish("go()\n}\n", shape) == "go()"


def test_blank_line_blocks_end_at_a_new_paragraph_or_an_outer_dedent():
    shape = _shape("x = 1\n|")
    assert finish("y = 2\nz = 3\n\ndef g():\n    pass\n", shape) == "y = 2\nz = 3"
    shape = _shape("def f():\n    a = 1\n    |")
    assert finish("b = 2\n    c = 3\nprint(f())", shape) == "b = 2\n    c = 3"


def test_max_lines_and_trimming():
    shape = _shape("def f():|", max_lines=3)
    assert (
        finish("\n    a = 1   \n    b = 2\n    c = 3\n    d = 4", shape) == "\n    a = 1\n    b = 2"
    )
    assert finish("   \n  \n", _shape("x = |")) == ""


def test_forced_modes():
    assert _shape("x = |", mode="line").mode == "line"
    assert _shape("f(|)", mode="block").mode == "block"


def test_time_budget_drops_an_unfinished_line_in_a_block():
    shape = _shape("def f():|")
    assert finish("\n    a = 1\n    b = fo", shape, finish_reason="time") == "\n    a = 1"
    assert finish("abc", _shape("f(|)"), finish_reason="time") == "abc"


def test_crlf_documents_get_crlf_completions():
    shape = _shape("def f():|\r\n")
    assert finish("\n    return 1", shape) == "\r\n    return 1"


# -- golden files ---------------------------------------------------------------------------
# Each case is a pair under tests/lsp/golden/: NAME.in holds header lines (``source:`` the
# real file the document comes from, ``finish:`` why generation ended, optionally
# ``mode:``), then ``--- document`` and the document with the cursor marked by CURSOR, then
# ``--- model`` and what the model wrote after the cursor. NAME.out is the suggestion the
# editor must show. Both end with one newline that is not part of the text.

GOLDEN = Path(__file__).parent / "golden"
CURSOR = "█"


def _read_case(path: Path) -> tuple[dict[str, str], str, str]:
    text = path.read_text(encoding="utf-8")
    header, rest = text.split("--- document\n", 1)
    document, model = rest.split("\n--- model\n", 1)
    fields = dict(line.split(": ", 1) for line in header.splitlines() if line.strip())
    return fields, document, model.removesuffix("\n")


@pytest.mark.parametrize("case", sorted(GOLDEN.glob("*.in")), ids=lambda p: p.stem)
def test_golden(case: Path):
    fields, document, model = _read_case(case)
    expected = case.with_suffix(".out").read_text(encoding="utf-8").removesuffix("\n")
    i = document.index(CURSOR)
    doc = Document("file:///w/" + fields["source"], document[:i] + document[i + 1 :])
    line = document[:i].count("\n")
    col = len(document[:i].rsplit("\n", 1)[-1])
    cursor = doc.cursor(doc.resolve(line, col), before_chars=12_288, after_chars=2048)
    shape = shape_for(cursor, mode=fields.get("mode", "auto"), path=fields["source"])
    assert finish(model, shape, finish_reason=fields.get("finish", "eos")) == expected


def test_there_are_many_golden_cases():
    """Guards against a glob that silently matches nothing."""
    assert len(list(GOLDEN.glob("*.in"))) >= 40
    assert all(p.with_suffix(".out").exists() for p in GOLDEN.glob("*.in"))
