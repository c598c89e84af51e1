"""After any sequence of appends, rollbacks and tree-path compactions, logits from the cache
equal a full recompute and the cache holds exactly the committed tokens."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from specd.forward.tiny import tiny_target
from specd.prefix_cache import PrefixCache

VOCAB = 40
TARGET = tiny_target(VOCAB, seed=5, num_layers=2)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)),
        st.tuples(st.just("rollback"), st.integers(0, 8)),
        st.tuples(
            st.just("tree"),
            st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
            st.randoms(use_true_random=False),
        ),
    ),
    min_size=1,
    max_size=12,
)


def full_logits(tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return TARGET.model(torch.tensor([tokens])).logits[0, -1]


@given(first=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10), ops=ops)
def test_cache_matches_full_recompute(first, ops):
    cache = TARGET.new_cache(capacity=4)  # small, so buffers must grow
    committed = list(first)
    TARGET.prefill(cache, committed)
    for op in ops:
        if op[0] == "append":
            TARGET.forward(cache, op[1])
            committed += op[1]
        elif op[0] == "rollback":
            keep = max(1, len(committed) - op[1])
            cache.crop(keep)
            committed = committed[:keep]
        else:
            tokens, rnd = op[1], op[2]
            parents = [-1] + [rnd.randrange(-1, i) for i in range(1, len(tokens))]
            base = cache.length
            TARGET.forward(cache, tokens, parents)
            # keep a random root path of the tree
            node = rnd.randrange(len(tokens))
            path = []
            while node >= 0:
                path.append(node)
                node = parents[node]
            path.reverse()
            cache.keep(base, [base + i for i in path])
            committed += [tokens[i] for i in path]
        assert cache.length == len(committed)
    probe = 7
    got = TARGET.forward(cache, [probe]).logits[-1]
    torch.testing.assert_close(got, full_logits(committed + [probe]), rtol=1e-9, atol=1e-9)


def test_prefix_cache_reuses_the_longest_prefix_and_evicts_lru():
    pc = PrefixCache(lambda: TARGET.new_cache(), max_entries=2, min_reuse=1)
    a, n = pc.acquire([1, 2, 3])
    assert n == 0
    TARGET.prefill(a, [1, 2, 3])
    pc.release(a, [1, 2, 3])
    b, n = pc.acquire([1, 2, 9])
    assert n == 2 and b is a and b.length == 2
    TARGET.prefill(b, [9])
    pc.release(b, [1, 2, 9])
    c, n = pc.acquire([5, 5])
    assert n == 0
    TARGET.prefill(c, [5, 5])
    pc.release(c, [5, 5])
    d, n = pc.acquire([7])
    TARGET.prefill(d, [7])
    pc.release(d, [7])
    assert len(pc) == 2
    assert pc.hits == 1


def test_a_long_entry_is_not_cropped_to_a_shared_header():
    """Guards against a request that shares only a few leading tokens with a warm prompt
    (a template's header) cropping it to them: the warm prompt would be computed again."""
    pc = PrefixCache(lambda: TARGET.new_cache(), max_entries=4, min_reuse=8)
    long = [1, 2] + [3, 4, 5, 6] * 5
    a, _ = pc.acquire(long)
    TARGET.prefill(a, long)
    pc.release(a, long)
    assert pc.cached([1, 2, 7, 7]) == 0
    b, n = pc.acquire([1, 2, 7, 7])
    assert n == 0 and b is not a and a.length == len(long)
    TARGET.prefill(b, [1, 2, 7, 7])
    pc.release(b, [1, 2, 7, 7])
    assert pc.cached(long + [9]) == len(long)  # still warm
    assert pc.cached([1, 2, 7, 7, 8]) == 4  # a short entry serves all it holds
    c, n = pc.acquire(long[:10] + [0])
    assert n == 10 and c is a  # at least min_reuse tokens: reused
    pc.release(c, long[:10])
    assert pc.cached(long[:3]) == 3  # all a request needs


def test_prefix_cache_drops_an_inconsistent_cache():
    pc = PrefixCache(lambda: TARGET.new_cache(), max_entries=2)
    a, _ = pc.acquire([1, 2])
    TARGET.prefill(a, [1, 2])
    pc.release(a, [1, 2, 3])  # claims more than it holds
    assert len(pc) == 0


def test_prefix_cache_byte_cap():
    one = TARGET.new_cache(capacity=64)
    TARGET.prefill(one, [1])
    pc = PrefixCache(
        lambda: TARGET.new_cache(capacity=64), max_entries=10, max_bytes=one.nbytes() * 2
    )
    for i in range(5):
        c, _ = pc.acquire([i + 1])
        TARGET.prefill(c, [i + 1])
        pc.release(c, [i + 1])
    assert len(pc) == 2
    assert pc.nbytes() <= one.nbytes() * 2


def test_prefill_allocates_the_prompt_once():
    """A long prompt is prefilled into buffers allocated once for it, not doubled and copied
    chunk by chunk (the per-chunk cost a one-pass prefill does not pay); the buffers are
    zeros beyond the live positions, which a compiled step attends over masked."""
    from specd.forward.passes import PREFILL_CHUNK

    cache = TARGET.new_cache(capacity=8)
    TARGET.prefill(cache, [1, 2, 3])
    seen: list[int] = []

    def record() -> str:
        seen.append(cache.layer(0)._k.data_ptr())
        return ""

    prompt = [i % VOCAB for i in range(2 * PREFILL_CHUNK + 10)]
    TARGET.prefill(cache, prompt, stop=record)
    assert len(seen) == 3 and len(set(seen)) == 1, "the buffer was reallocated mid-prompt"
    buffers = cache.buffers(cache.length)
    assert buffers is not None
    k, _ = buffers[0]
    assert k.shape[2] >= cache.length and torch.count_nonzero(k[:, :, cache.length :]) == 0


def test_live_keys_and_values_follow_the_length():
    cache = TARGET.new_cache(capacity=4)
    TARGET.prefill(cache, [1, 2, 3, 4, 5, 6])  # grows past its capacity
    layer = cache.layer(0)
    assert layer.keys.shape[2] == layer.values.shape[2] == 6
    full = layer.keys.clone()
    cache.crop(3)
    assert layer.keys.shape[2] == layer.values.shape[2] == 3
    assert torch.equal(layer.keys, full[:, :, :3])
    cache.advance(2)  # two positions a step wrote into the buffers
    assert layer.keys.shape[2] == 5 and torch.equal(layer.keys[:, :, :3], full[:, :, :3])
    cache.keep(1, [2, 4])
    assert layer.keys.shape[2] == 3
    assert torch.equal(layer.keys[:, :, 1], full[:, :, 2])
    layer.reset()
    assert layer.keys.shape[2] == 0
