"""llama.cpp as a baseline: its configuration names, the runner (fed specd's token ids, timed
per forward pass, an empty KV cache per prompt), the skip when the binding is missing, and
the ratios to it; with a fake ``llama_cpp`` module, and once with the real binding."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from specd.bench import configs, harness, llamacpp, render
from specd.bench import report as report_mod
from specd.bench.configs import Config
from specd.bench.runners import Run, Runner
from specd.bench.workloads import Prompt
from specd.errors import BadInputError

VOCAB = 64
EOS = 50
PREFILL_S = 1.0  # the fake clock: a forward pass costs 1 s plus 0.1 s per token it reads
PER_TOKEN_S = 0.1


def rule(ctx: list[int]) -> int:
    """The fake model's greedy next token."""
    return (ctx[-1] + 1) % VOCAB


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class FakeLookup:
    """Proposes the rule's next tokens with the third one wrong: two accepted per pass."""

    def __init__(self, max_ngram_size: int = 2, num_pred_tokens: int = 10) -> None:
        self.num_pred_tokens = num_pred_tokens

    def __call__(self, input_ids, /, **kwargs):
        ctx, out = list(input_ids), []
        for i in range(self.num_pred_tokens):
            tok = rule(ctx + out)
            out.append(tok if i != 2 else (tok + 5) % VOCAB)
        return np.array(out, dtype=np.intc)


class FakeLlama:
    """Follows ``llama_cpp.Llama.generate``: it keeps the longest prefix its cache shares with
    a new prompt unless ``reset`` emptied it, evaluates a pass through ``self.eval`` and, with
    a draft model, checks the draft in the same pass."""

    made: list[FakeLlama] = []
    clock = FakeClock()

    def __init__(self, model_path: str, **kwargs) -> None:
        self.model_path = model_path
        self.kwargs = kwargs
        self.draft_model = kwargs.get("draft_model")
        self.input_ids: list[int] = []
        self.n_tokens = 0
        self.prompts: list[list[int]] = []
        self.reused: list[int] = []
        FakeLlama.made.append(self)

    def n_ctx(self) -> int:
        return self.kwargs["n_ctx"]

    def n_vocab(self) -> int:
        return VOCAB

    def reset(self) -> None:
        self.n_tokens = 0

    def eval(self, tokens) -> None:
        self.clock.now += PREFILL_S + PER_TOKEN_S * len(tokens)
        self.input_ids = self.input_ids[: self.n_tokens] + list(tokens)
        self.n_tokens = len(self.input_ids)
        rows = self.n_ctx() if self.kwargs["logits_all"] else self.kwargs["n_batch"]
        if self.draft_model is not None and self.n_tokens > rows:
            # the binding writes every position's logits when it speculates
            raise ValueError("could not broadcast input array into the logits buffer")
        assert self.n_tokens <= self.n_ctx(), "the context overflowed"

    def generate(self, tokens, top_k=40, temp=0.8, repeat_penalty=1.1, **kw):
        assert (top_k, temp, repeat_penalty) == (1, 0.0, 1.0), "not greedy"
        tokens = list(tokens)
        self.prompts.append(list(tokens))
        if self.n_tokens > 0:  # the binding's prefix reuse
            n = 0
            while n < min(self.n_tokens, len(tokens) - 1) and self.input_ids[n] == tokens[n]:
                n += 1
            self.n_tokens = n
            tokens = tokens[n:]
        self.reused.append(self.n_tokens)
        draft: list[int] = []
        while True:
            self.eval(tokens + draft)
            ctx = self.input_ids[: self.n_tokens - len(draft)]
            accepted = 0
            for d in [*draft, None]:
                y = rule(ctx)
                yield y
                ctx.append(y)
                if y != d:
                    break
                accepted += 1
            self.n_tokens = self.n_tokens - len(draft) + accepted
            tokens = [ctx[-1]]
            draft = []
            if self.draft_model is not None:
                ids = np.array(self.input_ids[: self.n_tokens] + tokens, dtype=np.intc)
                draft = [int(t) for t in self.draft_model(ids)]


@pytest.fixture
def fake(monkeypatch):
    """A fake ``llama_cpp`` in ``sys.modules`` and a fake clock for the runner."""
    mod = types.ModuleType("llama_cpp")
    mod.Llama = FakeLlama
    spec = types.ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = FakeLookup
    mod.llama_speculative = spec
    monkeypatch.setitem(sys.modules, "llama_cpp", mod)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)
    FakeLlama.made = []
    FakeLlama.clock = FakeClock()
    monkeypatch.setattr(llamacpp, "time", FakeLlama.clock)
    return mod


def runner(tmp_path, longest=0) -> llamacpp.LlamaCppRunner:
    return llamacpp.LlamaCppRunner(
        tmp_path / "m.gguf", eos_token_ids={EOS}, vocab_size=VOCAB, longest=longest
    )


# -- names ------------------------------------------------------------------------------------


def test_llamacpp_names_parse():
    assert configs.parse("llamacpp-plain") == Config("llamacpp-plain", "llamacpp")
    lookup = configs.parse("llamacpp-lookup")
    assert (lookup.kind, lookup.prompt_lookup_tokens) == ("llamacpp", 10)
    assert configs.parse("llamacpp-lookup-2").prompt_lookup_tokens == 2
    names, _ = configs.default_names()
    assert {"llamacpp-plain", "llamacpp-lookup"} <= set(names)


@pytest.mark.parametrize(
    "name, says",
    [
        ("llamacpp-lookup-0", "at least 1 token"),
        ("llamacpp-ngram", "llamacpp-lookup[-N]"),
        ("llamacpp-lookup-x", "llamacpp-plain"),
        ("llamacpp-plain-2", "unknown llama.cpp configuration 'llamacpp-plain-2'"),
    ],
)
def test_bad_llamacpp_names_are_refused(name, says):
    with pytest.raises(BadInputError) as e:
        configs.parse(name)
    assert says in str(e.value)


# -- the runner -------------------------------------------------------------------------------


def test_runner_feeds_the_ids_and_times_each_pass(fake, tmp_path):
    r = runner(tmp_path)
    prompt = Prompt("p", [3, 9, 10], max_tokens=5)
    run = r.run(configs.parse("llamacpp-plain"), prompt)
    (llm,) = FakeLlama.made
    assert llm.prompts == [[3, 9, 10]]  # specd's ids, as they are
    assert run.token_ids == [11, 12, 13, 14, 15]
    assert run.steps == 5 and run.events == [
        pytest.approx((PREFILL_S + 3 * PER_TOKEN_S, 1)),
        *[pytest.approx((PREFILL_S + PER_TOKEN_S, 1))] * 4,
    ]
    assert run.ttft_s == pytest.approx(1.3)
    assert run.total_s == pytest.approx(1.3 + 4 * 1.1)
    assert run.token_gaps() == pytest.approx([1.1] * 4)
    kw = llm.kwargs
    assert kw["n_threads"] == kw["n_threads_batch"] == torch.get_num_threads()
    assert kw["n_batch"] == 512 and kw["verbose"] is False and kw["draft_model"] is None
    assert kw["n_ctx"] >= 3 + 5
    assert llm.model_path == str(tmp_path / "m.gguf")


def test_runner_stops_before_eos(fake, tmp_path):
    run = runner(tmp_path).run(configs.parse("llamacpp-plain"), Prompt("p", [44], 20))
    assert run.token_ids == [45, 46, 47, 48, 49]  # then 50, the EOS, not reported


def test_lookup_groups_the_tokens_of_one_pass(fake, tmp_path):
    run = runner(tmp_path).run(configs.parse("llamacpp-lookup-4"), Prompt("p", [1, 2], 9))
    (llm,) = FakeLlama.made
    assert llm.draft_model.num_pred_tokens == 4
    assert run.token_ids == list(range(3, 12))
    # the prompt's pass gives one token; each pass after it two drafts and the correction
    assert [n for _, n in run.events] == [1, 3, 3, 2]
    assert run.steps == 4 and run.accepted == 9 - 4
    assert run.drafted == 3 * 4
    assert run.events[1][0] == pytest.approx(PREFILL_S + 5 * PER_TOKEN_S)  # 1 + 4 drafts


def test_lookup_takes_a_prompt_longer_than_a_batch(fake, tmp_path):
    prompt = Prompt("long", [i % 40 for i in range(700)], 4)
    run = runner(tmp_path).run(configs.parse("llamacpp-lookup"), prompt)
    assert run.new_tokens == 4
    (llm,) = FakeLlama.made
    assert llm.kwargs["n_ctx"] >= 704 and llm.kwargs["n_batch"] == 512


def test_each_prompt_starts_with_an_empty_cache(fake, tmp_path):
    """The binding keeps the prefix a new prompt shares with the last one; a bench run must
    not (no other configuration does), or its TTFT reads only the new tokens."""
    r = runner(tmp_path)
    cfg = configs.parse("llamacpp-plain")
    first = r.run(cfg, Prompt("a", [5, 6, 7, 8], 3))
    second = r.run(cfg, Prompt("b", [5, 6, 7, 9], 3))
    (llm,) = FakeLlama.made  # loaded once
    assert llm.reused == [0, 0]
    assert first.ttft_s == pytest.approx(second.ttft_s)


def test_a_longer_prompt_reloads_with_room_for_it(fake, tmp_path):
    r = runner(tmp_path, longest=8)
    cfg = configs.parse("llamacpp-lookup")
    r.run(cfg, Prompt("a", [1, 2], 4))
    r.run(cfg, Prompt("b", list(range(40)), 4))
    assert len(FakeLlama.made) == 2
    assert FakeLlama.made[1].kwargs["n_ctx"] >= 44 + 10  # the prompt, new tokens, a draft
    assert set(r.load_s) == {"llamacpp-lookup"}


def test_a_file_with_another_vocabulary_is_refused(fake, tmp_path):
    r = llamacpp.LlamaCppRunner(tmp_path / "m.gguf", eos_token_ids={EOS}, vocab_size=VOCAB + 1)
    with pytest.raises(ValueError, match="64 tokens, the target 65"):
        r.run(configs.parse("llamacpp-plain"), Prompt("p", [1], 2))


# -- skipped ----------------------------------------------------------------------------------


def test_import_failure_is_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    why = llamacpp.unavailable("smollm2-135m")
    assert why is not None and "specd[llamacpp]" in why and "import of llama_cpp halted" in why
    assert llamacpp.unavailable("tiny") == "llama.cpp runs GGUF files; tiny is not one"


def _bench(target, names):
    prompts = [Prompt("p", [1, 2, 3, 1, 2], 4)]
    cfgs, _ = configs.resolve(names)
    opts = harness.BenchOptions(rss="off", floor=False, prefix=False, progress=False)
    return harness.run("humaneval", prompts, cfgs, target, None, opts)


def test_bench_skips_llamacpp_with_the_reason_and_goes_on(tiny, monkeypatch, one_thread):
    rep = _bench(tiny, ["llamacpp-plain", "llamacpp-lookup"])
    assert [r["config"] for r in rep["results"]] == ["hf-plain", "hf-prompt-lookup", "specd-plain"]
    assert rep["skipped"] == [
        {"config": c, "reason": "llama.cpp runs GGUF files; tiny is not one"}
        for c in ("llamacpp-plain", "llamacpp-lookup")
    ]
    monkeypatch.setattr(tiny, "name", "smollm2-135m")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    rep = _bench(tiny, ["llamacpp-plain"])
    (skip,) = rep["skipped"]
    assert skip["config"] == "llamacpp-plain" and "import of llama_cpp halted" in skip["reason"]
    assert len(rep["results"]) == 3


def test_bench_runs_llamacpp_beside_the_others(tiny, fake, monkeypatch, one_thread, tmp_path):
    monkeypatch.setattr(tiny, "name", "smollm2-135m")
    monkeypatch.setattr(tiny, "vocab_size", VOCAB)
    monkeypatch.setattr(llamacpp, "model_file", lambda model: tmp_path / "m.gguf")
    rep = _bench(tiny, ["llamacpp-plain", "llamacpp-lookup-2"])
    rows = {r["config"]: r for r in rep["results"]}
    assert rows["llamacpp-plain"]["new_tokens"] == 4 and rows["llamacpp-plain"]["load_s"] >= 0
    assert rows["llamacpp-lookup-2"]["speedup_vs_llamacpp_plain"] is not None
    assert rows["specd-plain"]["best_llamacpp_speculation"] == "llamacpp-lookup-2"
    assert rep["skipped"] == []
    assert "× llama.cpp plain" in render.markdown(rep)


# -- the ratios -------------------------------------------------------------------------------


def _runs(secs: float, tokens: list[int]) -> list[Run]:
    return [Run(token_ids=tokens, total_s=secs, ttft_s=secs / 4, events=[], steps=len(tokens))]


def test_ratios_to_llamacpp_plain_and_its_best_speculation():
    names = ["hf-plain", "hf-prompt-lookup", "specd-plain", "llamacpp-plain"]
    names += ["llamacpp-lookup", "llamacpp-lookup-2"]
    cfgs = [configs.parse(n) for n in names]
    same = [1, 2, 3, 4, 5, 6, 7, 8]
    runs = {
        "hf-plain": _runs(8.0, same),
        "hf-prompt-lookup": _runs(4.0, same),
        "specd-plain": _runs(2.0, same),
        "llamacpp-plain": _runs(4.0, [1, 2, 3, 9, 5, 6, 7, 8]),
        "llamacpp-lookup": _runs(5.0, same),  # slower than lookup-2: not the best
        "llamacpp-lookup-2": _runs(1.0, same),
    }
    rows = {
        r["config"]: r for r in report_mod.aggregate(cfgs, runs, load_s={"llamacpp-plain": 0.5})
    }
    assert rows["specd-plain"]["speedup_vs_llamacpp_plain"] == pytest.approx(2.0)
    assert rows["specd-plain"]["best_llamacpp_speculation"] == "llamacpp-lookup-2"
    assert rows["specd-plain"]["speedup_vs_best_llamacpp_speculation"] == pytest.approx(0.5)
    assert rows["llamacpp-plain"]["load_s"] == 0.5
    assert rows["llamacpp-plain"]["identical_rate_vs_specd_plain"] == 0.0
    assert rows["llamacpp-plain"]["common_prefix_vs_specd_plain"] == pytest.approx(3 / 8)
    assert rows["llamacpp-lookup-2"]["common_prefix_vs_specd_plain"] == 1.0
    assert "speedup_vs_llamacpp_plain" in rows["hf-plain"]
    md = render.markdown({"workload": "w", "machine": {}, "results": list(rows.values())})
    assert "× llamacpp-lookup-2" in md and "| specd-plain | 4.0 | 2.00 | 0.50 |" in md


# -- the real binding -------------------------------------------------------------------------


@pytest.mark.slow
def test_the_real_binding_runs_the_default_model(real_engine, capsys):
    why = llamacpp.import_error()
    if why is not None:
        pytest.skip(why)
    target = real_engine.target
    text = "def fibonacci(n):\n    if n < 2:\n        return n\n"
    ids = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = Prompt("code", list(ids), 8)
    r = Runner(target)
    ours = r.run(configs.parse("specd-plain"), prompt)
    theirs = r.run(configs.parse("llamacpp-plain"), prompt)
    assert 0 < theirs.new_tokens <= 8 and theirs.steps == theirs.new_tokens
    agree = 0
    while agree < min(ours.new_tokens, theirs.new_tokens) and (
        ours.token_ids[agree] == theirs.token_ids[agree]
    ):
        agree += 1
    with capsys.disabled():
        print(f"\nllama.cpp agrees with specd plain on its first {agree} of 8 tokens")
