"""A checkpoint and a tokenizer loaded without transformers compute and encode what
transformers' own loading does; whatever they cannot serve is left to transformers."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specd.forward import lean_model, models, tokenizer
from specd.forward.lean_model import LeanCausalLM
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer

VOCAB = 300
CORPUS = Path(sysconfig.get_paths()["stdlib"])
TEXT = (CORPUS / "functools.py").read_text(encoding="utf-8")[:20000]


def hf_model(arch: str):
    """A small random transformers model: llama, llama-tied, llama-bias (attention biases)
    or qwen2 (query/key/value biases, tied)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(7)
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape, tie_word_embeddings=True)).eval()
    cfg = LlamaConfig(
        **shape,
        tie_word_embeddings=arch == "llama-tied",
        attention_bias=arch == "llama-bias",
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    return LlamaForCausalLM(cfg).eval()


def write_tokenizer(where: Path) -> None:
    """A byte-level BPE tokenizer trained on Python source, as ``tokenizer.json`` with a
    ``tokenizer_config.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer)
    tok.save(str(where / "tokenizer.json"))
    config = {"tokenizer_class": "TokenizersBackend", "bos_token": "<s>", "eos_token": "</s>"}
    config |= {"pad_token": "</s>", "unk_token": "<|endoftext|>"}
    (where / "tokenizer_config.json").write_text(json.dumps(config))


def checkpoint(tmp_path: Path, arch: str = "llama"):
    model = hf_model(arch)
    model.save_pretrained(tmp_path)
    write_tokenizer(tmp_path)
    return model


def edit_config(where: Path, **changes) -> None:
    path = where / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    path.write_text(json.dumps(cfg))


def ids_of(text: str, n: int = 40) -> list[int]:
    return [(ord(c) * 7) % VOCAB for c in text[:n]]


@pytest.mark.parametrize("arch", ["llama", "llama-tied", "llama-bias", "qwen2"])
def test_lean_model_computes_what_the_transformers_model_computes(tmp_path, arch):
    hf = checkpoint(tmp_path, arch)
    lean = lean_model.load(tmp_path, torch.float32)
    assert isinstance(lean, LeanCausalLM)
    # the same tensors under the same names (EAGLE heads hash them by name)
    want, got = hf.state_dict(), lean.state_dict()
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    ids = ids_of(TEXT)
    lean_t = Target(lean, CharTokenizer(VOCAB))
    fast_t = Target(hf, CharTokenizer(VOCAB))  # transformers' model, the lean forward
    own_t = Target(hf, CharTokenizer(VOCAB), fast=False)  # transformers' own forward
    outs = []
    for t in (lean_t, fast_t, own_t):
        cache = t.new_cache()
        first = t.forward(cache, ids[:30]).logits  # [30, V]
        tree = t.forward(cache, ids[30:36], parents=[-1, 0, 0, 1, 3, -1]).logits
        outs.append(torch.cat([first, tree]))
    assert torch.equal(outs[0], outs[1])  # the same arithmetic on the same weights
    torch.testing.assert_close(outs[0], outs[2], rtol=1e-5, atol=1e-5)
    assert lean_t.eos_token_ids == fast_t.eos_token_ids
    assert lean_t.max_positions == fast_t.max_positions == 512


def test_weights_convert_to_the_requested_dtype_and_stay_tied(tmp_path):
    checkpoint(tmp_path, "llama-tied")
    lean = lean_model.load(tmp_path, torch.float64)
    assert lean is not None
    assert {p.dtype for p in lean.parameters()} == {torch.float64}
    assert lean.get_output_embeddings().weight is lean.get_input_embeddings().weight


def test_the_transformers_model_of_a_lean_one_shares_its_weights(tmp_path):
    hf = checkpoint(tmp_path, "llama-tied")
    lean = lean_model.load(tmp_path, torch.float32)
    built = lean_model.transformers_model(lean)
    assert type(built) is type(hf)
    assert lean_model.transformers_model(lean) is built  # built once
    assert lean_model.transformers_model(hf) is hf
    ptrs = {n: p.data_ptr() for n, p in lean.state_dict().items()}
    assert {n: p.data_ptr() for n, p in built.state_dict().items()} == ptrs
    ids = torch.tensor([ids_of(TEXT)])
    with torch.inference_mode():
        assert torch.equal(built(ids).logits, hf(ids).logits)
        a = built.generate(ids, max_new_tokens=8, do_sample=False)
        b = hf.generate(ids, max_new_tokens=8, do_sample=False)
    assert torch.equal(a, b)
    # a target that must not run the lean forward runs transformers' model
    assert Target(lean, CharTokenizer(VOCAB), fast=False).model is built
    assert Target(lean, CharTokenizer(VOCAB)).hf_model() is built


def test_models_load_is_lean_on_the_cpu_unless_told_otherwise(tmp_path, monkeypatch):
    checkpoint(tmp_path)
    lm, tok = models.load(str(tmp_path), device="cpu")
    assert isinstance(lm, LeanCausalLM) and isinstance(tok, tokenizer.Tokenizer)
    lm, _ = models.load(str(tmp_path), device="cpu", lean=False)
    assert not isinstance(lm, LeanCausalLM)
    monkeypatch.setenv("SPECD_FASTPATH", "0")
    lm, _ = models.load(str(tmp_path), device="cpu")
    assert not isinstance(lm, LeanCausalLM)


def test_the_benchs_transformers_baselines_run_on_a_lean_target(tmp_path):
    from specd.bench import configs
    from specd.bench.runners import Runner
    from specd.bench.workloads import Prompt

    checkpoint(tmp_path, "llama-tied")
    target = models.load_target(str(tmp_path), device="cpu")
    assert isinstance(target.model, LeanCausalLM)
    prompt = Prompt("p", ids_of(TEXT, 20), 12)
    runner = Runner(target)
    hf = runner.run(configs.parse("hf-plain"), prompt)
    plain = runner.run(configs.parse("specd-plain"), prompt)
    assert hf.token_ids == plain.token_ids and len(hf.token_ids) == 12
    assert runner.run(configs.parse("hf-prompt-lookup"), prompt).token_ids == hf.token_ids


@pytest.mark.parametrize(
    "change",
    [
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
        {"rms_norm_eps": None},
        {"model_type": "gpt2"},
        {"hidden_act": "gelu"},
        {"layer_types": ["sliding_attention", "full_attention"]},
        {"auto_map": {"AutoModelForCausalLM": "modeling.Custom"}},
    ],
    ids=["rope-scaling", "missing-key", "architecture", "activation", "layer-types", "own-code"],
)
def test_what_the_lean_forward_does_not_run_is_left_to_transformers(tmp_path, change):
    checkpoint(tmp_path)
    edit_config(tmp_path, **change)
    assert lean_model.load(tmp_path, torch.float32) is None


def test_a_checkpoint_with_other_tensors_is_left_to_transformers(tmp_path):
    checkpoint(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    assert lean_model.load(tmp_path, torch.float32) is None
    (tmp_path / "model.safetensors").unlink()
    assert lean_model.load(tmp_path, torch.float32) is None  # no safetensors at all


def test_a_sharded_checkpoint_loads(tmp_path):
    hf = checkpoint(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(weights)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: weights[k] for k in keys}, tmp_path / file, metadata={"format": "pt"})
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    lean = lean_model.load(tmp_path, torch.float32)
    assert lean is not None
    assert all(torch.equal(lean.state_dict()[k], v) for k, v in hf.state_dict().items())


# -- the tokenizer -----------------------------------------------------------------------------


def assert_same_tokenizer(ours, theirs, texts: list[str]) -> None:
    for text in texts:
        for special in (False, True):
            want = theirs(text, add_special_tokens=special)["input_ids"]
            assert ours(text, add_special_tokens=special)["input_ids"] == want, text
        for skip in (False, True):
            assert ours.decode(want, skip_special_tokens=skip) == theirs.decode(
                want, skip_special_tokens=skip
            )
    assert ours.get_vocab() == theirs.get_vocab()
    assert (len(ours), ours.vocab_size) == (len(theirs), theirs.vocab_size)
    every = list(range(len(theirs)))
    assert ours.convert_ids_to_tokens(every) == theirs.convert_ids_to_tokens(every)
    assert ours.convert_ids_to_tokens(5) == theirs.convert_ids_to_tokens(5)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.all_special_ids == theirs.all_special_ids
    assert sorted(ours.added_tokens_decoder) == sorted(theirs.added_tokens_decoder)


def test_tokenizer_encodes_and_decodes_as_transformers_does(tmp_path):
    from transformers import AutoTokenizer

    write_tokenizer(tmp_path)
    ours = tokenizer.load(tmp_path)
    assert ours is not None
    texts = TEXT.splitlines(keepends=True)[:300] + ["<s>def f():</s>", "  \t\n", "é€😀"]
    assert_same_tokenizer(ours, AutoTokenizer.from_pretrained(tmp_path), texts)


@pytest.mark.parametrize(
    "change",
    [
        {"tokenizer_class": "LlamaTokenizer"},
        {"add_bos_token": True},
        {"bos_token": "<not-in-the-vocabulary>"},
        {"clean_up_tokenization_spaces": True},
        {"auto_map": {"AutoTokenizer": ["x.Tok", None]}},
    ],
    ids=["model-class", "adds-bos", "unknown-special", "cleans-up", "remote-code"],
)
def test_tokenizers_it_cannot_match_are_left_to_transformers(tmp_path, change):
    write_tokenizer(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    assert tokenizer.load(tmp_path) is None


def test_no_tokenizer_json_is_left_to_transformers(tmp_path):
    write_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    assert tokenizer.load(tmp_path) is None


# -- the default model -------------------------------------------------------------------------

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\ndef main():\n",
    (CORPUS / "json" / "__init__.py").read_text(encoding="utf-8")[:1500],
]


@pytest.mark.slow
def test_default_tokenizer_matches_transformers_on_the_standard_library():
    from transformers import AutoTokenizer

    where = models.resolve(models.DEFAULT_MODEL)
    ours, theirs = tokenizer.load(where), AutoTokenizer.from_pretrained(where)
    assert ours is not None
    files = sorted(f for f in CORPUS.rglob("*.py") if "site-packages" not in f.parts)[:200]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    lines = [line for text in texts for line in text.splitlines(keepends=True)]
    assert len(files) == 200 and len(lines) > 50_000
    for batch in (texts, lines, ["<|im_start|>user\nhi<|im_end|>\n", "é€😀 \t"]):
        want = theirs(batch, add_special_tokens=False)["input_ids"]
        got = [ours(text, add_special_tokens=False)["input_ids"] for text in batch]
        assert got == want
        assert [ours.decode(ids) for ids in got] == theirs.batch_decode(want)
        skipped = theirs.batch_decode(want, skip_special_tokens=True)
        assert [ours.decode(ids, skip_special_tokens=True) for ids in got] == skipped
    assert_same_tokenizer(ours, theirs, PROMPTS)


@pytest.mark.slow
def test_default_model_loads_lean_and_decodes_as_transformers_does():
    target = models.load_target(dtype="float32", device="cpu")
    assert isinstance(target.model, LeanCausalLM)
    assert isinstance(target.tokenizer, tokenizer.Tokenizer)
    hf, _ = models.load(models.DEFAULT_MODEL, dtype="float32", device="cpu", lean=False)
    eos = target.eos_token_ids
    for prompt in PROMPTS:
        ids = target.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        cache = target.new_cache()
        logits = target.forward(cache, ids).logits  # [T, V]
        with torch.inference_mode():
            want = hf(torch.tensor([ids])).logits[0]
            out = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
        # float32 rounding: a prefill on blocks multiplies by oneDNN's prepacked copy of
        # their values, transformers by MKL's products, each summing in its own order
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=2e-4)
        greedy = []
        while len(greedy) < 16 and not (greedy and greedy[-1] in eos):
            greedy.append(int(logits[-1].argmax()))
            logits = target.forward(cache, greedy[-1:]).logits
        assert greedy == out[0, len(ids) :].tolist(), prompt


WATCH = """
import builtins, json, sys
importers = set()
load = builtins.__import__


def watch(name, globals=None, *args, **kwargs):
    caller = (globals or {}).get("__name__", "?")
    if name.split(".")[0] == "transformers" and not caller.startswith("transformers"):
        importers.add(caller)
    return load(name, globals, *args, **kwargs)


builtins.__import__ = watch
from specd.cli import main

rc = main(["generate", "def fibonacci(n):", "--max-tokens", "1"])
print(json.dumps({"rc": rc, "importers": sorted(importers), "loaded": "transformers" in sys.modules}))
"""


@pytest.fixture(scope="module")
def generate_imports() -> dict:
    """What ``specd generate "def fibonacci(n):" --max-tokens 1`` imported, run once."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", WATCH], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0, run.stderr[-2000:]
    return report


@pytest.mark.slow
def test_generate_does_not_import_transformers(generate_imports):
    """Loading the default model and its tokenizer and generating through the lean forward
    import nothing from transformers (the KV cache's transformers adapter is built only for
    a transformers forward)."""
    assert not generate_imports["importers"]
    assert not generate_imports["loaded"]
