"""``hybrid``'s merge of its parts' drafts into one token tree: a node's parent is the
merged tree's node, whatever index it had in its own draft."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from specd.plugins.eagle.hybrid import merge

from specd import Draft


def _paths(draft: Draft) -> set[tuple[int, ...]]:
    """The token sequence from the root to every node."""
    return {tuple(draft.tokens[i] for i in draft.path_to(n)) for n in range(len(draft))}


def test_a_later_drafts_chain_hangs_from_its_own_merged_nodes():
    """Guards against parenting a later draft's node on the index its parent had in that
    draft (here 0 and 1, the first draft's nodes) instead of where the parent landed in the
    merged tree (2 and 3): the chain 3, 4, 5 would be verified as 1, 4 and 1, 2, 5."""
    merged = merge([Draft.chain([1, 2]), Draft.chain([3, 4, 5])], 8)
    assert merged is not None
    assert merged.tokens == [1, 2, 3, 4, 5]
    assert merged.parents == [-1, 0, -1, 2, 3]


def test_equal_tokens_under_different_parents_are_not_shared():
    """Guards against sharing a node by (own parent index, token): the second draft's
    ``5 -> 2`` looks like the first draft's ``1 -> 2`` to that key, and the path 5, 2 was
    lost from the tree."""
    merged = merge([Draft.chain([1, 2]), Draft.chain([5, 2])], 8)
    assert merged is not None
    assert _paths(merged) == {(1,), (1, 2), (5,), (5, 2)}
    assert merged.parents == [-1, 0, -1, 2]


def test_an_eagle_tree_after_an_ngram_chain_keeps_its_shape():
    """Guards against a tree (the eagle part's) whose nodes' parents point into the n-gram
    chain merged before it."""
    chain = Draft.chain([7, 8, 9])
    tree = Draft(tokens=[7, 3, 8, 4, 6], parents=[-1, -1, 0, 1, 3])
    merged = merge([chain, tree], 16)
    assert merged is not None
    assert _paths(merged) == _paths(chain) | _paths(tree)
    assert len(merged) == 6  # 7 and 7 -> 8 are shared
    # the tree's 3 -> 4 -> 6 sits under the merged node of 3, not under the chain
    three = merged.tokens.index(3)
    four = merged.parents.index(three)
    assert merged.tokens[four] == 4 and merged.parents[merged.tokens.index(6)] == four


@st.composite
def _drafts(draw):
    """Deterministic drafts: each node's token distinct among its siblings."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        tokens: list[int] = []
        parents: list[int] = []
        for i in range(draw(st.integers(1, 7))):
            parent = draw(st.integers(-1, i - 1))
            taken = {t for t, p in zip(tokens, parents) if p == parent}
            token = draw(st.integers(0, 5).filter(lambda t, taken=taken: t not in taken))
            tokens.append(token)
            parents.append(parent)
        out.append(Draft(tokens=tokens, parents=parents))
    return out


@given(_drafts())
def test_merge_holds_every_path_of_every_draft_once(drafts):
    """Guards against a merged tree that loses a part's path, invents one no part drafted,
    or holds one path twice (equal siblings a deterministic draft must not have)."""
    merged = merge(drafts, 64)
    assert merged is not None
    want = set().union(*(_paths(d) for d in drafts))
    assert _paths(merged) == want
    assert len(merged) == len(want)
    assert all(-1 <= p < i for i, p in enumerate(merged.parents))


@given(_drafts(), st.integers(1, 6))
def test_a_budget_cuts_later_parts_first_and_invents_no_path(drafts, budget):
    """Guards against a tree over the budget, a path no part drafted (a node kept while its
    parent was cut, hung elsewhere), and the budget spent on later parts before the first."""
    merged = merge(drafts, budget)
    assert merged is not None and len(merged) <= budget
    want = set().union(*(_paths(d) for d in drafts))
    assert _paths(merged) <= want
    first = merge(drafts[:1], budget)
    assert first is not None and _paths(first) <= _paths(merged)
