"""Every engine the servers are given has every member of :class:`CompletionEngine`.

Guards against a caller asking whether a member is there (``getattr(engine, "heal",
None)``) because one engine-like type lacks it, and against a member added to the protocol
(or renamed on one type) that another type does not follow: each member must exist on the
local engine, the remote backend and the loading stand-in, and each method must accept
every argument the protocol lets a caller pass.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
from specd.lsp.backend import Backend
from specd.lsp.engines import CompletionEngine
from specd.lsp.service import Service, WhenLoaded

from specd import Engine
from specd.forward.tiny import CharTokenizer, tiny_target

P = inspect.Parameter
POSITIONAL = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
LSP = Path(__file__).resolve().parents[2] / "lsp"


def members(protocol: type) -> dict[str, Any]:
    """The protocol's own members: name -> its function, or a property for data."""
    return {
        name: value
        for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


def signature_problems(name: str, wanted: inspect.Signature, got: inspect.Signature) -> list[str]:
    """Why a method with signature ``got`` cannot be called as ``wanted`` allows (both
    without ``self``)."""
    problems = []
    want = list(wanted.parameters.values())
    have = list(got.parameters.values())
    var_pos = any(p.kind is P.VAR_POSITIONAL for p in have)
    var_kw = any(p.kind is P.VAR_KEYWORD for p in have)
    positional = [p for p in have if p.kind in POSITIONAL]
    by_name = {p.name: p for p in have if p.kind in (P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY)}
    matched: set[str] = set()
    for i, p in enumerate(x for x in want if x.kind in POSITIONAL):
        if i < len(positional):
            q = positional[i]
            matched.add(q.name)
            if p.kind is P.POSITIONAL_OR_KEYWORD and q.name != p.name:
                problems.append(f"{name}: argument {i + 1} is {q.name!r}, not {p.name!r}")
            if p.default is not P.empty and q.default is P.empty:
                problems.append(f"{name}: {q.name!r} needs a default")
        elif not var_pos:
            problems.append(f"{name}: takes no argument {i + 1} ({p.name!r})")
    for p in want:
        if p.kind is P.KEYWORD_ONLY:
            q = by_name.get(p.name)
            if q is None:
                if not var_kw:
                    problems.append(f"{name}: no keyword argument {p.name!r}")
                continue
            matched.add(q.name)
            if p.default is not P.empty and q.default is P.empty:
                problems.append(f"{name}: {p.name!r} needs a default")
        elif p.kind is P.VAR_POSITIONAL and not var_pos:
            problems.append(f"{name}: takes no *args")
        elif p.kind is P.VAR_KEYWORD and not var_kw:
            problems.append(f"{name}: takes no **kwargs")
    for q in have:
        if q.name not in matched and q.kind in (*POSITIONAL, P.KEYWORD_ONLY):
            if q.default is P.empty:
                problems.append(f"{name}: {q.name!r} is required but no caller passes it")
    return problems


def conformance_problems(obj: object, protocol: type = CompletionEngine) -> list[str]:
    """What ``obj`` lacks of ``protocol``, reading nothing that would run (a property of
    the loading stand-in waits for the model)."""
    problems = []
    for name, spec in members(protocol).items():
        try:
            found = inspect.getattr_static(obj, name)
        except AttributeError:
            problems.append(f"no {name}")
            continue
        if isinstance(spec, property):
            continue  # data: present is enough (a value, a property, a cached property)
        if isinstance(found, (staticmethod, classmethod)):
            found = found.__func__
        if not callable(found):
            problems.append(f"{name} is not callable")
            continue
        method = getattr(type(obj), name, None)
        wanted = _without_self(inspect.signature(spec))
        got = (
            _without_self(inspect.signature(method))
            if inspect.isfunction(method)
            else inspect.signature(found)
        )
        problems += signature_problems(name, wanted, got)
    return problems


def _without_self(sig: inspect.Signature) -> inspect.Signature:
    return sig.replace(parameters=list(sig.parameters.values())[1:])


@pytest.fixture(scope="module")
def engines():
    engine = Engine(tiny_target())
    tokenizer = CharTokenizer(96)
    backend = Backend("http://127.0.0.1:9/v1", tokenizer, tokenizer.encode)
    service = Service(None)
    yield {"Engine": engine, "Backend": backend, "WhenLoaded": WhenLoaded(service)}
    service.load_failed(RuntimeError("not loaded in this test"))
    service.close()


@pytest.mark.parametrize("kind", ["Engine", "Backend", "WhenLoaded"])
def test_every_engine_has_every_member_of_the_protocol(engines, kind):
    assert conformance_problems(engines[kind]) == []


def test_the_protocol_names_what_the_servers_use():
    assert set(members(CompletionEngine)) == {
        "tokenizer",
        "limits",
        "prefix_cache",
        "tokenize",
        "heal",
        "cached_tokens",
        "warm",
        "stream",
        "generate",
    }


def test_a_missing_member_or_an_incompatible_signature_is_named():
    """The checker itself: a type without ``heal``, one whose ``stream`` lost a keyword,
    one whose ``warm`` needs an argument no caller passes."""

    class Partial(Backend):
        heal = None  # type: ignore[assignment]

        def stream(self, prompt, params=None, *, cancel=None):  # type: ignore[override]
            raise NotImplementedError

        def warm(self, prompt, cancel, *, request=False, chunk):  # type: ignore[override]
            raise NotImplementedError

    tokenizer = CharTokenizer(96)
    partial = Partial("http://127.0.0.1:9/v1", tokenizer, tokenizer.encode)
    problems = conformance_problems(partial)
    assert "heal is not callable" in problems
    assert "stream: no keyword argument 'time_budget_s'" in problems
    assert "warm: 'cancel' needs a default" in problems
    assert "warm: 'chunk' is required but no caller passes it" in problems

    class NoLimits:
        pass

    assert "no limits" in conformance_problems(NoLimits())


def test_the_remote_backends_neutral_values_change_nothing():
    """Backend's members that mean nothing remotely leave a prompt as it is: no healing,
    every token cached (a cold prompt is never cut for it), nothing prefilled."""
    tokenizer = CharTokenizer(96)
    backend = Backend("http://127.0.0.1:9/v1", tokenizer, tokenizer.encode)
    ids = tokenizer.encode("def f(x):\n    ")
    assert backend.heal(ids) == (ids, None)
    assert backend.cached_tokens(ids) == len(ids) - 1
    assert backend.warm(ids) == (0, 0)
    assert backend.prefix_cache is None
    assert backend.limits.window > 1 << 30
    assert backend.tokenize("ab") == tokenizer.encode("ab")


def test_the_loading_stand_in_waits_then_is_the_engine():
    service = Service(None)
    stand_in = service.engine
    try:
        assert isinstance(stand_in, WhenLoaded)
        engine = Engine(tiny_target())
        service.attach(engine)
        assert stand_in.tokenize("abc") == engine.tokenize("abc")
        assert stand_in.limits == engine.limits
        assert stand_in.prefix_cache is engine.prefix_cache
        assert stand_in.generate("ab", None).text == engine.generate("ab", None).text
    finally:
        service.close()


def test_no_caller_asks_whether_an_engine_has_a_member():
    """``getattr(<engine>, "name", default)`` or ``hasattr(<engine>, ...)`` anywhere in
    lsp/: the protocol says what every engine has."""
    found = []
    for path in sorted(LSP.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
                and "engine" in ast.unparse(node.args[0]).lower()
            ):
                found.append(f"{path.relative_to(LSP.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
