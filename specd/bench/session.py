"""The session workload: typing replayed as an editor sends it.

From each real source file a block of lines is removed; the document is opened without it
and the block is typed back in, one character per change. A line's indentation arrives as
one change, as an editor's auto-indent inserts it after Enter. A completion is asked at
the start of every non-blank line (after its indentation) and at some pauses in the middle
of a line (after a ``(``, ``=``, ``.``, ``,``, space or ``:``). Each request records what the
file really has from the cursor on, so an answer can be scored: does its first line equal
the rest of the real line, and how many of its characters would the user have typed next.

Files are the Python standard library by default, or ``--files``: files, directories and
glob patterns. The choice of files, blocks and pauses is deterministic for a given seed.
"""

from __future__ import annotations

import glob
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInputError
from .workloads import source_files

#: Lines of the block removed and typed back, by default.
DEFAULT_BLOCK_LINES = 6
#: The share of lines that get a request at a pause in the middle of the line.
PAUSE_RATE = 0.5
#: Characters after which a typist pauses mid-line.
PAUSE_AFTER = "(=., :["
#: Files shorter than this have too little context around a block.
MIN_LINES = 60
#: Longest block line kept (longer lines are data tables, not typing).
MAX_LINE_CHARS = 100


@dataclass(frozen=True)
class Ask:
    """A completion request at the cursor after a step.

    :param kind: ``"line"`` (start of a line, after its indentation) or ``"pause"``.
    :param line_rest: what the real line has after the cursor (its end of line excluded).
    :param rest: the real text from the cursor to the end of the block: what the user types.
    """

    kind: str
    line_rest: str
    rest: str


@dataclass(frozen=True)
class Step:
    """One ``didChange``: ``text`` inserted at the cursor, then possibly a request."""

    text: str
    ask: Ask | None = None


@dataclass(frozen=True)
class Script:
    """One file's typing session.

    :param text: the document as it is opened (the block removed).
    :param line: the 0-based line where the block goes (the cursor starts at its column 0).
    """

    name: str
    path: Path
    text: str
    line: int
    steps: tuple[Step, ...]

    @property
    def asks(self) -> int:
        return sum(s.ask is not None for s in self.steps)


def expand_files(patterns: list[str] | None) -> list[Path]:
    """``--files`` -> Python files, sorted: files as given, directories searched (tests
    skipped), glob patterns expanded. None or empty: the standard library.

    :raises BadInputError: a pattern that matches nothing, or no file at all.
    """
    if not patterns:
        return source_files(None)
    found: set[Path] = set()
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            found.update(source_files(path))
        elif path.is_file():
            found.add(path)
        else:
            matches = [Path(p) for p in glob.glob(str(path), recursive=True)]
            files = [p for p in matches if p.is_file()]
            for d in (p for p in matches if p.is_dir()):
                files += source_files(d)
            if not files:
                raise BadInputError(f"--files {pattern}: no such file, directory or match")
            found.update(files)
    return sorted(found)


def build(
    files: list[Path], *, limit: int, seed: int = 0, block_lines: int = DEFAULT_BLOCK_LINES
) -> list[Script]:
    """Up to ``limit`` scripts, one per file, from ``files`` in a seeded order.

    :raises BadInputError: bad sizes, or no file had a usable block.
    """
    if limit < 1:
        raise BadInputError(f"--limit must be >= 1, got {limit}")
    if block_lines < 1:
        raise BadInputError(f"--session-lines must be >= 1, got {block_lines}")
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    scripts: list[Script] = []
    for path in order:
        if len(scripts) >= limit:
            break
        script = _script(path, rng, block_lines)
        if script is not None:
            scripts.append(script)
    if not scripts:
        raise BadInputError(
            f"the session workload found no file with {MIN_LINES}+ lines and a block of "
            f"{block_lines} typable lines among {len(files)} file(s)"
        )
    return scripts


def _script(path: Path, rng: random.Random, n: int) -> Script | None:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "\r" in text or "\t" in text:
        return None  # the typing below assumes "\n" ends lines and spaces indent
    lines = text.splitlines(keepends=True)
    if len(lines) < MIN_LINES or not lines[-1].endswith("\n"):
        return None
    starts = [
        i for i in range(len(lines) * 2 // 5, len(lines) * 9 // 10 - n) if _typable(lines, i, n)
    ]
    if not starts:
        return None
    start = rng.choice(starts)
    block = lines[start : start + n]
    steps = _steps("".join(block), rng)
    opened = "".join(lines[:start] + lines[start + n :])
    return Script(f"{path.name}:{start + 1}", path, opened, start, tuple(steps))


def _typable(lines: list[str], i: int, n: int) -> bool:
    """A block that starts on a code line and holds mostly code of ordinary width."""
    block = lines[i : i + n]
    first = block[0].strip()
    if not first or first.startswith(("#", '"', "'", "@")):
        return False
    code = [ln for ln in block if ln.strip() and not ln.strip().startswith("#")]
    return len(code) * 2 > n and all(len(ln) <= MAX_LINE_CHARS for ln in block)


def _steps(block: str, rng: random.Random) -> list[Step]:
    """The changes that type ``block`` at the start of a line, with the requests."""
    steps: list[Step] = []
    done = 0  # characters of the block typed so far
    for line in block.splitlines(keepends=True):
        body = line.rstrip("\n")
        content = body.lstrip(" ")
        indent = body[: len(body) - len(content)]
        done += len(indent)
        line_ask = Ask("line", content, block[done:]) if content else None
        if indent or line_ask is not None:
            steps.append(Step(indent, line_ask))
        pauses = [
            i
            for i in range(2, len(content) - 2)
            if content[i - 1] in PAUSE_AFTER and content[i] != " "
        ]
        pause = rng.choice(pauses) if pauses and rng.random() < PAUSE_RATE else None
        for i, ch in enumerate(content, start=1):
            ask = None
            if i == pause:
                ask = Ask("pause", content[i:], block[done + i :])
            steps.append(Step(ch, ask))
        done += len(content)
        if line.endswith("\n"):
            steps.append(Step("\n"))
            done += 1
    return steps
