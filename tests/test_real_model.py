"""End-to-end checks on the real default model (SmolLM2-135M-Instruct, float32, CPU)."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from specd import SamplingParams

pytestmark = pytest.mark.slow

REPETITIVE = """class Vector:
    def __init__(self, x, y, z):
        self.x = x
        self.y = y
        self.z = z

    def __add__(self, other):
        return Vector(self.x + other.x, self.y + other.y, self.z + other.z)

    def __sub__(self, other):
        return Vector(self.x - other.x, self.y - other.y, self.z - other.z)

    def __mul__(self, other):
        return Vector("""

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\ndef main():\n",
    REPETITIVE,
    inspect.getsource(json.dumps)[:1500],
]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["fib", "main", "repetitive", "stdlib"])
def test_greedy_ngram_matches_plain_and_hf_generate(real_engine, real_engine_float, prompt):
    """Greedy speculation emits plain decoding's tokens, as served (int8 products) and with
    the blocks decoded to floats; the latter are transformers' own greedy tokens."""
    params = SamplingParams(max_tokens=40)
    for engine in (real_engine, real_engine_float):
        spec = engine.generate(prompt, params, drafter="ngram")
        plain = engine.generate(prompt, params, drafter="none")
        assert spec.token_ids == plain.token_ids
    ids = real_engine.tokenize(prompt)
    with torch.inference_mode():
        out = real_engine_float.target.hf_model().generate(
            torch.tensor([ids]), max_new_tokens=40, do_sample=False
        )
    hf = out[0, len(ids) :].tolist()
    eos = real_engine.target.eos_token_ids
    hf = hf[: next((i for i, t in enumerate(hf) if t in eos), len(hf))]
    assert spec.token_ids == hf


def test_repetitive_code_reaches_acceptance_above_1_5(real_engine):
    out = real_engine.generate(REPETITIVE, SamplingParams(max_tokens=48), drafter="ngram")
    assert out.stats.mean_acceptance_length > 1.5, out.stats.as_json()


def test_second_request_after_an_edit_reuses_the_prefix(real_engine):
    src = inspect.getsource(json.JSONEncoder)[:3000]
    real_engine.generate(src, SamplingParams(max_tokens=4))
    edited = real_engine.generate(src + "x", SamplingParams(max_tokens=4))
    n = len(real_engine.tokenize(src))
    assert edited.stats.reused_tokens >= n - 2
