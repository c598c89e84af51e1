"""Sampling parameters and the one warping function that turns logits into probabilities.

Plain sampling, the verifiers and every drafter that samples build their distributions with
:func:`warp`, so the target's p and a drafter's q are always shaped the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import BadInputError

#: The seeds a random generator takes (``torch.Generator.manual_seed``: 64 bits, signed or not).
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How to choose tokens. ``temperature == 0`` means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    seed: int | None = None
    max_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)):
            raise BadInputError(f"temperature must be a finite number, got {self.temperature!r}")
        if self.temperature < 0:
            raise BadInputError(f"temperature must be >= 0, got {self.temperature}")
        if not _integer(self.top_k) or self.top_k < 0:
            raise BadInputError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise BadInputError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _integer(self.max_tokens) or self.max_tokens < 1:
            raise BadInputError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if self.seed is not None and not (
            _integer(self.seed) and SEED_MIN <= self.seed <= SEED_MAX
        ):
            raise BadInputError(
                f"seed must be an integer from {SEED_MIN} to {SEED_MAX}, got {self.seed!r}"
            )
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise BadInputError("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp(
    logits: torch.Tensor, params: SamplingParams, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """Turn logits into the probabilities tokens are drawn from.

    :param logits: ``[..., V]`` raw scores.
    :param params: temperature, top-k and top-p to apply, in that order.
    :param allowed: ``[..., V]`` booleans from a constraint (token healing), or None.
        Disallowed tokens are removed before warping, so greedy takes the argmax among the
        allowed tokens and sampling the distribution renormalised over them.
    :returns: ``[..., V]`` float probabilities summing to 1 on the last axis. Greedy gives a
        one-hot vector on the first argmax, the token plain greedy decoding picks. Sampled,
        the scores are ranked and normalised in float32: logits closer than its resolution
        tie (float64 logits are rounded to it first).
    """
    if allowed is not None:
        logits = logits.masked_fill(~allowed, float("-inf"))
    if params.greedy:
        idx = argmax(logits).unsqueeze(-1)
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(-1, idx, 1.0)
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass
        # strictly before it already reaches top_p. The first token is always kept.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """The index of the first largest value along the last axis, as ``x.argmax(-1)`` gives it
    (a NaN counts as the largest): ``[...]`` int64. Rows of float32 or float64 on the CPU go
    through NumPy's vectorised argmax, 5 µs a 49k-vocabulary row where torch's takes ~75."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.dim() > 0:
        return torch.from_numpy(np.asarray(x.detach().numpy().argmax(-1)))
    return x.argmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token id from a ``[V]`` probability vector.

    The request's generator lives on the CPU (so a seed gives the same tokens on every
    device); probabilities on another device are drawn from on the CPU.
    """
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def choose(p: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """The target's own token from a warped ``[V]`` distribution (plain decoding)."""
    return int(argmax(p)) if params.greedy else sample(p, generator)


def _integer(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded from ``seed``, or from fresh entropy when it is None."""
    gen = torch.Generator(device="cpu")
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
