"""The fast tier (``pytest -m "not slow"``) leaves out what tests/conftest.py marks slow at
collection: tests that compile, and the kernel builds other than the one this CPU runs best."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

from specd.forward import cpu_kernels


class Item:
    """The little of a collected test item the hook reads and writes."""

    def __init__(self, markers: tuple[str, ...] = (), build: str | None = None):
        self.markers = set(markers)
        self.added: list[str] = []
        if build is not None:
            self.callspec = SimpleNamespace(params={"build": build, "seed": 7})

    def get_closest_marker(self, name: str):
        return SimpleNamespace(name=name) if name in self.markers else None

    def add_marker(self, mark) -> None:
        self.added.append(mark.name)


def _mark(items: list[Item]) -> list[Item]:
    path = Path(__file__).with_name("conftest.py")
    spec = importlib.util.spec_from_file_location("tests_conftest_for_tiers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.pytest_collection_modifyitems(None, items)
    return items


def test_a_test_that_compiles_is_slow():
    (item,) = _mark([Item(markers=("compile",))])
    assert item.added == ["slow"]


def test_each_kernel_build_but_the_best_this_cpu_runs_is_slow():
    """Guards against the fast tier paying for every build (or for none of the host's)."""
    best = cpu_kernels.runnable_isas()[0]
    items = _mark([Item(build=name) for name in cpu_kernels.ISAS])
    slow = {name for name, item in zip(cpu_kernels.ISAS, items, strict=True) if item.added}
    assert slow == set(cpu_kernels.ISAS) - {best}


def test_other_tests_stay_in_the_fast_tier():
    items = _mark([Item(), Item(markers=("asyncio",))])
    assert [item.added for item in items] == [[], []]
