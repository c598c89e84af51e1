"""The greedy verifier on hand-made drafts and target rows.

Row 0 of p is the target's distribution after the last committed token; row i + 1 is its
distribution after draft node i. The verdict must be the longest path whose every token is
the argmax of the row before it, plus the argmax of the row where the path stopped: the
correction after a mismatch, or the bonus token after a leaf.
"""

from __future__ import annotations

import pytest
import torch
from specd.plugins.greedy import GreedyVerifier

from specd import Draft, SamplingParams

VOCAB = 10


def rows(choices: list[int]) -> torch.Tensor:
    """One row per entry, its largest mass (0.4, not 1) on that token."""
    p = torch.full((len(choices), VOCAB), 0.6 / (VOCAB - 1), dtype=torch.float64)
    for i, c in enumerate(choices):
        p[i, c] = 0.4
    return p  # [N + 1, V]


def verify(draft: Draft, choices: list[int]) -> tuple[list[int], int]:
    assert len(choices) == len(draft) + 1
    verdict = GreedyVerifier().verify(
        draft, rows(choices), SamplingParams(), torch.Generator().manual_seed(0)
    )
    return verdict.path, verdict.token


def test_an_empty_draft_emits_the_targets_next_token():
    assert verify(Draft.chain([]), [4]) == ([], 4)


def test_a_chain_the_target_agrees_with_ends_with_the_bonus_from_the_last_row():
    assert verify(Draft.chain([3, 5, 2]), [3, 5, 2, 7]) == ([0, 1, 2], 7)


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        ([6, 5, 2, 7], ([], 6)),  # wrong at once: the first row's argmax corrects it
        ([3, 6, 2, 7], ([0], 6)),  # the later "2" matches but comes after a mismatch
        ([3, 5, 9, 7], ([0, 1], 9)),
    ],
)
def test_a_chain_stops_at_the_first_mismatch_with_the_correction(choices, expected):
    assert verify(Draft.chain([3, 5, 2]), choices) == expected


def test_a_tree_follows_the_agreeing_child_wherever_it_sits_among_its_siblings():
    #        root
    #       /    \
    #   0:"4"   1:"3"
    #    |      /    \
    #  4:"1"  2:"5"  3:"6"
    draft = Draft(tokens=[4, 3, 5, 6, 1], parents=[-1, -1, 1, 1, 0])
    # the target wants 3 (node 1, the second root child), then 6 (node 3, the second child
    # of node 1), then 2 after node 3: a leaf, so 2 is the bonus token, taken from node 3's
    # row (row 4), not from the last row (row 5, node 4's) nor the row at depth 2.
    assert verify(draft, [3, 8, 6, 8, 2, 7]) == ([1, 3], 2)
    # the target wants 5 after node 1 instead: node 2, a leaf; its bonus is row 3's
    assert verify(draft, [3, 8, 5, 9, 2, 7]) == ([1, 2], 9)
    # a correction inside the tree comes from the stopping node's row
    assert verify(draft, [3, 8, 0, 9, 2, 7]) == ([1], 0)
    assert verify(draft, [4, 2, 5, 6, 7, 8]) == ([0], 2)


def test_equal_sibling_tokens_follow_the_first_in_draft_order():
    """A sampled tree can draw the same token twice under one parent; the first copy is the
    one followed (its subtree is what the draft order puts first)."""
    q = torch.full((4, VOCAB), 1 / VOCAB, dtype=torch.float64)
    draft = Draft(tokens=[3, 3, 5, 6], parents=[-1, -1, 0, 1], q=q)
    # through node 0: 5 (node 2), then bonus row 3 = 9; through node 1 it would be [1, 3], 8
    assert verify(draft, [3, 5, 6, 9, 8]) == ([0, 2], 9)


def test_tied_maxima_resolve_to_the_lowest_token_id_like_plain_greedy():
    p = torch.tensor([[0.1, 0.4, 0.1, 0.4]], dtype=torch.float64)
    verdict = GreedyVerifier().verify(
        Draft.chain([]), p, SamplingParams(), torch.Generator().manual_seed(0)
    )
    assert verdict.token == 1
