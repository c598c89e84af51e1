"""Deliberately broken plugins: each gets one piece of the rejection rule wrong.

The verification suite must reject every one of them. They register through the same hooks a
third-party plugin uses, so ``specd verify`` can be pointed at them by name.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
from specd.plugins.draft_model import DraftModelDrafter
from specd.plugins.rejection import RejectionVerifier, TorchChance

from specd import hookimpl


class AlwaysAccept(RejectionVerifier):
    """Accepts every draft token."""

    name = "broken_always_accept"

    def accept_probability(self, r_x, q_x):
        return 1


class SoftmaxResidual(RejectionVerifier):
    """Turns the residual into a distribution with softmax instead of dividing by its sum."""

    name = "broken_softmax_residual"

    def residual(self, r, q):
        d = r - q
        d = d * (d > 0)
        e = _exp(d)
        return e / e.sum()


class FreshSample(RejectionVerifier):
    """On rejection draws the correction from p again instead of from the residual."""

    name = "broken_fresh_sample"

    def residual(self, r, q):
        return r


class UFixedAtZero(RejectionVerifier):
    """Uses u = 0 instead of a uniform draw: accepts every token with r(x) > 0."""

    name = "broken_u_zero"
    fixed_u = 0.0

    def chance(self, generator):
        return _FixedU(generator, self.fixed_u)


class _FixedU(TorchChance):
    def __init__(self, generator: torch.Generator, u: float) -> None:
        super().__init__(generator)
        self.u = u

    def uniform(self) -> float:
        return self.u


class ArgmaxWithSoftmaxQ(DraftModelDrafter):
    """Drafts the draft model's argmax but reports the sampling distribution as q, as if
    the token had been drawn from it."""

    name = "broken_argmax_q"

    def _children(self, logits, q, greedy, generator):
        return [int(q.argmax())]


BROKEN_VERIFIERS = (AlwaysAccept, SoftmaxResidual, FreshSample, UFixedAtZero)


def _exp(row):
    if isinstance(row, torch.Tensor):
        return row.exp()
    return np.array([Fraction(math.exp(float(v))) for v in row], dtype=object)


@hookimpl
def specd_register_verifiers(register):
    for cls in BROKEN_VERIFIERS:
        register(cls)


@hookimpl
def specd_register_drafters(register):
    register(ArgmaxWithSoftmaxQ)
