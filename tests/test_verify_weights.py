"""``specd verify --weights``: the drafter's checks on a conformance target whose matrices are
quantized blocks. The target really holds blocks of the chosen format in every matrix, its
law is enumerated from those blocks, every engine check gets that one target, the report
names the format, and a planted bug still fails on it."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from specd import BadInputError, cli
from specd.conformance import drafter_checks, suite
from specd.conformance import engine_checks as ec
from specd.conformance.engine_scenarios import (
    TARGET_LOGIT_SCALE,
    VOCAB,
    WEIGHTS,
    conformance_prompt,
    sequence_law,
)
from specd.forward import weights as stored
from specd.forward.blocks import BlockWeight
from specd.forward.target import Target
from specd.forward.tiny import (
    BLOCKS_HIDDEN,
    CharTokenizer,
    tiny_blocks_target,
    tiny_model,
    tiny_target,
)
from specd.kvcache import KVCache
from specd.registry import get_plugin_manager
from specd.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")

#: Draft calls per q-honesty setting: as many as tests/verify/test_verify_command.py uses.
QUICK_Q_CALLS = 500


def verify(capsys, *args: str) -> tuple[int, dict]:
    code = cli.main(["verify", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def load_broken_plugin() -> ModuleType:
    """tests/verify/broken_plugin.py: the suite's deliberately broken verifiers and drafter."""
    path = Path(__file__).parent / "verify" / "broken_plugin.py"
    spec = importlib.util.spec_from_file_location("verify_weights_broken_plugin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def broken():
    """The broken plugins, installed for one test."""
    module = load_broken_plugin()
    pm = get_plugin_manager()
    pm.register(module, name="specd-verify-weights-broken")
    yield module
    pm.unregister(module)


@pytest.fixture(scope="module")
def q4():
    return ec.conformance_target("q4")


@pytest.fixture(scope="module")
def f64():
    """The q4 target's model in float64 (the blocks' model is wider than the f32 one)."""
    return tiny_target(VOCAB, seed=0, hidden_size=BLOCKS_HIDDEN, logit_scale=TARGET_LOGIT_SCALE)


def logits(target, tokens: list[int]) -> torch.Tensor:
    return target.forward(target.new_cache(), tokens).logits  # [T, V]


@pytest.mark.parametrize("choice", [c for c in WEIGHTS if c != "f32"])
def test_a_quantized_target_holds_blocks_of_its_format_in_every_matrix(choice):
    """Every decoder projection of both layers, the embedding and the LM head: 16 matrices,
    none left a float tensor; norms stay float32."""
    target = ec.conformance_target(choice)
    found = stored.matrices(target.model)
    assert len(found) == 2 * len(stored.LAYER_MATRICES) + 2
    assert all(isinstance(w, BlockWeight) for w in found), [type(w) for w in found]
    assert {w.fmt.name for w in found} == {WEIGHTS[choice]}
    assert target.model.weight_format == WEIGHTS[choice]
    assert target.dtype == torch.float32 and target.fast is not None
    assert target.model.model.norm.weight.dtype == torch.float32
    assert target.model.generation_config.eos_token_id is None  # random text, no early stop


def test_the_default_target_is_the_float64_one():
    target = ec.conformance_target("f32")
    assert stored.format_of(target.model) == WEIGHTS["f32"] == "f64"
    assert target.dtype == torch.float64


def test_the_q4_target_computes_on_its_blocks_not_the_float_weights(q4, f64):
    """Its logits differ from the float64 model's by quantization error; its eager pass's are
    those of a float32 model holding the blocks' de-quantized values, and its served passes
    (the step kernel's int8 products over the woven blocks, where the kernels run) are within
    the activations' int8 rounding of them."""
    tokens = conformance_prompt(f64)
    got, exact = logits(q4, tokens).double(), logits(f64, tokens)
    error = float((got - exact).norm() / exact.norm())
    assert 0.01 < error < 0.25, error
    same = tiny_model(VOCAB, hidden_size=BLOCKS_HIDDEN, seed=0, dtype=torch.float32)
    same.load_state_dict(q4.model.state_dict())  # blocks give their float32 values
    decoded = logits(Target(same, CharTokenizer(VOCAB)), tokens)
    float_cache = KVCache(q4.num_layers, dtype=torch.float32)  # as the float32 model's
    eager = q4.forward(float_cache, tokens, eager=True).logits
    torch.testing.assert_close(eager, decoded, rtol=1e-5, atol=1e-5)
    served = logits(q4, tokens)
    assert float((served - decoded).norm() / decoded.norm()) < 0.05


def test_the_law_is_enumerated_from_the_quantized_target(q4, f64):
    """The checks compare the engine with the law of the target it runs, not the float one."""
    params = SamplingParams(temperature=1.0, top_k=2, top_p=0.95)
    prompt = conformance_prompt(q4)
    law_q4 = sequence_law(q4, prompt, params, 2)
    law_f64 = sequence_law(f64, prompt, params, 2)
    assert abs(sum(law_q4.values()) - 1) < 1e-9
    assert max(abs(law_q4.get(k, 0.0) - law_f64.get(k, 0.0)) for k in law_q4 | law_f64) > 1e-3


def test_every_check_of_the_drafter_gets_the_chosen_target(monkeypatch):
    """q-honesty, greedy identity and the sampled laws each build their engine over the
    target ``--weights`` names, and the laws are enumerated from it (a few samples: the
    wiring is checked here, not the law)."""
    built: list[str] = []
    laws: list[str] = []
    real_target, real_law = ec.conformance_target, ec.sequence_law

    def conformance_target(weights="f32"):
        built.append(weights)
        return real_target(weights)

    def sequence_law(target, *args):
        laws.append(target.model.weight_format)
        return real_law(target, *args)

    monkeypatch.setattr(ec, "conformance_target", conformance_target)
    monkeypatch.setattr(ec, "sequence_law", sequence_law)
    monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    monkeypatch.setattr(drafter_checks, "Q_CALLS", 5)
    few = tuple(dataclasses.replace(s, samples=5) for s in ec.SCENARIOS)
    monkeypatch.setattr(ec, "engine_scenarios", lambda thorough=False: few)
    report = suite.run("ngram", weights="q4", keep_going=True)
    assert built == ["q4", "q4", "q4"]  # q-honesty, greedy identity, sampled
    assert laws == ["q4_1", "q4_1"]  # the sampled and warped scenarios
    assert {r.property for r in report.results} >= {
        "drafter/q-honesty",
        "engine/greedy-identity",
        "engine/law/sampled",
    }
    assert report.weights == "q4_1" and report.as_json()["weights"] == "q4_1"


def test_a_bad_value_is_refused_with_the_list(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["verify", "--drafter", "ngram", "--weights", "q5"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--weights" in err and "'q5'" in err
    assert all(f"'{c}'" in err for c in WEIGHTS)
    with pytest.raises(BadInputError, match="f32, bf16, q8, q4"):
        suite.run("ngram", weights="native")
    with pytest.raises(BadInputError, match="bf16, q8, q4, not 'f32'"):
        tiny_blocks_target(VOCAB, "f32")


def test_a_verifier_that_accepts_too_much_fails_on_the_q4_target(capsys, monkeypatch, broken):
    """Its own checks skipped, only the engine's on the q4 target can see it: greedy
    identity breaks at once, and the sampled law with it."""
    monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    name = broken.AlwaysAccept.name
    args = ("--drafter", "ngram", "--verifier", name, "--weights", "q4", "--keep-going")
    code, report = verify(capsys, *args)
    assert code == 1
    assert report["weights"] == "q4_1"
    failed = [r["property"] for r in report["results"] if not r["passed"]]
    assert failed == ["engine/greedy-identity", "engine/law/sampled"]
    law = next(r for r in report["results"] if r["property"] == "engine/law/sampled")
    assert law["counterexample"]["sequence"]


def test_a_drafter_that_lies_about_q_fails_on_the_q4_target(capsys, monkeypatch, broken):
    """Argmax drafted, softmax reported: its word, checked in the q4 target's contexts, fails."""
    monkeypatch.setattr(drafter_checks, "Q_CALLS", QUICK_Q_CALLS)
    monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    code, report = verify(capsys, "--drafter", broken.ArgmaxWithSoftmaxQ.name, "--weights", "q4")
    assert code == 1
    failed = [r for r in report["results"] if not r["passed"]]
    assert [r["property"] for r in failed] == [drafter_checks.PROPERTY]
    assert failed[0]["counterexample"]["setting"] != "greedy"


@pytest.mark.slow
def test_specd_verify_passes_ngram_on_q8_and_names_the_format(capsys):
    code, report = verify(capsys, "--drafter", "ngram", "--weights", "q8")
    assert code == 0, json.dumps([r for r in report["results"] if not r["passed"]], indent=1)
    assert report["passed"] and report["weights"] == "q8_0"
    assert {r["property"] for r in report["results"]} >= {
        "engine/greedy-identity",
        "engine/law/sampled",
        "engine/law/warped",
        "engine/seeded",
    }


def test_the_command_hands_the_choice_to_the_drafter_checks_and_names_it(capsys, monkeypatch):
    seen = []

    def engine_checks(drafter, options, verifiers, seed=0, thorough=False, weights="f32"):
        seen.append(weights)
        return iter(())

    def q_checks(drafter, options, modes, seed=0, thorough=False, weights="f32"):
        seen.append(("q", weights))
        return iter(())

    monkeypatch.setattr(suite, "engine_checks", engine_checks)
    monkeypatch.setattr(suite, "drafter_checks", q_checks)
    monkeypatch.setattr(suite, "verifier_checks", lambda *a, **k: iter(()))
    assert cli.main(["verify", "--drafter", "ngram", "--weights", "q8"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("on q8_0 weights")
    assert cli.main(["verify", "--drafter", "ngram"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("on f64 weights")
    assert seen == [("q", "q8"), "q8", ("q", "f32"), "f32"]
