"""The EAGLE head through the step kernel (plugins/eagle/kernel.py): the drafts, scores and
features the head computes through PyTorch, the window and each node's own path, a cache
left holding true entries only, and output identical to plain decoding."""

from __future__ import annotations

import pytest
import torch
from specd.plugins.eagle.drafter import EagleDrafter
from specd.plugins.eagle.head import EagleHead, HeadConfig
from specd.plugins.eagle.headfile import save_head
from specd.plugins.eagle.tree import Node

from specd import DraftContext, Engine, SamplingParams
from specd.forward import cpu_kernels, interleave
from specd.forward.tiny import tiny_blocks_target, tiny_target

VOCAB = 48
# 16-wide heads: a shape the step kernel takes
TARGET = tiny_target(
    VOCAB, seed=2, logit_scale=3.0, num_layers=2, hidden_size=64, dtype=torch.float32
)
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3]

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not cpu_kernels.available(), reason="the CPU kernels do not run here"),
]


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    """A fully random head for TARGET over 40 of its tokens."""
    torch.manual_seed(1)
    head = EagleHead(HeadConfig.for_target(TARGET.config), torch.arange(40))
    for p in head.parameters():  # weights large enough that every part of the layer matters
        torch.nn.init.normal_(p, 0.0, 0.3)
    path = tmp_path_factory.mktemp("heads") / "tiny64.safetensors"
    save_head(path, head, TARGET, "specd train eagle --model tiny")
    return str(path)


def _ctx(prompt: list[int], params: SamplingParams) -> DraftContext:
    cache, hidden = TARGET.new_cache(), []
    TARGET.prefill(cache, prompt[:-1], None, hidden)
    return DraftContext(
        tokens=list(prompt),
        params=params,
        generator=torch.Generator().manual_seed(0),
        vocab_size=VOCAB,
        target=TARGET,
        cache=cache,
        hidden=torch.cat(hidden),
    )


def _drafter(head_file: str, kernel: bool, **options) -> EagleDrafter:
    drafter = EagleDrafter(head=head_file, **options)
    drafter._load(TARGET)
    assert drafter._kernel is not None  # the kernel takes this head
    if not kernel:
        drafter._kernel = None
    return drafter


def _decoded(head_file: str, kernel: bool, window: int = 256) -> tuple[EagleDrafter, list[int]]:
    """The drafter after an engine decoded 12 tokens after PROMPT with it (so that a short
    window has left the first entries out), through the kernel or PyTorch, and the tokens."""
    options = {"eagle": {"head": head_file, "window": window}}
    e = Engine(TARGET, drafter_options=options, exit_policy="fixed")
    drafter = e.plugins.drafter("eagle")
    drafter._load(TARGET)
    assert drafter._kernel is not None  # the kernel takes this head
    if not kernel:
        drafter._kernel = None
    out = e.generate(PROMPT, SamplingParams(max_tokens=12), drafter="eagle")
    assert out.stats.drafted > 0
    return drafter, [*PROMPT, *out.token_ids]


def _tree(head_file: str, kernel: bool, window: int):
    """The greedy tree the head drafts next: each node's token path with its log
    probability, the root's feature, and the entries in the head's cache after drafting
    with the true ones among them."""
    drafter, tokens = _decoded(head_file, kernel, window)
    ctx = DraftContext(tokens, SamplingParams(), torch.Generator(), VOCAB)
    pending = drafter._pos[-1] + 1
    true = drafter._cache.length
    with torch.inference_mode():
        nodes = drafter._tree(ctx, 8, pending)
    drafter._crop(true)
    paths: list[tuple[int, ...]] = []
    for n in nodes:  # parents come first
        paths.append((*(paths[n.parent] if n.parent >= 0 else ()), n.token))
    scores = {path: n.score for path, n in zip(paths, nodes)}
    return scores, drafter._outs[-1], (drafter._cache.length, len(drafter._pos))


def test_each_node_sees_its_own_path_and_no_other_branch(head_file):
    """Bug guarded: a node's entry that sees its siblings or cousins (fed in the same kernel
    call) or misses an ancestor. Two branches of three levels, each level expanded in turn:
    the kernel's outputs against PyTorch's, whose draft entries stay in the head's cache."""
    drafter, tokens = _decoded(head_file, kernel=True, window=4)
    pending, true = drafter._pos[-1] + 1, drafter._cache.length
    torch.manual_seed(3)
    feats = torch.randn(6, TARGET.config.hidden_size)
    shape = [(7, -1), (15, -1), (4, 0), (9, 1), (3, 2), (3, 3)]  # (token, parent)
    nodes: list[Node] = []
    for (token, parent), feat in zip(shape, feats):
        depth = 1 if parent < 0 else nodes[parent].depth + 1
        nodes.append(Node(token, parent, depth, 0.0, feat))
    levels = [[0, 1], [2, 3], [4, 5]]
    with torch.inference_mode():
        got = [drafter._expand_paths(level, nodes, pending)[0] for level in levels]
        kernel, drafter._kernel = drafter._kernel, None
        want = [drafter._expand(level, nodes, pending) for level in levels]
        drafter._kernel = kernel
    drafter._crop(true)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [4, 256])
def test_the_kernel_drafts_the_tree_pytorch_drafts(head_file, window):
    """Bug guarded: the kernel's entries at other positions than PyTorch's, a node that sees
    its siblings' or cousins' entries (or misses an ancestor's), true entries outside the
    window attended to, a final norm applied to the predicted features: each moves the
    tree's scores far past float32 rounding. A window of 4 leaves most of the prompt's
    entries out; topk = width = 2 and 8 nodes expand four levels deep."""
    want, want_root, want_len = _tree(head_file, False, window)
    got, root, length = _tree(head_file, True, window)
    assert len(want) == 8 and max(len(p) for p in want) >= 4
    assert got.keys() == want.keys()
    for path, score in want.items():
        assert got[path] == pytest.approx(score, abs=1e-4), path
    torch.testing.assert_close(root, want_root, atol=1e-5, rtol=1e-5)
    # drafting left the true entries alone in the cache, as many as PyTorch's
    assert length == want_len and length[0] == length[1] > 4  # more than the short window


def test_the_kernel_draws_the_chain_pytorch_draws_with_its_q(head_file):
    """Sampled drafts: the same tokens from the same generator and a q within float32
    rounding of PyTorch's, each row over the full vocabulary."""
    drafts = []
    for kernel in (False, True):
        drafter = _drafter(head_file, kernel)
        ctx = _ctx(PROMPT, SamplingParams(temperature=1.0, seed=0))
        drafter.start(ctx)
        draft = drafter.propose(ctx, 5)
        assert draft is not None and draft.q is not None and len(draft) == 5
        assert drafter._cache.length == len(PROMPT) - 1
        drafts.append(draft)
    assert drafts[1].tokens == drafts[0].tokens
    torch.testing.assert_close(drafts[1].q, drafts[0].q, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3)])
def test_greedy_eagle_through_the_kernel_is_identical_to_plain(head_file, shape):
    """topk = width = 3 drafts trees wider than one kernel call takes: PyTorch drafts them."""
    topk, width = shape
    e = Engine(
        TARGET,
        drafter_options={"eagle": {"head": head_file, "topk": topk, "width": width}},
        exit_policy="fixed",
    )
    params = SamplingParams(max_tokens=24)
    spec = e.generate(PROMPT, params, drafter="eagle")
    assert spec.stats.fallback is None and spec.stats.drafted > 0
    assert spec.token_ids == e.generate(PROMPT, params, drafter="none").token_ids
    assert e.plugins.drafter("eagle")._kernel is not None


def test_on_a_target_run_on_blocks_the_kernel_reads_the_heads_q8_blocks():
    """The head's layers rounded to Q8_0 as the target's own step reads them (its int8
    products): features within that rounding of PyTorch's over the float weights, and the
    output still that of plain decoding."""
    target = tiny_blocks_target(VOCAB, "q8", seed=3, logit_scale=30.0)
    drafter = EagleDrafter(head="random")
    head = drafter._load(target)
    # its eight matrices woven for the int8 products, where those are on (the default)
    assert drafter._kernel is not None
    assert drafter._kernel.step.woven == (8 if interleave.enabled() else 0)
    torch.manual_seed(0)
    feat = torch.randn(3, head.config.hidden)
    tokens = torch.tensor([4, 7, 9])
    with torch.inference_mode():
        _, got = drafter._kernel_entries(feat, tokens, [0, 1, 2], None)
        drafter._crop(0)
        head.product = None  # every layer's float weight
        want = drafter._entries(feat, tokens, [0, 1, 2], None)
    assert not torch.equal(got, want)  # the blocks were read
    torch.testing.assert_close(got, want, atol=0.03 * float(want.abs().max()), rtol=0)
    e = Engine(target, drafter_options={"eagle": {"head": "random"}}, exit_policy="fixed")
    params = SamplingParams(max_tokens=16)
    spec = e.generate(PROMPT, params, drafter="eagle")
    assert spec.stats.drafted > 0
    assert spec.token_ids == e.generate(PROMPT, params, drafter="none").token_ids


def test_a_bfloat16_head_catching_up_through_pytorch_then_drafts_through_the_kernel():
    """Bug guarded: a prompt of more entries than a kernel call takes is fed through PyTorch
    first; a bfloat16 head then made the cache bfloat16, which the kernel refused at the
    next draft (the drafter failed and was turned off)."""
    target = tiny_target(48, seed=2, logit_scale=3.0, hidden_size=64, dtype=torch.bfloat16)
    e = Engine(target, drafter_options={"eagle": {"head": "random"}}, exit_policy="fixed")
    prompt = PROMPT * 3  # 48 entries to catch up on
    params = SamplingParams(max_tokens=16)
    spec = e.generate(prompt, params, drafter="eagle")
    assert spec.stats.fallback is None and spec.stats.drafted > 0
    assert e.plugins.drafter("eagle")._kernel is not None
    assert spec.token_ids == e.generate(prompt, params, drafter="none").token_ids
