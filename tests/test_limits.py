"""The bounds of one request (:mod:`specd.limits`): what cannot fit in the model's context
window is refused before it is tokenized, what fits is counted exactly, and the memory a
request may take is known from the model's shape."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specd import (
    ContextLengthExceeded,
    ContextLimits,
    Engine,
    SamplingParams,
)
from specd.limits import longest_token

LIMITS = ContextLimits(window=100, token_chars=4)


def test_text_that_cannot_fit_is_refused_without_tokenizing():
    """Guards against handing megabytes to the tokenizer to find out they do not fit."""
    seen: list[int] = []

    def tokenize(text: str) -> list[int]:
        seen.append(len(text))
        return [0] * len(text)

    with pytest.raises(ContextLengthExceeded) as e:
        LIMITS.encode(tokenize, "x" * 3_000_000)
    assert seen == []
    assert e.value.param == "prompt"
    assert "3,000,000 characters" in str(e.value) and "100 tokens" in str(e.value)


def test_text_that_might_fit_is_tokenized_and_counted():
    """Guards against refusing by length what fits (400 characters of 4-character tokens)
    and against letting through what does not once counted."""
    assert LIMITS.encode(lambda t: [0] * (len(t) // 4), "x" * 400) == [0] * 100
    with pytest.raises(ContextLengthExceeded, match="101 tokens leave no room"):
        LIMITS.encode(lambda t: [0] * 101, "x" * 400)


def test_max_tokens_must_fit_after_the_prompt():
    """Guards against a prompt and a completion that overflow the window between them."""
    LIMITS.check_tokens(90, 10)
    with pytest.raises(ContextLengthExceeded) as e:
        LIMITS.check_tokens(91, 10)
    assert "91 tokens with max_tokens 10" in str(e.value) and "100 tokens" in str(e.value)
    with pytest.raises(ContextLengthExceeded) as e:
        LIMITS.check_chars(1, 100, asked="--max-tokens")
    assert e.value.param == "--max-tokens"


def test_cap_cuts_a_default_to_the_room_left():
    assert LIMITS.cap(90, 64) == 10
    assert LIMITS.cap(10, 64) == 64
    with pytest.raises(ContextLengthExceeded):
        LIMITS.cap(100, 64)


def test_a_file_too_large_to_fit_is_refused_by_its_size():
    LIMITS.check_bytes(4 * 400, "--file f")  # four bytes a character at most
    with pytest.raises(ContextLengthExceeded, match="--file f: 1,601 bytes"):
        LIMITS.check_bytes(4 * 400 + 1, "--file f")


def test_the_longest_token_counts_every_entry_of_the_vocabulary():
    """Guards against a bound shorter than a token: a control token's text is matched in
    prompts, and a byte-level entry has one character per byte."""

    class Vocab:
        def get_vocab(self):
            return {"a": 0, "ĊĠĠĠ": 1, "<|endoftext|>": 2}

    class Decoding:
        def decode(self, ids):
            return "ab" * ids[0]

    assert longest_token(Vocab(), 3) == len("<|endoftext|>")
    assert longest_token(Decoding(), 5) == 8


def test_limits_of_a_target_come_from_its_config_and_vocabulary():
    engine = Engine.load("tiny", drafter="none")
    limits = ContextLimits.of(engine.target)
    assert limits == ContextLimits(window=4096, token_chars=1)


def test_memory_estimate_holds_what_a_request_takes():
    """Guards against an estimate below what the engine allocates: the KV cache a
    generation leaves in the prefix cache (its buffers, grown by doubling) stays within the
    estimate for its tokens, and a longer request is estimated larger."""
    engine = Engine.load("tiny", drafter="none")
    # the prefill reserves the prompt and 256 positions; the 297th token doubles that
    engine.generate([1] * 40, SamplingParams(max_tokens=280))
    assert 0 < engine.prefix_cache.nbytes() <= engine.request_memory(40 + 280).kv_cache
    small, large = engine.request_memory(100), engine.request_memory(4096)
    assert large.kv_cache > small.kv_cache and large.activations > small.activations
    assert large.total == large.kv_cache + large.activations + large.logits


@pytest.mark.slow
def test_generate_refuses_an_oversize_file_by_its_size(tmp_path):
    """Guards against ``specd generate --file`` reading a file no context holds: a sparse
    gigabyte is refused by its size, exit 2, naming the file and the window."""
    big = tmp_path / "big.py"
    with open(big, "wb") as f:
        f.truncate(2**30)
    r = subprocess.run(
        [sys.executable, "-m", "specd.cli", "generate", "--model", "tiny", "--file", str(big)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 2, r.stderr
    assert f"--file {big}: 1,073,741,824 bytes" in r.stderr and "4,096 tokens" in r.stderr
    assert "Traceback" not in r.stderr


def _small_window_engine(window: int) -> Engine:
    from specd.forward.tiny import tiny_target

    engine = Engine(tiny_target(16, seed=0), drafter="none")
    engine.limits = ContextLimits(window=window, token_chars=1)  # one character a token
    return engine


def test_the_engine_refuses_a_prompt_that_cannot_fit_before_tokenizing_it():
    """Guards the Python API and every caller that skips the servers' checks (the language
    server's prompts, a plugin's own requests) against tokenizing and prefilling past the
    window."""
    engine = _small_window_engine(64)

    def tokenize(text: str) -> list[int]:
        raise AssertionError(f"{len(text):,} characters were handed to the tokenizer")

    engine.tokenize = tokenize  # type: ignore[method-assign]
    with pytest.raises(ContextLengthExceeded, match="1,000,000 characters"):
        engine.generate("!" * 1_000_000)
    with pytest.raises(ContextLengthExceeded, match="64 tokens leave no room"):
        engine.generate([1] * 64)
    assert engine.prefix_cache.nbytes() == 0  # nothing was run


def test_the_engine_cuts_max_tokens_to_the_room_left_in_the_window():
    """Guards against decoding past the model's positions when prompt and completion
    together are longer than the window."""
    engine = _small_window_engine(64)
    out = engine.generate([1] * 60, SamplingParams(max_tokens=32))
    assert len(out.token_ids) == 4 and out.stats.finish_reason == "length"
    assert len(engine.generate([1] * 20, SamplingParams(max_tokens=32)).token_ids) == 32


def test_an_engines_limits_are_its_models():
    from specd.forward.tiny import tiny_target

    target = tiny_target(16, seed=0)
    assert Engine(target, drafter="none").limits.window == target.max_positions
