"""``--weights``: how a model's matrices are stored. Quantized on load (bf16, q8, q4), every
decoder matrix and the embedding are blocks that compute close to float32 and decode
exactly what their de-quantized values do; a GGUF model keeps its own blocks by default;
what cannot be honoured is refused with a message that names it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_lean_load import hf_model, write_tokenizer

from specd import BadInputError, Engine, ModelNotFoundError, SamplingParams
from specd.cli import build_parser, main
from specd.forward import blocks, cpu_kernels, models
from specd.forward import weights as stored
from specd.forward.blocks import BlockWeight
from specd.forward.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")

#: Every command that loads a model, with the arguments it needs besides the model options.
COMMANDS = {
    "generate": ["generate", "x"],
    "train eagle": ["train", "eagle", "--data", "d", "--out", "o"],
    "complete": ["complete", "f.py", "--line", "1", "--col", "1"],
    "serve": ["serve", "--stdio"],
    "bench": ["bench", "--workload", "random"],
}
#: ``--weights`` value -> the block format it stores, and how far its logits may stray from
#: float32's (relative L2 error; measured 0.002, 0.007 and 0.105 on this checkpoint).
QUANTIZED = {"bf16": ("bf16", 0.01), "q8": ("q8_0", 0.02), "q4": ("q4_1", 0.25)}
PROMPT = [5, 17, 42, 9, 120, 33, 250, 7, 64, 91, 3, 18] * 3


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint (tied embedding and LM head) as a Hugging Face directory."""
    where = tmp_path_factory.mktemp("tiny-llama")
    hf_model("llama-tied").save_pretrained(where)
    write_tokenizer(where)
    return where


@pytest.fixture(scope="module")
def f32(checkpoint) -> Target:
    return models.load_target(str(checkpoint), weights="f32")


def logits(target: Target, tokens: list[int]) -> torch.Tensor:
    return target.forward(target.new_cache(), tokens, eager=True).logits  # [T, V]


#: Options that say how a model is stored: flag, its choices, a value it refuses.
STORAGE_OPTIONS = {
    "weights": ("--weights", stored.CHOICES, "q5"),
    "kv_dtype": ("--kv-dtype", stored.KV_DTYPES, "int8"),
}


@pytest.mark.parametrize("option", STORAGE_OPTIONS)
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_that_loads_a_model_takes_the_storage_options(command, option, capsys):
    flag, choices, bad = STORAGE_OPTIONS[option]
    parser = build_parser()
    argv = COMMANDS[command]
    assert getattr(parser.parse_args(argv), option) == "auto"
    for value in choices:
        assert getattr(parser.parse_args([*argv, flag, value]), option) == value
    with pytest.raises(SystemExit) as e:
        parser.parse_args([*argv, flag, bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and f"'{bad}'" in err
    assert all(f"'{value}'" in err or value in err for value in choices)


def test_the_session_bench_hands_the_storage_options_to_its_daemon():
    from specd.bench.session_report import _model_args

    argv = ["bench", "--workload", "session", "--weights", "q4", "--kv-dtype", "float32"]
    flags = _model_args(build_parser().parse_args(argv))
    assert flags[flags.index("--weights") + 1] == "q4"
    assert flags[flags.index("--kv-dtype") + 1] == "float32"


def test_native_is_refused_for_a_safetensors_model(checkpoint, capsys):
    with pytest.raises(BadInputError) as e:
        models.load_target(str(checkpoint), weights="native")
    message = str(e.value)
    assert str(checkpoint) in message and "not a GGUF model" in message
    assert "auto, f32, bf16, q8, q4" in message
    code = main(["generate", "x", "--model", str(checkpoint), "--weights", "native"])
    assert code == 2 and "--weights native" in capsys.readouterr().err


def test_a_bad_value_through_the_api_names_the_choices(checkpoint):
    with pytest.raises(BadInputError, match="auto, f32, bf16, q8, q4, native"):
        models.load_target(str(checkpoint), weights="int4")


@pytest.mark.parametrize("choice", QUANTIZED)
def test_quantized_weights_are_blocks_close_to_float32(checkpoint, f32, choice):
    fmt, tolerance = QUANTIZED[choice]
    target = models.load_target(str(checkpoint), weights=choice)
    lm, ref = target.model, f32.model
    decoder = lm.get_decoder()
    for i, layer in enumerate(decoder.layers):
        for name in stored.LAYER_MATRICES:
            w = layer.get_submodule(name).weight
            assert isinstance(w, BlockWeight) and w.fmt.name == fmt, (i, name)
            # quantized from the float32 values, the way blocks.quantize does it
            want = blocks.quantize(ref.get_decoder().layers[i].get_submodule(name).weight, fmt)
            assert torch.equal(w.data, want.data), (i, name)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            assert isinstance(norm.weight, torch.nn.Parameter)
            assert norm.weight.dtype == torch.float32
    embed = decoder.embed_tokens.weight
    assert isinstance(embed, BlockWeight) and embed.fmt.name == fmt
    assert lm.get_output_embeddings().weight is embed  # tied: one object, read once
    assert lm.weight_format == fmt and ref.weight_format == "f32"
    blocks_bytes = sum(w.nbytes for w in lm.block_weights())
    norms = sum(p.numel() * 4 for p in lm.parameters())
    assert lm.weight_bytes == blocks_bytes + norms < ref.weight_bytes
    got, want = logits(target, PROMPT), logits(f32, PROMPT)
    assert ((got - want).norm() / want.norm()).item() < tolerance
    if choice != "q4":
        agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
        assert agree >= 0.9


def test_a_matrix_that_does_not_split_into_blocks_is_named():
    tensors = {"model.layers.3.mlp.down_proj.weight": torch.ones(4, 40)}
    with pytest.raises(BadInputError, match=r"down_proj.weight of m \(shape \(4, 40\)\)"):
        stored.quantize(tensors, "q8", "m")
    norm = {"model.layers.3.input_layernorm.weight": torch.ones(40)}
    assert stored.quantize(norm, "q8", "m") == norm  # norms stay float32


def test_a_gguf_file_whose_heads_differ_from_its_converted_copy_is_refused(checkpoint, monkeypatch):
    """The q and k rows are put back in order by the file's head counts; a converted copy
    that says otherwise (a stale cache) would run them in the wrong order."""
    from specd.forward.lean_model import read_config

    cfg = read_config(checkpoint)  # 4 heads, 2 key/value heads
    read = {"head_count": 4, "head_count_kv": 2}
    monkeypatch.setattr(blocks, "read_gguf", lambda path: ({"t": 1}, read))
    assert stored.read_gguf(Path("m.gguf"), cfg, checkpoint) == {"t": 1}
    read["head_count_kv"] = 4
    with pytest.raises(ModelNotFoundError, match="head_count_kv 4 .* says 2"):
        stored.read_gguf(Path("m.gguf"), cfg, checkpoint)


def test_q8_decoding_is_exact_and_speculation_keeps_it(checkpoint, tmp_path):
    """Greedy speculation on a q8 model emits plain decoding's tokens, and plain decoding
    on the blocks emits what a float32 model of their de-quantized values does: the same
    values, summed in the same order by the step kernel; a prefill of more than 16 tokens
    multiplies by oneDNN's prepacked copy of the blocks' values, summed in another order."""
    engine = Engine.load(str(checkpoint), weights="q8", max_draft=6, exit_policy="fixed")
    assert engine.target.model.weight_format == "q8_0"
    params = SamplingParams(max_tokens=24)
    plain = engine.generate(PROMPT, params, drafter="none")
    spec = engine.generate(PROMPT, params, drafter="ngram")
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0
    # The float32 reference: the q8 model's state dict is its blocks' values.
    state = engine.target.model.state_dict()
    del state["lm_head.weight"]  # tied, as the checkpoint stores it
    ref_dir = tmp_path / "dequantized"
    ref_dir.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(ref_dir / "model.safetensors"))
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (ref_dir / name).write_bytes((checkpoint / name).read_bytes())
    ref = models.load_target(str(ref_dir), weights="f32")
    assert ref.model.weight_format == "f32"
    q8 = models.load_target(str(checkpoint), weights="q8")
    ids = [Engine(t).generate(PROMPT, params, drafter="none").token_ids for t in (q8, ref)]
    assert ids[0] == ids[1]
    torch.testing.assert_close(logits(q8, PROMPT), logits(ref, PROMPT), rtol=1e-5, atol=1e-5)


def test_blocks_need_the_lean_forward_in_float32(checkpoint, monkeypatch):
    with pytest.raises(BadInputError, match=r"--weights q8 computes in float32.*bfloat16"):
        models.load_target(str(checkpoint), weights="q8", dtype="bfloat16")
    with pytest.raises(BadInputError, match="transformers model"):
        models.load(str(checkpoint), weights="q4", lean=False)
    with pytest.raises(BadInputError, match="tiny model"):
        models.load_target("tiny", weights="q8")
    monkeypatch.setenv("SPECD_FASTPATH", "0")
    with pytest.raises(BadInputError, match="SPECD_FASTPATH=0"):
        models.load_target(str(checkpoint), weights="bf16")
    # auto on a safetensors model loads as it always has: here a transformers model
    assert stored.format_of(models.load_target(str(checkpoint)).model) == "f32"


def test_auto_loads_a_gguf_model_the_lean_forward_cannot_run_as_float32(
    tmp_path, monkeypatch, caplog
):
    """A GGUF alias whose converted configuration the lean forward does not run (here
    rotary embeddings it does not compute) loads its float32 copy, saying why in one line."""
    alias = "test-gguf-linear-rope"
    source = models.GGUFSource("specd-test-absent", "absent.gguf", "nothing to install")
    monkeypatch.setitem(models.ALIASES, alias, source)
    monkeypatch.setenv("SPECD_CACHE_DIR", str(tmp_path))
    where = tmp_path / "models" / alias  # as if converted already
    where.mkdir(parents=True)
    model = hf_model("llama-tied")
    model.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    model.save_pretrained(where)
    write_tokenizer(where)
    with caplog.at_level("INFO", logger="specd.forward.models"):
        target = models.load_target(alias)
    assert stored.format_of(target.model) == "f32"
    lines = [r.getMessage() for r in caplog.records if r.name == "specd.forward.models"]
    assert len(lines) == 1 and "float32 copy" in lines[0] and "'linear'" in lines[0]
    with pytest.raises(BadInputError, match="--weights q8 needs specd's lean forward"):
        models.load_target(alias, weights="q8")


def test_prefill_dtype_and_packed_weights_are_refused_with_blocks(checkpoint):
    with pytest.raises(BadInputError, match=r"--prefill-dtype bfloat16.*q8_0 blocks"):
        Engine.load(str(checkpoint), weights="q8", prefill_dtype="bfloat16")
    with pytest.raises(BadInputError, match=r"--packed-weights on.*q4_1 blocks"):
        Engine.load(str(checkpoint), weights="q4", packed_weights="on")
    # the daemon's default packs where faster: nothing to pack with blocks
    engine = Engine.load(str(checkpoint), weights="q4", packed_weights="auto")
    assert engine.target.fast is None or not engine.target.fast._packed


def test_the_bench_report_names_the_weights(checkpoint):
    from specd.bench.harness import machine_info
    from specd.bench.probe import TargetSpec

    target = TargetSpec(model=str(checkpoint), weights="q8").load()  # what each probe loads
    assert target.model.weight_format == "q8_0"
    assert machine_info(target)["weights"] == "q8_0"
    assert machine_info(models.load_target("tiny"))["weights"] == "f64"


@pytest.mark.slow
def test_the_default_model_keeps_its_blocks(monkeypatch):
    """``auto`` on the default model reads the GGUF file's blocks, not the float32 copy's
    matrices; ``f32`` reads that copy, whose values the blocks hold exactly."""
    alias = models.DEFAULT_MODEL
    where = models.converted_dir(alias)  # converted (once) before the check below
    import safetensors

    opened: list[str] = []
    real_open = safetensors.safe_open
    monkeypatch.setattr(
        safetensors, "safe_open", lambda f, *a, **k: opened.append(f) or real_open(f, *a, **k)
    )
    lm, _ = models.load(alias)
    assert opened == []
    assert lm.weight_format == "q4_1+q8_0"
    layer = lm.get_decoder().layers[0]
    assert isinstance(layer.self_attn.q_proj.weight, BlockWeight)
    assert layer.self_attn.q_proj.weight.fmt.name == "q4_1"
    embed = lm.get_decoder().embed_tokens.weight
    assert embed.fmt.name == "q8_0" and lm.get_output_embeddings().weight is embed
    dense, _ = models.load(alias, weights="f32")
    assert opened and all(Path(f).parent == where for f in opened)
    assert dense.weight_format == "f32"
    assert isinstance(dense.get_decoder().layers[0].self_attn.q_proj.weight, torch.nn.Parameter)
    assert lm.weight_bytes * 5 < dense.weight_bytes
    # the blocks as stored are the values the float32 copy was converted to (q and k rows
    # put back in Hugging Face's order)
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj"):
        got = layer.get_submodule(name).weight.dequantize()
        want = dense.get_decoder().layers[0].get_submodule(name).weight
        assert torch.equal(got, want), name
    assert torch.equal(embed[:64], dense.get_decoder().embed_tokens.weight[:64])


@pytest.mark.skipif(not cpu_kernels.available(), reason=f"no CPU kernels: {cpu_kernels.reason}")
def test_a_short_prompt_on_blocks_prefills_through_the_step_kernel(tmp_path, monkeypatch):
    """On blocks, a short prompt runs as passes of 16 tokens of the step kernel (any other
    pass multiplies by a float32 copy of every weight), and fills the cache with what the
    eager prefill writes, to float32 rounding (the step's products decoded to floats)."""
    monkeypatch.setenv("SPECD_INT8_PRODUCTS", "off")
    from test_lean_load import VOCAB
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True,
    )  # fmt: skip
    LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path)  # 16-wide heads: the kernel's
    write_tokenizer(tmp_path)
    checkpoint = tmp_path
    stepped = models.load_target(str(checkpoint), weights="q8")
    step = stepped.compile("on", backend="kernel")
    assert step is not None and step.ready, step and step.reason
    eager = models.load_target(str(checkpoint), weights="q8")
    caches = []
    for target in (stepped, eager):
        cache = target.new_cache()
        target.prefill(cache, PROMPT)
        caches.append(cache)
        out = target.forward(cache, [PROMPT[0]], eager=True).logits
        caches.append(out)
    assert step.served == -(-len(PROMPT) // 16)  # every prefill pass ran the kernel
    assert caches[0].length == caches[2].length == len(PROMPT) + 1
    assert torch.allclose(caches[1], caches[3], rtol=1e-4, atol=1e-4)
    long = list(range(300))
    assert stepped._prefill_steps(len(PROMPT)) and not stepped._prefill_steps(len(long))
    assert not eager._prefill_steps(len(PROMPT))  # no kernel step compiled
