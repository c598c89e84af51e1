"""The training corpus as the target sees it: features and greedy next tokens, cached on disk.

Files are tokenized, joined with the end-of-sequence token between them and cut into
sequences of ``seq_len`` tokens. The target runs once over each sequence; its last hidden
states after the final norm (the features, stored in bfloat16) and its own greedy next token
at every position (the labels) are written in shards. A shard that exists is never computed
again, so an interrupted extraction resumes where it stopped. Whole files are held out for
validation, chosen by a hash of their path so the split does not depend on file order.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specd import BadInputError, Target

#: Sequences per shard file.
SHARD_SEQS = 32


@dataclass
class Corpus:
    """Token sequences of the training and validation files."""

    train: list[list[int]]
    valid: list[list[int]]
    files: int


def find_files(paths: Sequence[str], pattern: str) -> list[Path]:
    """Every file under ``paths`` (files as given, folders searched for ``pattern``), sorted."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(f for f in p.rglob(pattern) if f.is_file())
        else:
            raise BadInputError(f"--data {raw!r}: no such file or directory")
    files = sorted(set(out))
    if not files:
        raise BadInputError(f"--data {' '.join(paths)}: no files match {pattern!r}")
    return files


def is_validation(path: Path, valid_every: int) -> bool:
    """Whether a file is held out: one in ``valid_every``, by a hash of its path."""
    digest = hashlib.sha256(str(path).encode()).digest()
    return int.from_bytes(digest[:4], "little") % valid_every == 0


def build_corpus(
    target: Target,
    files: Sequence[Path],
    *,
    seq_len: int,
    max_tokens: int | None,
    valid_every: int,
) -> Corpus:
    """Tokenize ``files`` into sequences; at most ``max_tokens`` training tokens (files are
    taken in a fixed shuffled order, so a smaller budget is a sample of the whole)."""
    streams: dict[bool, list[int]] = {True: [], False: []}
    valid_budget = None if max_tokens is None else max(seq_len * 4, max_tokens // 20)
    for f in _shuffled(files):
        held = is_validation(f, valid_every)
        limit = valid_budget if held else max_tokens
        if limit is None or len(streams[held]) < limit:
            streams[held].extend(_file_tokens(target, f))
    train = _cut(streams[False], seq_len, max_tokens)
    valid = _cut(streams[True], seq_len, valid_budget)
    if not train or not valid:
        raise BadInputError(
            f"--data holds too little text for sequences of {seq_len} tokens in both the "
            f"training and validation splits (found {len(train)} and {len(valid)})"
        )
    return Corpus(train=train, valid=valid, files=len(files))


def evaluation_sequences(
    target: Target, files: Sequence[Path], *, seq_len: int, max_tokens: int | None
) -> list[list[int]]:
    """Every file held out: sequences of ``seq_len`` tokens, at most ``max_tokens`` in all."""
    stream: list[int] = []
    for f in _shuffled(files):
        if max_tokens is not None and len(stream) >= max_tokens:
            break
        stream.extend(_file_tokens(target, f))
    seqs = _cut(stream, seq_len, max_tokens)
    if not seqs:
        raise BadInputError(f"--data holds too little text for one sequence of {seq_len} tokens")
    return seqs


def _shuffled(files: Sequence[Path]) -> list[Path]:
    """A fixed order that does not follow folders, so a token budget samples them all."""
    return sorted(files, key=lambda f: hashlib.sha256(str(f).encode()).hexdigest())


def _file_tokens(target: Target, path: Path) -> list[int]:
    """A file's tokens and the end-of-sequence token; nothing for an unreadable file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    ids = list(target.tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids + sorted(target.eos_token_ids)[:1]


def _cut(stream: list[int], seq_len: int, limit: int | None) -> list[list[int]]:
    if limit is not None:
        stream = stream[:limit]
    return [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


@torch.inference_mode()
def target_features(target: Target, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence through the target. :returns: features ``[T, H]`` (after the final
    norm) and the target's greedy next token at each position ``[T]``."""
    cache = target.new_cache(capacity=len(tokens))
    out = target.forward(cache, tokens, hidden=True)
    assert out.hidden is not None
    return out.hidden, out.logits.argmax(-1)


def extract(
    target: Target,
    seqs: list[list[int]],
    folder: Path,
    *,
    progress: Callable[[str], None],
) -> list[Path]:
    """Write the shards of ``seqs`` into ``folder`` (skipping shards already there).
    :returns: the shard paths, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    t0 = time.monotonic()
    done_tokens = 0
    total = sum(len(s) for s in seqs)
    for n, start in enumerate(range(0, len(seqs), SHARD_SEQS)):
        part = seqs[start : start + SHARD_SEQS]
        path = folder / f"shard-{n:05d}.safetensors"
        paths.append(path)
        key = _shard_key(part)
        if path.is_file() and _meta(path).get("key") == key:
            done_tokens += sum(len(s) for s in part)
            continue
        feats, labels = zip(*(target_features(target, s) for s in part))
        tensors = {
            "feat": torch.stack(feats).to(torch.bfloat16).cpu(),
            "tokens": torch.tensor(part, dtype=torch.int32),
            "labels": torch.stack(labels).to(torch.int32).cpu(),
        }
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"key": key})
        tmp.replace(path)
        done_tokens += sum(len(s) for s in part)
        rate = done_tokens / max(time.monotonic() - t0, 1e-9)
        progress(f"features {folder.name}: {done_tokens}/{total} tokens ({rate:.0f} tokens/s)")
    return paths


def _shard_key(seqs: Iterable[list[int]]) -> str:
    h = hashlib.sha256()
    for s in seqs:
        h.update(json.dumps(s).encode())
    return h.hexdigest()[:16]


def _meta(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata() or {})


def load_shards(paths: Sequence[Path]) -> dict[str, torch.Tensor]:
    """All shards joined: ``feat [N, T, H]`` bfloat16, ``tokens`` and ``labels`` ``[N, T]``."""
    parts = [load_file(str(p)) for p in paths]
    return {k: torch.cat([p[k] for p in parts]) for k in ("feat", "tokens", "labels")}
