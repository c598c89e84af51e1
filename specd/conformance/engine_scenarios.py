"""The tiny target the engine checks run on, its exact sequence law, and the sampling
scenarios whose sequences are compared with that law.

The target is :func:`specd.forward.tiny.tiny_model` (seed 0, float64) over eight tokens with its
output layer scaled so its distributions are peaked like a trained model's; ``specd verify
--weights`` stores its matrices as quantized blocks instead (:data:`WEIGHTS`). Over a short
horizon its sequence law is enumerated exactly: the target run on every prefix, warped with
:func:`specd.sampling.warp` as the engine warps it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import BadInputError
from ..forward.target import Target
from ..forward.tiny import tiny_blocks_target, tiny_target
from ..forward.weights import QUANTIZED
from ..sampling import SamplingParams, warp

VOCAB = 8
HORIZON = 4
MAX_DRAFT = 3
TARGET_LOGIT_SCALE = 8.0
#: ``specd verify --weights`` values, the default first, and how each stores the conformance
#: target's matrices: ``f32`` keeps the float weights (float64, the suite's exact default),
#: the others quantize them to blocks (:data:`specd.forward.weights.QUANTIZED`).
WEIGHTS = {"f32": "f64", **QUANTIZED}


def check_weights(weights: str) -> str:
    """``weights`` when it is a :data:`WEIGHTS` value; BadInputError listing them otherwise."""
    if weights not in WEIGHTS:
        raise BadInputError(f"unknown --weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    return weights


def conformance_target(weights: str = "f32") -> Target:
    """The tiny target every engine check uses: :func:`specd.forward.tiny.tiny_model` with seed 0
    in float64, its output layer scaled so its distributions are peaked like a trained
    model's. The ``draft_model`` drafter's ``tiny:0`` (the same weights, scaled less) is a
    flatter draft model of it.

    :param weights: ``f32`` for those float weights; ``bf16``, ``q8`` or ``q4`` for such a
        model (twice as wide, so the step kernel takes it and its int8 products run) with
        its matrices stored as blocks of that format, computing in float32
        (:func:`specd.forward.tiny.tiny_blocks_target`): its law is then enumerated from
        the quantized target itself, so the checks are of the engine on those weights.
    """
    if check_weights(weights) == "f32":
        return tiny_target(VOCAB, seed=0, logit_scale=TARGET_LOGIT_SCALE)
    return tiny_blocks_target(VOCAB, weights, seed=0, logit_scale=TARGET_LOGIT_SCALE)


def conformance_prompt(target: Target, length: int = 12) -> list[int]:
    """The target's own greedy continuation of token 0. A random tiny model mostly follows
    its last token, so this falls into a cycle: drafters that copy from the context (n-gram,
    bigram) then propose what the target is likely to sample."""
    tokens = [0]
    while len(tokens) < length:
        tokens.append(int(target_row(target, tokens, SamplingParams()).argmax()))
    return tokens


#: A prompt the target disagrees with. Copying drafters propose tokens that top-k cuts
#: (probability 0: a verifier that accepts any of them is caught by one sample), bigram
#: continuations that disagree (``3 1`` and ``3 0``, ``1 0`` and ``1 1``: a tree for a
#: drafter that drafts the alternatives), and chains the target follows to the end often
#: enough that the bonus token is drawn in most sequences.
DISAGREEING_PROMPT = (3, 1, 0, 3, 1, 1, 3, 0, 3, 3)


def target_row(target: Target, tokens: Sequence[int], params: SamplingParams) -> torch.Tensor:
    """The target's warped distribution after ``tokens``, from a fresh cache."""
    logits = target.forward(target.new_cache(), list(tokens)).logits[-1]  # [V]
    return warp(logits, params)


def sequence_law(
    target: Target, prompt: Sequence[int], params: SamplingParams, horizon: int
) -> dict[tuple[int, ...], float]:
    """The exact probability of every continuation of ``horizon`` tokens."""
    law: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(horizon):
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, mass in law.items():
            row = target_row(target, [*prompt, *prefix], params).double()
            row = row / row.sum()
            for x in torch.nonzero(row > 0).flatten().tolist():
                nxt[prefix + (x,)] = mass * float(row[x])
        law = nxt
    return law


@dataclass(frozen=True)
class EngineScenario:
    """One sampled law check: ``samples`` sequences of ``horizon`` tokens after the prompt,
    each from its own seed, against the enumerated law.

    :param name: the property is ``engine/law/<name>``.
    :param params: temperature, top-k and top-p.
    :param sensitivity_kl: the smallest departure (KL, nats) the check rejects with
        probability >= 0.999 at :data:`specd.conformance.gtest.ALPHA` (docs/verification.md).
    :param thorough_sensitivity_kl: the same with :data:`THOROUGH_FACTOR` times the samples.
    :param seed_offset: added to every seed, so scenarios draw independent sequences.
    """

    name: str
    params: dict[str, Any]
    samples: int
    sensitivity_kl: float
    thorough_sensitivity_kl: float
    prompt: Callable[[Target], list[int]]
    seed_offset: int = 0
    horizon: int = HORIZON

    def sampling(self, seed: int | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=self.horizon, seed=seed, **self.params)

    def thorough(self) -> EngineScenario:
        """The scenario with :data:`THOROUGH_FACTOR` times the samples (``--thorough``)."""
        return replace(
            self,
            samples=self.samples * THOROUGH_FACTOR,
            sensitivity_kl=self.thorough_sensitivity_kl,
        )


#: Temperature 1 with top-k 2 and top-p 0.95 on the target's own cycle: drafts are often
#: accepted, so the accept path and full accepts are exercised.
SAMPLED = EngineScenario(
    "sampled",
    dict(temperature=1.0, top_k=2, top_p=0.95),
    samples=1_200,
    sensitivity_kl=0.04,
    thorough_sensitivity_kl=0.01,
    prompt=conformance_prompt,
)
#: Temperature 0.7 with top-k 3 and top-p 0.9 (both cut real mass) on a prompt the target
#: disagrees with: rejections, corrections from residuals, siblings tried after a rejected
#: one, and bonus tokens after rows that differ from their parent's. A temperature other
#: than 1 separates a warp applied once from one applied twice.
WARPED = EngineScenario(
    "warped",
    dict(temperature=0.7, top_k=3, top_p=0.9),
    samples=1_200,
    sensitivity_kl=0.053,
    thorough_sensitivity_kl=0.015,
    prompt=lambda target: list(DISAGREEING_PROMPT),
    seed_offset=500_000,
)
SCENARIOS = (SAMPLED, WARPED)
#: ``specd verify --thorough`` samples this many times more sequences per scenario.
THOROUGH_FACTOR = 4


def engine_scenarios(thorough: bool = False) -> tuple[EngineScenario, ...]:
    """The scenarios a run samples: :data:`SCENARIOS`, or their thorough versions."""
    return tuple(s.thorough() for s in SCENARIOS) if thorough else SCENARIOS
