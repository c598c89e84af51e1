"""Shared test setup.

Only specd's own plugins load in tests (``SPECD_LOAD_PLUGINS=builtin``), so a third-party
plugin installed in the environment cannot change results; a test that needs installed
plugins (the example-plugin test) clears the variable for its subprocesses.
Hypothesis runs derandomized under CI so a run is reproducible.

Two tiers: ``pytest -m "not slow"`` is the fast one (tiny models: exactness, the verifier's
laws, the language server's protocol, HTTP validation); the full suite adds the tests marked
``slow``: the real default model, ``specd`` processes, the sampled conformance runs, editors,
lint's type check, and every test marked ``compile``.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("SPECD_LOAD_PLUGINS", "builtin")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# every test prices verify passes itself: a table kept from another run (or one measured
# under the suite's load, kept for the user's next start) would decide its draft lengths
os.environ.setdefault("SPECD_PRICE_CACHE", "off")

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config, items):
    """Slow too, so the fast tier leaves them out without a second marker expression: a test
    that compiles, and a test run over each build of the CPU kernels (a ``build`` parameter)
    for every build but the best this CPU runs, the one a user of this machine gets."""
    best = None
    for item in items:
        if item.get_closest_marker("compile") is not None:
            item.add_marker(pytest.mark.slow)
            continue
        build = item.callspec.params.get("build") if hasattr(item, "callspec") else None
        if build is None:
            continue
        if best is None:
            from specd.forward import cpu_kernels

            best = cpu_kernels.runnable_isas()[0]
        if build != best:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def real_engine():
    """The default model (SmolLM2-135M-Instruct) in float32 on CPU, loaded once."""
    from specd import Engine

    return Engine.load(dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def real_engine_float():
    """The default model with the step's int8 products off (``SPECD_INT8_PRODUCTS=off``): its
    blocks decoded to floats, as transformers' float32 model computes them."""
    from specd import Engine

    before = os.environ.get("SPECD_INT8_PRODUCTS")
    os.environ["SPECD_INT8_PRODUCTS"] = "off"
    try:
        return Engine.load(dtype="float32", device="cpu")
    finally:
        if before is None:
            del os.environ["SPECD_INT8_PRODUCTS"]
        else:
            os.environ["SPECD_INT8_PRODUCTS"] = before


@pytest.fixture
def one_thread():
    """Torch on one thread for the test. Tiny models and one-token steps gain nothing from a
    second thread, and on a busy machine its waiting costs many times the work. Function
    scoped, so a session fixture (the real model) is still loaded with the default count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def _each_verifier_checked_once():
    """A verifier's own checks (``verifier_checks``) run on synthetic targets, whatever
    drafter ``specd verify`` checks behind it: a verifier is checked for real the first time a
    run in this session needs it, and a later run with the same verifier (the same class, its
    attributes and methods unchanged), modes, seed and check constants gets those results
    again. Each drafter's own checks still run every time."""
    from specd.conformance import suite, verifier_checks

    real = suite.verifier_checks
    done: dict[tuple, list] = {}

    def identity(cls: type) -> tuple:
        return tuple((k, id(v)) for c in cls.__mro__ for k, v in vars(c).items())

    def once(verifier, modes, seed=0):
        constants = tuple((k, repr(v)) for k, v in vars(verifier_checks).items() if k.isupper())
        key = (type(verifier), identity(type(verifier)), frozenset(modes), seed, constants)
        if key in done:
            yield from done[key]
            return
        results = []
        for result in real(verifier, modes, seed=seed):
            results.append(result)
            yield result
        done[key] = results  # only a run that went through every check

    suite.verifier_checks = once
    yield
    suite.verifier_checks = real
