"""The compiled decode step computes what the eager lean forward computes: every pass, on
every path (the CUDA graphs' static arithmetic run uncaptured on CPU, inductor on CPU), and
the engine's greedy output stays token-identical to plain decoding."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from specd import Engine, SamplingParams
from specd.forward.compiled import CompiledStep
from specd.forward.step import BUCKETS
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

VOCAB = 40


def targets(
    backend: str, layers: int = 2, dtype: torch.dtype = torch.float64, device: str = "cpu"
) -> tuple[Target, Target]:
    """The same tiny model served eager and with a compiled step."""
    model = tiny_model(VOCAB, num_layers=layers, seed=5, logit_scale=8.0, dtype=dtype)
    model = model.to(device)
    eager = Target(model, CharTokenizer(VOCAB))
    compiled = Target(model, CharTokenizer(VOCAB))
    step = compiled.compile("on", backend=backend)
    assert step is not None and step.ready, step and step.reason
    return eager, compiled


def replay_session(
    eager: Target, compiled: Target, seed: int, steps: int = 12, tol: float = 1e-9
) -> int:
    """Drive both targets through the same passes (chains and trees of 1 to 16 tokens,
    then keeping a random path as the engine does) and compare every pass's logits and
    hidden states. :returns: how many passes the compiled step ran."""
    rnd = random.Random(seed)
    prompt = [rnd.randrange(VOCAB) for _ in range(rnd.randrange(3, 30))]
    caches = []
    for target in (eager, compiled):
        cache = target.new_cache(capacity=rnd.choice([8, 64]))  # small: buffers must grow
        target.prefill(cache, prompt)
        caches.append(cache)
    ran = 0
    for _ in range(steps):
        n = rnd.randrange(1, 17)
        fed = [rnd.randrange(VOCAB) for _ in range(n)]
        parents = [-1] + [rnd.randrange(-1, i) for i in range(1, n)] if rnd.random() < 0.5 else None
        base = caches[0].length
        want = eager.forward(caches[0], fed, parents, hidden=True)
        before = compiled.compiled.state if compiled.compiled else None
        got = compiled.forward(caches[1], fed, parents, hidden=True)
        ran += before == "ready"
        torch.testing.assert_close(got.logits, want.logits, rtol=tol, atol=tol)
        torch.testing.assert_close(got.hidden, want.hidden, rtol=tol, atol=tol)
        assert got.logits.argmax(-1).tolist() == want.logits.argmax(-1).tolist()
        assert caches[1].length == caches[0].length == base + n
        # keep a root-to-leaf path, as the engine's commit does
        node = rnd.randrange(n)
        path = [node]
        while (parents[path[-1]] if parents else path[-1] - 1) >= 0:
            path.append(parents[path[-1]] if parents else path[-1] - 1)
        keep = [base + i for i in sorted(path)]
        for cache in caches:
            cache.keep(base, keep)
    return ran


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_static_step_equals_the_eager_step(seed):
    """The CUDA path's arithmetic on CPU: the whole buffer attended with a mask, tokens padded
    to a bucket, inputs copied into fixed tensors, one graph per buffer and bucket. Guards
    against a mask that hides part of the cached prefix, keys written at the wrong offset,
    and a graph replayed over a buffer the cache has outgrown."""
    eager, compiled = targets("static")
    assert replay_session(eager, compiled, seed) == 12
    assert {b for _, b in compiled.compiled.chosen._graphs} <= set(BUCKETS)


def test_greedy_output_is_identical_to_plain_decoding():
    eager, compiled = targets("static")
    params = SamplingParams(max_tokens=40)
    prompt = "abcabcabd abcab"
    plain = Engine(eager, drafter="none").generate(prompt, params)
    for drafter in ("none", "ngram"):
        out = Engine(compiled, drafter=drafter).generate(prompt, params)
        assert out.token_ids == plain.token_ids, drafter


@pytest.mark.compile
def test_inductor_step_equals_the_eager_step():
    """On a CPU torch.compile's one graph (dynamic shapes, the one-token step written as
    reductions) serves every cache length without recompiling (a recompile while serving is
    refused and turns the step off), passes of several tokens run eager beside it, every
    pass computes what the eager step computes, to float32 rounding (fused kernels sum in
    another order), and the engine's greedy output stays token-identical to plain
    decoding."""
    eager, compiled = targets("inductor", layers=2, dtype=torch.float32)
    step = compiled.compiled
    assert step.compile_s is not None and step.max_tokens == 1
    assert replay_session(eager, compiled, seed=7, steps=8, tol=1e-5) == 8
    caches = [t.new_cache(capacity=8) for t in (eager, compiled)]
    for target, cache in zip((eager, compiled), caches, strict=True):
        target.prefill(cache, [3, 1, 4, 1, 5])
    served = step.served
    for i in range(12):  # past the buffer's capacity: it grows, the graph still serves
        fed = [i % VOCAB] if i % 3 else [i % VOCAB, 7, 9]
        want, got = (t.forward(c, fed, hidden=True) for t, c in zip((eager, compiled), caches))
        torch.testing.assert_close(got.logits, want.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.hidden, want.hidden, rtol=1e-5, atol=1e-5)
    assert step.served - served == 8  # the one-token passes, not the three-token ones
    # greedy output through the engine: token-identical to plain eager decoding
    params = SamplingParams(max_tokens=40)
    plain = Engine(eager, drafter="none").generate("abcabcabd abcab", params)
    served = step.served
    for drafter in ("none", "ngram"):
        out = Engine(compiled, drafter=drafter).generate("abcabcabd abcab", params)
        assert out.token_ids == plain.token_ids, drafter
    assert step.served - served >= 39  # plain decoding's steps ran compiled
    assert step.ready, step.reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu_bench.sh)")
def test_cuda_graph_step_equals_the_eager_step():
    """The captured graphs replay what the eager step computes, on every path the static
    test above covers on CPU, and keep greedy output identical through the engine."""
    eager, compiled = targets("cudagraph", dtype=torch.float32, device="cuda")
    assert replay_session(eager, compiled, seed=11, steps=16, tol=1e-4) == 16
    params = SamplingParams(max_tokens=40)
    plain = Engine(eager, drafter="none").generate("abcabcabd abcab", params)
    out = Engine(compiled, drafter="ngram").generate("abcabcabd abcab", params)
    assert out.token_ids == plain.token_ids


def test_a_failed_compile_falls_back_to_eager_with_the_reason_logged(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    model = tiny_model(VOCAB, num_layers=1, seed=2)
    target = Target(model, CharTokenizer(VOCAB))
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        step = target.compile("on", backend="inductor")
    assert step is not None and step.state == "failed"
    assert "no compiler here" in step.reason and "no compiler here" in caplog.text
    cache = target.new_cache()
    target.prefill(cache, [1, 2, 3])
    got = target.forward(cache, [4]).logits[-1]
    with torch.inference_mode():
        want = model(torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_background_compile_serves_eager_until_ready():
    model = tiny_model(VOCAB, num_layers=1, seed=3)
    target = Target(model, CharTokenizer(VOCAB))
    step = target.compile("background", backend="static")
    assert step is not None
    assert step.wait(60) and step.ready


def test_bad_modes_and_backends_are_refused():
    model = tiny_model(VOCAB, num_layers=1, seed=3)
    target = Target(model, CharTokenizer(VOCAB))
    with pytest.raises(ValueError, match="compile mode"):
        target.compile("fast")
    with pytest.raises(ValueError, match="CUDA"):
        CompiledStep(target.fast, backend="cudagraph")
