"""Configuration names: parsing, the references that always run, clean skips."""

from __future__ import annotations

import pytest

from specd.bench import configs
from specd.errors import BadInputError


def test_parse_names():
    assert configs.parse("hf-plain").kind == "hf"
    assert configs.parse("hf-prompt-lookup").prompt_lookup_tokens == configs.HF_PROMPT_LOOKUP_TOKENS
    assert configs.parse("hf-prompt-lookup-3").prompt_lookup_tokens == 3
    plain = configs.parse("specd-plain")
    assert (plain.drafter, plain.generate_args()) == ("none", "--drafter none")
    c = configs.parse("specd-ngram-adaptive-k16+max_n=3")
    assert (c.drafter, c.exit_policy, c.max_draft, c.drafter_options) == (
        "ngram",
        "adaptive",
        16,
        {"max_n": 3},
    )
    assert (
        c.generate_args()
        == "--drafter ngram --exit-policy adaptive --max-draft 16 --drafter-option max_n=3"
    )


@pytest.mark.parametrize(
    "name",
    [
        "hf-fast",
        "specd-ngram-adaptive",
        "specd-nosuch-fixed-k4",
        "specd-ngram-nosuch-k4",
        "specd-ngram-fixed-k0",
        "specd-ngram-fixed-k257",  # beyond MAX_DRAFT: refused before the run, not inside it
        "hf-assisted",
    ],
)
def test_bad_names_are_bad_input(name):
    with pytest.raises(BadInputError):
        configs.parse(name)


def test_draft_model_needs_a_draft_model():
    with pytest.raises(BadInputError, match="--draft-model"):
        configs.parse("specd-draft_model-fixed-k4")
    c = configs.parse("specd-draft_model-fixed-k6+tree=topk+branch=2", draft_model="target")
    assert c.drafter_options == {"model": "target", "tree": "topk", "branch": 2}


def test_references_always_run_first():
    cfgs, _ = configs.resolve(["specd-ngram-fixed-k4"])
    assert [c.name for c in cfgs] == [
        "hf-plain",
        "hf-prompt-lookup",
        "specd-plain",
        "specd-ngram-fixed-k4",
    ]


def test_defaults_skip_what_needs_a_draft_model():
    names, skipped = configs.default_names()
    assert "specd-ngram-adaptive-k8" in names
    assert not any(n.startswith(("specd-draft_model", "hf-assisted")) for n in names)
    assert {s["config"] for s in skipped} >= {"hf-assisted", "specd-draft_model-fixed-k4"}
    names, skipped = configs.default_names(draft_model="target")
    assert "hf-assisted" in names and "specd-draft_model-adaptive-k8" in names
    assert skipped == []
