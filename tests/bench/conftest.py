"""One small benchmark run on a tiny random model, shared by the report tests."""

from __future__ import annotations

import pytest

from specd.bench import configs, harness, workloads
from specd.bench.probe import TargetSpec

TINY = TargetSpec(model="tiny")
CONFIGS = [
    "hf-plain",
    "hf-prompt-lookup",
    "specd-plain",
    "specd-ngram-fixed-k4",
    "specd-ngram-adaptive-k8",
    "specd-early_exit-fixed-k4",
]


@pytest.fixture(scope="session")
def tiny_spec():
    return TINY


@pytest.fixture(scope="session")
def tiny():
    return TINY.load()


@pytest.fixture(scope="session")
def prompts(tiny):
    return workloads.build("humaneval", tiny, limit=3, max_tokens=12)


@pytest.fixture(scope="session")
def report(tiny, prompts):
    cfgs, skipped = configs.resolve(CONFIGS)
    opts = harness.BenchOptions(
        rss="inprocess", context_tokens=64, prefix_prompts=2, progress=False
    )
    return harness.run("humaneval", prompts, cfgs, tiny, TINY, opts, skipped=skipped)
