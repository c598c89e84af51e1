"""Workloads: deterministic, offline, and shaped as documented."""

from __future__ import annotations

import pytest

from specd.bench import workloads
from specd.errors import BadInputError

FUNC = '''
def scale(values, factor):
    """Multiply every value."""
    out = []
    for v in values:
        out.append(v * factor)
    if factor == 0:
        return [0 for _ in values]
    total = sum(out) * factor
    return out + [total * factor]
'''


@pytest.fixture
def source(tmp_path):
    for i in range(4):
        body = "".join(f"value_{i}_{j} = {j} * {i} + 1\n" for j in range(60)) + FUNC
        (tmp_path / f"mod{i}.py").write_text(body * 2)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_skip.py").write_text("x = 1\n" * 2000)
    return tmp_path


def test_editor_cuts_at_line_boundaries(tiny, source):
    ps = workloads.build("editor", tiny, limit=3, source=source, context_tokens=200)
    assert len(ps) == 3
    for p in ps:
        assert not p.name.startswith("tests")
        assert 150 <= len(p.ids) <= 200
        assert p.max_tokens == workloads.DEFAULT_MAX_TOKENS["editor"]
        file_text = (source / p.name.split(":")[0]).read_text()
        line = int(p.name.split(":")[1])
        lines = file_text.splitlines(keepends=True)
        assert file_text.count(p.text) >= 1 and p.text.endswith("\n")
        assert "".join(lines[: line - 1]).endswith(p.text)  # ends where the cursor line starts
    again = workloads.build("editor", tiny, limit=3, source=source, context_tokens=200)
    assert [p.ids for p in again] == [p.ids for p in ps]


def test_edit_prompts_hold_the_code(tiny, source):
    ps = workloads.build("edit", tiny, limit=2, source=source, context_tokens=4096)
    assert ps
    for p in ps:
        assert "def scale(values, factor):" in p.text
        assert (
            "`factor` is renamed to `factor_renamed`" in p.text or "`values` is renamed" in p.text
        )


def test_humaneval_is_read_offline(tiny):
    ps = workloads.build("humaneval", tiny, limit=2, max_tokens=5)
    assert [p.name for p in ps] == ["HumanEval/0", "HumanEval/1"]
    assert all(p.max_tokens == 5 and p.ids for p in ps)


def test_random_repeats_nothing(tiny):
    ps = workloads.build("random", tiny, limit=2, context_tokens=64, seed=3)
    for p in ps:
        assert len(p.ids) == 64 == len(set(p.ids)) and p.text is None
    assert ps[0].ids != ps[1].ids


def test_bad_input(tiny, tmp_path):
    with pytest.raises(BadInputError, match="unknown workload"):
        workloads.build("nosuch", tiny, limit=1)
    with pytest.raises(BadInputError, match="not a directory"):
        workloads.build("editor", tiny, limit=1, source=tmp_path / "missing")
    with pytest.raises(BadInputError, match="no usable prompt"):
        workloads.build("editor", tiny, limit=1, source=tmp_path)


@pytest.mark.parametrize(
    ("name", "sizes", "said"),
    [
        ("editor", {"max_tokens": 10**8}, "--context-tokens 1,024 and --max-tokens 100,000,000"),
        ("random", {"context_tokens": 10**8}, "--context-tokens 100,000,000 and --max-tokens 64"),
        ("humaneval", {"max_tokens": 10**8}, "a prompt and --max-tokens 100,000,000"),
    ],
)
def test_sizes_beyond_the_window_are_refused_before_any_prompt_is_built(tiny, name, sizes, said):
    """Guards against a bench that took ``--max-tokens 99999999`` and ran on, and one that
    answered ``--context-tokens 99999999`` with "found no usable prompt"."""
    with pytest.raises(BadInputError, match="do not fit in the model's context window") as e:
        workloads.build(name, tiny, limit=1, **sizes)
    assert said in str(e.value)
