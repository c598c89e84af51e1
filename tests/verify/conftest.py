"""Fixtures of the verification suite: the broken plugins, registered like a third party's."""

from __future__ import annotations

import broken_plugin
import mutants as mutant_plugin
import pytest
import torch

from specd.registry import get_plugin_manager


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Tiny models, one token at a time: a second thread only adds contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def mutant_plugins():
    """The mutants of tests/verify/mutants.py, installed for one test."""
    pm = get_plugin_manager()
    pm.register(mutant_plugin, name="specd-verify-mutants")
    yield mutant_plugin
    pm.unregister(mutant_plugin)


@pytest.fixture
def broken_plugins():
    """The deliberately broken verifiers and drafter, installed for one test."""
    pm = get_plugin_manager()
    pm.register(broken_plugin, name="specd-verify-broken")
    yield broken_plugin
    pm.unregister(broken_plugin)
