from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from specd import CorpusIndex, NgramIndex


def brute_force(tokens, min_n, max_n, budget):
    """The continuation of the most recent earlier occurrence of the longest suffix n-gram."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        key = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == key:
                return tokens[start + n : start + n + budget]
    return []


@given(
    tokens=st.lists(st.integers(0, 4), max_size=60),
    chunks=st.lists(st.integers(1, 5), max_size=10),
    min_n=st.integers(1, 2),
    extra=st.integers(0, 3),
    budget=st.integers(1, 6),
)
def test_incremental_index_matches_brute_force(tokens, chunks, min_n, extra, budget):
    max_n = min_n + extra
    idx = NgramIndex(min_n=min_n, max_n=max_n)
    pos = 0
    for size in chunks + [len(tokens)]:
        idx.extend(tokens[pos : pos + size])
        pos += size
        seen = tokens[:pos]
        assert idx.lookup_self(budget) == brute_force(seen, min_n, max_n, budget)


def test_truncate_then_extend():
    """After a truncation the newest occurrence wins again: "1" was last followed by 9,
    so [2, 3] (its first occurrence's continuation) is a stale answer."""
    idx = NgramIndex([1, 2, 3, 1, 2, 3], min_n=1, max_n=3)
    idx.truncate(4)
    idx.extend([9])
    assert idx.tokens == [1, 2, 3, 1, 9]
    assert idx.lookup([1], 2) == [9]
    assert idx.lookup([3], 2) == [1, 9]
    assert idx.lookup([3, 1, 9], 2) == []


def test_corpus_prefers_the_longest_match():
    corpus = CorpusIndex(min_n=1, max_n=3)
    corpus.set_document("a", [1, 2, 3, 4])
    corpus.set_document("b", [7, 2, 3, 5, 6])
    assert corpus.lookup([9, 2, 3], 2) == [5, 6]  # both match "2 3"; b is more recent
    assert corpus.lookup([1, 2, 3], 2) == [4]  # "1 2 3" only in a
    corpus.remove("a")
    assert corpus.lookup([1, 2, 3], 2) == [5, 6]


def test_continuations_are_distinct_and_most_recent_first():
    idx = NgramIndex([1, 2, 5, 9, 1, 2, 6, 9, 1, 2, 5, 8, 1, 2], min_n=1, max_n=2, keep=3)
    conts = idx.continuations(idx.tokens, 3, limit=3)
    assert conts == [[5, 8, 1], [6, 9, 1]]  # the older "1 2 5" repeats a first token


def test_ngram_tree_drafts_are_identical_to_plain():
    from specd import Engine, SamplingParams
    from specd.forward.tiny import tiny_target

    target = tiny_target(48, seed=2, logit_scale=30.0)
    engine = Engine(target, drafter_options={"ngram": {"branches": 3}}, exit_policy="fixed")
    for prompt in ([1, 2, 5, 9, 1, 2, 6, 9, 1, 2, 7, 3, 1, 2] * 2, [4, 4, 4, 1, 4, 4, 2]):
        tree = engine.generate(prompt, SamplingParams(max_tokens=24))
        plain = engine.generate(prompt, SamplingParams(max_tokens=24), drafter="none")
        assert tree.token_ids == plain.token_ids
