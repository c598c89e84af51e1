"""The step kernel is checked before it serves: ``compile("auto")`` on a CPU runs its first
one- and five-token passes beside the eager ones, and a kernel whose logits or hidden states
differ by more than :data:`specd.forward.step.TOLERANCE` of their scale is refused, logged
with the reason, and every pass runs eager.

The kernel here is a stand-in (its passes are the eager pass's, changed on purpose), so
these tests run on every host: one without a C++ compiler or AVX-512 included.
"""

from __future__ import annotations

import logging

import pytest
import torch

from specd import Engine, SamplingParams
from specd.forward import cpu_kernels, decode_step, step
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

VOCAB = 40
PROMPT = "abcabcabd abcab abcabc"


class FakeKernel:
    """Stands in for :class:`specd.forward.decode_step.DecodeStep`: each pass is the eager pass,
    changed by ``change(tokens, logits, hidden)``; the passes' token counts are recorded."""

    def __init__(self, change) -> None:
        self.change = change
        self.passes: list[int] = []


def _fake_run(step, fast, cache, ids, position_ids, mask=None):
    """:func:`specd.forward.decode_step.run` for a :class:`FakeKernel`: the eager pass writes the
    keys and values, and the caller advances the cache, as after the kernel's pass."""
    past, t = cache.length, ids.shape[1]
    logits, hidden = fast.forward(cache, ids, position_ids, mask, hidden=True)
    cache.crop(past)
    step.passes.append(t)
    return step.change(t, logits.clone(), hidden.clone())


@pytest.fixture
def kernel_with(monkeypatch):
    """Install a :class:`FakeKernel` with the given change as the step kernel of this host."""
    # the eager passes stay PyTorch's own on every host: no attention kernel to build
    monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 10**9)
    monkeypatch.setattr(decode_step, "run", _fake_run)
    monkeypatch.setattr(decode_step, "usable", lambda fast: True)

    def install(change) -> FakeKernel:
        kernel = FakeKernel(change)
        monkeypatch.setattr(decode_step, "for_decoder", lambda fast: kernel)
        return kernel

    return install


def _model():
    """Peaky logits (tens), so a difference of float32 rounding is above 1e-4 in absolute
    terms but far below it relative to their scale."""
    return tiny_model(VOCAB, hidden_size=64, num_layers=2, seed=5, logit_scale=30.0,
                      dtype=torch.float32)  # fmt: skip


def _scale(x: torch.Tensor) -> float:
    return max(1.0, float(x.abs().max()))


def _wrong_logits_one_token(t, logits, hidden):
    if t == 1:
        logits[:, 3] += 0.05 * _scale(logits)
    return logits, hidden


def _wrong_logits_five_tokens(t, logits, hidden):
    if t > 1:  # right on one-token steps: only the verify pass shows it
        logits[-1] = logits[-1].flip(0)
    return logits, hidden


def _wrong_hidden(t, logits, hidden):
    hidden[0, 0] += 0.01 * _scale(hidden)  # the logits are right: EAGLE heads read these
    return logits, hidden


def _float32_rounding(t, logits, hidden):
    # every logit of a row moved alike: the same distributions and the same argmax
    return logits + 0.2 * step.TOLERANCE * _scale(logits), hidden


def _eager_output(model, drafter: str) -> list[int]:
    eager = Target(model, CharTokenizer(VOCAB))
    return Engine(eager, drafter=drafter).generate(PROMPT, SamplingParams(max_tokens=32)).token_ids


@pytest.mark.parametrize(
    "change, what",
    [
        (_wrong_logits_one_token, "logits over 1 tokens"),
        (_wrong_logits_five_tokens, "logits over 5 tokens"),
        (_wrong_hidden, "hidden states over 1 tokens"),
    ],
)
def test_a_kernel_that_disagrees_with_eager_is_refused_and_passes_run_eager(
    kernel_with, caplog, change, what
):
    """Guards against serving a step kernel that computes something else (a miscompiled
    build, a CPU quirk): without the check, or with one that skips the verify pass or the
    hidden states, every step after load would be wrong, silently."""
    kernel = kernel_with(change)
    model = _model()
    target = Target(model, CharTokenizer(VOCAB))
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        step = target.compile("auto")
    assert step is not None and step.backend == "kernel"
    assert step.state == "failed" and not step.ready
    assert what in step.reason and "differ from the eager pass" in step.reason
    assert "running eager (kernel)" in caplog.text and what in caplog.text
    checked = len(kernel.passes)
    assert checked >= 1
    for drafter in ("none", "ngram"):
        out = Engine(target, drafter=drafter).generate(PROMPT, SamplingParams(max_tokens=32))
        assert out.token_ids == _eager_output(model, drafter)
    assert len(kernel.passes) == checked and step.served == 0  # no pass reached the kernel


def test_a_kernel_within_float32_rounding_is_kept_and_serves(kernel_with, caplog):
    """Guards against refusing a correct kernel (a check in absolute terms, or one that
    never passes), which leaves every host on the slower eager step, and against a check
    that does not run both its one- and five-token passes."""
    kernel = kernel_with(_float32_rounding)
    model = _model()
    target = Target(model, CharTokenizer(VOCAB))
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        step = target.compile("auto")
    assert step is not None and step.backend == "kernel"
    assert step.ready and step.reason == "", step.reason
    assert "running eager" not in caplog.text
    assert kernel.passes == [1, 5]  # the check: a step, and a pass verifying a draft
    for drafter in ("none", "ngram"):
        out = Engine(target, drafter=drafter).generate(PROMPT, SamplingParams(max_tokens=32))
        assert out.token_ids == _eager_output(model, drafter)
    assert step.served > 0 and len(kernel.passes) == 2 + step.served
