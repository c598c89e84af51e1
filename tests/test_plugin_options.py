"""Every option of every shipped plugin is read as given or refused by name: never clamped,
rounded or read as true in silence, and bounded before anything is sized by it."""

from __future__ import annotations

import math

import pytest

from specd import MAX_DRAFT, BadInputError, Engine, checks, registry
from specd.forward.tiny import tiny_target
from specd.options import parse_options

# -- the readers ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [4, 4.0, "4", " 4"])
def test_integer_reads_whole_numbers(value):
    assert checks.integer("p", "k", value, hi=8) == 4


@pytest.mark.parametrize(
    "value",
    [True, False, 2.5, "abc", "4.5", None, [4], 0, 9, -1, math.nan, "9" * 40, "--4", "٣", "1_0"],
)
def test_integer_refuses_by_name(value):
    with pytest.raises(BadInputError) as e:
        checks.integer("p", "k", value, hi=8)
    assert str(e.value) == f"p option k={value!r}: expected an integer from 1 to 8"


def test_optional_integer_takes_none():
    assert checks.optional_integer("p", "k", None) is None
    assert checks.optional_integer("p", "k", 3) == 3


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, True, "x", None, 0.0, 1.5, "1e999"]
)
def test_number_refuses_by_name(value):
    with pytest.raises(BadInputError, match=r"^p option k=.*: expected a number in \(0, 1\]$"):
        checks.number("p", "k", value, lo=0, hi=1, above=True)


def test_number_reads_text_and_bounds():
    assert checks.number("p", "k", "0.25", lo=0, hi=1) == 0.25
    assert checks.number("p", "k", 0, lo=0, hi=1) == 0.0  # closed below unless ``above``
    assert checks.number("p", "k", -3) == -3.0


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (True, True),
        (False, False),
        (1, True),
        (0, False),
        ("on", True),
        ("OFF", False),
        ("yes", True),
        ("no", False),
        ("true", True),
        ("false", False),
    ],
)
def test_flag_reads_words(value, read):
    assert checks.flag("p", "k", value) is read


@pytest.mark.parametrize("value", ["nope", "maybe", 2, -1, None, 0.5, ""])
def test_flag_refuses_other_text(value):
    with pytest.raises(BadInputError, match="expected true or false"):
        checks.flag("p", "k", value)


def test_command_line_text_reads_as_the_option_means():
    """``--drafter-option use_corpus=off`` was read as true (a non-empty string)."""
    opts = parse_options(["use_corpus=off", "max_n=6", "branches=2"])
    d = registry.make("drafters", "ngram", opts)
    assert (d.use_corpus, d.max_n, d.branches) == (False, 6, 2)


# -- every shipped plugin -------------------------------------------------------------------

TOO_MANY = MAX_DRAFT + 1
BAD = [
    ("drafters", "eagle", {"window": 0}, "window=0"),
    ("drafters", "eagle", {"window": -5}, "window=-5"),
    ("drafters", "eagle", {"window": 10**9}, "window=1000000000"),
    ("drafters", "eagle", {"topk": 0}, "topk=0"),
    ("drafters", "eagle", {"width": 2.5}, "width=2.5"),
    ("drafters", "eagle", {"max_draft": 0}, "max_draft=0"),
    ("drafters", "eagle", {"max_draft": TOO_MANY}, f"max_draft={TOO_MANY}"),
    ("drafters", "eagle", {"rest": "maybe"}, "rest='maybe'"),
    ("drafters", "eagle", {"min_prob": 2}, "min_prob=2"),
    ("drafters", "ngram", {"max_n": 10**6}, "max_n=1000000"),
    ("drafters", "ngram", {"min_n": 0}, "min_n=0"),
    ("drafters", "ngram", {"min_n": 3, "max_n": 2}, "min_n=3, max_n=2"),
    ("drafters", "ngram", {"branches": 0}, "branches=0"),
    ("drafters", "ngram", {"branch_len": -1}, "branch_len=-1"),
    ("drafters", "ngram", {"use_corpus": "nope"}, "use_corpus='nope'"),
    ("drafters", "ngram", {"max_draft": 10**8}, "max_draft=100000000"),
    ("drafters", "hybrid", {"min_len": 0}, "min_len=0"),
    ("drafters", "hybrid", {"drafters": "ngram,ngram"}, "drafters='ngram,ngram'"),
    ("drafters", "hybrid", {"eagle.head": "random", "eagle.window": 0}, "window=0"),
    ("drafters", "hybrid", {"eagle.head": "random", "ngram.branches": 0}, "branches=0"),
    ("drafters", "hybrid", {"eagle.head": "random", "ngram.max_n": "x"}, "max_n='x'"),
    ("drafters", "early_exit", {"layer": 0}, "layer=0"),
    ("drafters", "early_exit", {"max_draft": -1}, "max_draft=-1"),
    ("drafters", "draft_model", {"model": "tiny:0", "branch": 0}, "branch=0"),
    ("drafters", "draft_model", {"model": "tiny:0", "max_draft": 10**9}, "max_draft=1000000000"),
    ("drafters", "draft_model", {"model": "tiny:0", "dtype": "float16"}, "option dtype"),
    ("drafters", "draft_model", {"model": "target", "device": "cuda"}, "option device"),
    ("exit_policies", "adaptive", {"probe_max": 0}, "probe_max=0"),
    ("exit_policies", "fixed", {"budget": -1}, "budget=-1"),
    ("exit_policies", "fixed", {"budget": TOO_MANY}, f"budget={TOO_MANY}"),
    ("exit_policies", "fixed", {"min_confidence": 2}, "min_confidence=2"),
    ("exit_policies", "adaptive", {"ema": 0}, "ema=0"),
    ("exit_policies", "adaptive", {"collapse": math.nan}, "collapse=nan"),
    ("exit_policies", "adaptive", {"probe_every": 0}, "probe_every=0"),
    ("exit_policies", "adaptive", {"start_budget": 10**9}, "start_budget=1000000000"),
    ("exit_policies", "adaptive", {"min_confidence": -0.1}, "min_confidence=-0.1"),
]


@pytest.mark.parametrize(("kind", "name", "options", "named"), BAD, ids=lambda v: str(v))
def test_a_bad_option_is_refused_by_name(kind, name, options, named):
    with pytest.raises(BadInputError) as e:
        registry.make(kind, name, options)
    assert named in str(e.value)
    assert "expected" in str(e.value) or "applies to" in str(e.value)


@pytest.mark.parametrize(
    ("kind", "name", "options", "read"),
    [
        ("drafters", "eagle", {"window": "32", "topk": 3.0, "width": 1}, ("window", 32)),
        ("drafters", "eagle", {"max_draft": MAX_DRAFT}, ("max_draft", MAX_DRAFT)),
        ("drafters", "eagle", {"rest": "off"}, ("rest", False)),
        ("drafters", "ngram", {"min_n": 2, "max_n": 2}, ("max_n", 2)),
        ("drafters", "hybrid", {"eagle.head": "random", "min_len": 3}, ("min_len", 3)),
        ("drafters", "early_exit", {"layer": 2}, ("layer", 2)),
        ("exit_policies", "fixed", {"budget": 0}, ("budget", 0)),
        ("exit_policies", "adaptive", {"ema": 1}, ("ema", 1.0)),
        ("exit_policies", "adaptive", {"probe_every": 100}, ("probe_max", 100)),
    ],
    ids=lambda v: str(v),
)
def test_a_good_option_is_read_as_given(kind, name, options, read):
    attr, value = read
    assert getattr(registry.make(kind, name, options), attr) == value


# -- the engine's own bound -----------------------------------------------------------------


@pytest.mark.parametrize("max_draft", [-1, TOO_MANY, 10**8, 2.0, True])
def test_the_engine_refuses_a_draft_it_cannot_bound(max_draft):
    """``--max-draft 100000000`` took 1.7 GB and two seconds before its first token: the
    exit policy keeps a figure per draft position."""
    target = tiny_target(32, seed=0)
    with pytest.raises(BadInputError, match="max_draft must be"):
        Engine(target, max_draft=max_draft)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-draft", "100000000"], "max_draft must be from 0 to 256, got 100,000,000"),
        (["--drafter", "eagle", "--drafter-option", "window=0"], "eagle option window=0"),
        (["--drafter-option", "eagle.topk=-2"], "eagle option topk=-2"),
    ],
)
def test_the_command_line_says_which_option_was_wrong(capsys, args, said):
    from specd.cli import main

    code = main(["generate", "def f(x):", "--model", "tiny:0", "--max-tokens", "2", *args])
    assert code == 2
    assert said in capsys.readouterr().err
