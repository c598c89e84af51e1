"""The step backends behind one protocol (specd/forward/step.py): chosen once per load by
one function that logs its choice, the step kernel built and checked once per load, a
backend that raises turned off with the passes run eager, and no import circle in the
forward package."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
import torch
from test_step_fallback import FakeKernel, _fake_run

from specd import Engine, SamplingParams
from specd.errors import BadInputError
from specd.forward import compiled, cpu_kernels, decode_step
from specd.forward.compiled import MAKERS, CompiledStep, choose
from specd.forward.step import EagerStep, StepBackend
from specd.forward.target import Target
from specd.forward.tiny import CharTokenizer, tiny_model

FORWARD = Path(__file__).resolve().parent.parent / "specd" / "forward"
VOCAB = 40


@pytest.fixture
def counted_kernel(monkeypatch):
    """A stand-in step kernel (:class:`FakeKernel`, the eager pass) for every model, with
    its builds and checks counted: ``{"built": n, "checked": n}``."""
    monkeypatch.setattr(cpu_kernels, "MIN_TOKENS", 10**9)
    monkeypatch.setattr(decode_step, "run", _fake_run)
    counts = {"built": 0, "checked": 0}
    kernel = FakeKernel(lambda t, logits, hidden: (logits, hidden))

    def build(fast):
        counts["built"] += 1
        return kernel

    check = compiled.check

    def counted_check(*args):
        counts["checked"] += 1
        return check(*args)

    monkeypatch.setattr(decode_step, "for_decoder", build)
    monkeypatch.setattr(compiled, "check", counted_check)
    return counts


def test_the_step_kernel_is_built_and_checked_once_per_load(counted_kernel):
    """Guards against building the kernel to find out whether it takes the model, then
    again to choose it, then again to run it, and against a check repeated by later calls
    (the engine's pricing, each request)."""
    engine = Engine.load("tiny", drafter="ngram", compile="auto")
    step = engine.target.compiled
    assert step is not None and step.backend == "kernel" and step.ready
    for prompt in ("ABCABCABC", "ABCABCABC ABC", "0123 0123"):
        engine.generate(prompt, SamplingParams(max_tokens=12))
    assert engine.target.compile("auto") is step  # asked again: the same step
    assert counted_kernel == {"built": 1, "checked": 1}
    assert step.served > 0  # the passes ran the kernel
    assert engine.target.pass_costs is not None and engine.target.pass_costs.backend == "kernel"


def _fast(**kw):
    return Target(tiny_model(VOCAB, dtype=torch.float32, **kw), CharTokenizer(VOCAB)).fast


def test_one_line_names_the_choice_and_why_a_better_one_is_off(caplog):
    """Guards against a silent fall to the slowest backend: a model the kernel does not take
    (8-wide heads) runs eager under ``auto``, and the one logged line says why."""
    with caplog.at_level(logging.INFO, logger="specd.forward.compiled"):
        backend = choose(_fast(), slow=False)
    assert isinstance(backend, EagerStep)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode step")]
    assert len(lines) == 1
    assert lines[0].startswith("decode step: eager (kernel off: ")
    assert "inductor not tried" in lines[0]


def test_a_named_backend_is_honoured_or_refused_naming_the_choices():
    fast = _fast()
    assert choose(fast, "static").name == "static"
    assert choose(fast, "eager").name == "eager"
    with pytest.raises(BadInputError, match="unknown compile backend 'fast'.*kernel"):
        choose(fast, "fast")
    with pytest.raises(BadInputError, match="CUDA graphs need a CUDA device"):
        choose(fast, "cudagraph")


@pytest.mark.parametrize("name", [n for n in MAKERS if n != "cudagraph"])
def test_every_backend_is_a_step_backend(name):
    backend = MAKERS[name](_fast(hidden_size=64))
    assert isinstance(backend, StepBackend) and backend.name == name
    assert backend.max_tokens >= 1 and isinstance(backend.off, str)


class _Raising:
    """A backend that serves two passes, then raises (a cache it cannot take)."""

    name, max_tokens, off = "raising", 16, ""

    def __init__(self, fast) -> None:
        self.eager = EagerStep(fast)
        self.passes = 0

    def prepare(self, new_cache) -> None:
        pass

    def run(self, cache, ids, position_ids, mask):
        self.passes += 1
        if self.passes > 2:
            raise ValueError("a cache in float16")
        return self.eager.run(cache, ids, position_ids, mask)


def test_a_backend_that_raises_is_turned_off_and_passes_run_eager(caplog):
    """Guards against a request that fails, or a backend asked again after it failed, when
    a compiled pass raises mid-request: the step turns off, says why once, and the request
    writes what eager decoding writes."""
    model = tiny_model(VOCAB, num_layers=2, seed=5, logit_scale=8.0)
    plain = Engine(Target(model, CharTokenizer(VOCAB)), drafter="none")
    want = plain.generate("ABCABCABD", SamplingParams(max_tokens=16)).token_ids
    target = Target(model, CharTokenizer(VOCAB))
    backend = _Raising(target.fast)
    target.compiled = CompiledStep(target.fast, backend)
    target.compiled.prepare(target.new_cache)
    with caplog.at_level(logging.WARNING, logger="specd.forward.compiled"):
        out = Engine(target, drafter="none").generate("ABCABCABD", SamplingParams(max_tokens=16))
    assert out.token_ids == want
    assert target.compiled.state == "failed" and "float16" in target.compiled.reason
    assert backend.passes == 3 and target.compiled.served == 2
    assert caplog.text.count("running eager (raising)") == 1


def _imports(path: Path) -> set[str]:
    """The ``specd.forward`` modules ``path`` imports, anywhere in it (function level and
    ``TYPE_CHECKING`` blocks included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specd.forward."):
            names.add(node.module.split(".")[2])
    return names


def test_no_import_circle_in_the_forward_package():
    """Guards against a backend module importing the one that holds it (static_graph
    importing compiled to type its owner): modules that import each other cannot be read,
    tested or replaced one at a time."""
    modules = {p.stem: p for p in FORWARD.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(p) & set(modules) for m, p in modules.items()}

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for n in graph[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        return seen

    circles = sorted(m for m in graph if m in reach(m))
    assert not circles, f"import circles through {circles}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_step_passes_its_check(dtype):
    """Guards against a check too tight for half precision (CUDA graphs of a bfloat16
    model, the default there, refused on every GPU): the static passes attend over the
    whole buffer, eager ones over the live positions, and round differently."""
    model = tiny_model(VOCAB, hidden_size=64, num_layers=2, seed=7, logit_scale=8.0, dtype=dtype)
    step = Target(model, CharTokenizer(VOCAB)).compile("on", backend="static")
    assert step is not None and step.ready, step and step.reason


def test_a_pass_that_lets_a_token_see_the_ones_after_it_is_refused(monkeypatch):
    """Guards against a check that runs only one-token passes: a mask that lets each new
    token see the whole draft changes nothing in a step and everything in a verify pass."""
    from specd.forward import static_graph

    def no_order(t, past, mask, like):
        return torch.zeros(t, t, dtype=like.dtype, device=like.device)

    monkeypatch.setattr(static_graph, "new_block", no_order)
    model = tiny_model(VOCAB, hidden_size=64, num_layers=2, seed=7, dtype=torch.float32)
    step = Target(model, CharTokenizer(VOCAB)).compile("on", backend="static")
    assert step is not None and step.state == "failed"
    assert "over 5 tokens differ from the eager pass" in step.reason
