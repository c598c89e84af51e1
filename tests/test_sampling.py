from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specd import BadInputError, SamplingParams, argmax, warp

logit_vectors = st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=30)


@given(logits=logit_vectors)
def test_greedy_is_one_hot_at_the_first_argmax(logits):
    x = torch.tensor(logits)
    p = warp(x, SamplingParams())
    assert p.sum() == 1 and p.max() == 1
    assert int(p.argmax()) == int(x.argmax())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_is_torchs_first_index_of_the_largest(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 49, generator=g).to(dtype)
    x[1, [3, 17, 40]] = 9.0  # ties: the first one
    x[2, 5], x[2, 30] = float("nan"), float("nan")  # a NaN counts as the largest
    x[3] = float("-inf")  # nothing allowed: index 0
    x[4, 48] = float("inf")
    for rows in (x, x[0], x[:, ::2], x[None]):
        got = argmax(rows)
        assert got.dtype == torch.int64 and torch.equal(got, rows.argmax(dim=-1))
    assert [int(argmax(x[i])) for i in range(6)] == x.argmax(dim=-1).tolist()


@given(logits=logit_vectors, t=st.floats(0.05, 5), k=st.integers(0, 40), top_p=st.floats(0.01, 1.0))
def test_warp_is_a_distribution_respecting_top_k_and_top_p(logits, t, k, top_p):
    x = torch.tensor(logits, dtype=torch.float64)
    p = warp(x, SamplingParams(temperature=t, top_k=k, top_p=top_p))
    assert torch.isclose(p.sum(), torch.tensor(1.0, dtype=p.dtype), atol=1e-5)
    support = int((p > 0).sum())
    if 0 < k < len(logits):
        # ties at the k-th score may keep more than k; the scores are ranked in float32,
        # where logits closer than its resolution (or below its smallest value) tie
        scores = x.float() / t
        kth = torch.topk(scores, k).values[-1]
        assert support <= int((scores >= kth).sum())
    # the kept set under top-p is the smallest prefix reaching top_p (before renormalising)
    base = warp(x, SamplingParams(temperature=t, top_k=k))
    kept_mass = float(base[p > 0].sum())
    assert kept_mass >= top_p - 1e-6 or support == int((base > 0).sum())
    smallest = float(base[p > 0].min())
    assert kept_mass - smallest < top_p + 1e-6 or support == 1


def test_temperature_matches_softmax():
    x = torch.tensor([1.0, 2.0, 3.0])
    p = warp(x, SamplingParams(temperature=0.5))
    torch.testing.assert_close(p, torch.softmax(x / 0.5, -1))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": ("",)}, "stop"),
        # torch's generator takes 64 bits: a larger seed raised out of the first sampled step
        ({"seed": 2**64, "temperature": 0.5}, "seed"),
        ({"seed": -(2**63) - 1, "temperature": 0.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"max_tokens": True}, "max_tokens"),
        ({"top_k": False}, "top_k"),
    ],
)
def test_bad_parameters_name_the_field(kwargs, field):
    with pytest.raises(BadInputError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("seed", [2**64 - 1, -(2**63), 0])
def test_every_seed_a_generator_takes_is_served(seed):
    from specd.sampling import make_generator

    make_generator(SamplingParams(seed=seed, temperature=0.5).seed)
